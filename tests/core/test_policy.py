"""Tests for treefed.core.policy: DestinationPolicy validation and PolicySet lookup."""

import pytest

from treefed.core.policy import DestinationPolicy, PolicySet
from treefed.errors import ConfigError


class TestDestinationPolicy:
    def test_defaults_are_unlimited(self):
        """The default policy limits nothing, blocks when full, dead-letters on expiry."""
        p = DestinationPolicy()
        assert (p.max_messages, p.max_bytes, p.max_message_bytes) == (0, 0, 0)
        assert p.limit_behaviour == "block" and p.on_expiry == "dlq" and not p.local_only
        assert not p.limited

    @pytest.mark.parametrize("kwargs, key", [
        (dict(limit_behaviour="drop_newest"), "limit_behaviour"),
        (dict(on_expiry="keep"), "on_expiry"),
        (dict(max_messages=-1), "max_messages"),
        (dict(max_bytes=1.5), "max_bytes"),
        (dict(max_message_bytes=True), "max_message_bytes"),
        (dict(local_only="yes"), "local_only"),
    ])
    def test_bad_values_raise_config_error_naming_the_key(self, kwargs, key):
        """An invalid field raises ConfigError whose key is that field."""
        with pytest.raises(ConfigError) as info:
            DestinationPolicy(**kwargs)
        assert info.value.key == key

    def test_is_frozen(self):
        """Policies cannot be changed after construction."""
        p = DestinationPolicy()
        with pytest.raises(AttributeError):
            p.max_messages = 3  # type: ignore[misc]


class TestPolicySet:
    def test_first_matching_pattern_wins(self):
        """Entries are tried in order; the first match decides."""
        first = DestinationPolicy(max_messages=1)
        second = DestinationPolicy(max_messages=2)
        ps = PolicySet([("queue://ORDERS.>", first), ("queue://>", second)])
        assert ps.for_destination("queue://ORDERS.EU") is first
        assert ps.for_destination("queue://OTHER") is second

    def test_default_when_nothing_matches(self):
        """A destination matching no entry gets the set's default policy."""
        default = DestinationPolicy(local_only=True)
        ps = PolicySet([("topic://PRICE.>", DestinationPolicy(max_bytes=10))], default=default)
        assert ps.for_destination("queue://PRICE.X") is default
        assert PolicySet().for_destination("queue://A") == DestinationPolicy()

    def test_bare_patterns_are_canonicalised(self):
        """A bare pattern is a queue pattern, like a bare destination name."""
        p = DestinationPolicy(max_messages=5)
        ps = PolicySet([("STORE.*", p)])
        assert ps.entries[0][0] == "queue://STORE.*"
        assert ps.for_destination("queue://STORE.1") is p
        assert ps.for_destination("topic://STORE.1") is ps.default

    def test_lookups_are_cached(self):
        """A second lookup of the same destination returns the cached object."""
        ps = PolicySet([("queue://A", DestinationPolicy(max_messages=1))])
        assert ps.for_destination("queue://A") is ps.for_destination("queue://A")

    def test_bad_pattern_raises_config_error(self):
        """An invalid pattern is a ConfigError naming the entry."""
        with pytest.raises(ConfigError) as info:
            PolicySet([("queue://A..B", DestinationPolicy())])
        assert info.value.key == "policies[0].pattern"

    def test_non_policy_entry_raises_config_error(self):
        """An entry whose policy is not a DestinationPolicy is refused."""
        with pytest.raises(ConfigError):
            PolicySet([("queue://A", {"max_messages": 1})])  # type: ignore[list-item]
