"""LinkSettings / TreeSettings: defaults, validation, the options round trip."""

import pytest

from treefed.errors import ConfigError
from treefed.federation.settings import LinkSettings, TreeSettings


class TestLinkSettings:
    def test_defaults_follow_design(self):
        """Defaults are DESIGN §4.1's: ttl 1, conduits on, topic dedup on, prefetch 1000."""
        s = LinkSettings()
        assert (s.kind, s.duplex, s.network_ttl, s.consumer_ttl, s.message_ttl) == \
            ("mesh", False, 1, 1, 1)
        assert s.conduit_subscriptions and s.suppress_duplicate_topic_subscriptions
        assert not s.suppress_duplicate_queue_subscriptions
        assert not s.decrease_network_consumer_priority and not s.static_bridge
        assert s.bridge_temp_destinations and s.prefetch == 1000
        assert s.max_demand_per_link == 100_000 and s.route_unknown_up

    def test_network_ttl_sets_both_ttls_unless_given(self):
        """network_ttl fills consumer_ttl and message_ttl; explicit values win."""
        s = LinkSettings(network_ttl=3, message_ttl=-1)
        assert (s.consumer_ttl, s.message_ttl) == (3, -1)

    def test_destinations_are_canonicalised(self):
        """Bare filter names become queues; topics keep their scheme."""
        s = LinkSettings(excluded=["A.>"], dynamically_included=("topic://P.*",),
                         statically_included=["TEST.FOO"])
        assert s.excluded == ("queue://A.>",)
        assert s.dynamically_included == ("topic://P.*",)
        assert s.statically_included == ("queue://TEST.FOO",)

    @pytest.mark.parametrize("kwargs, key", [
        ({"kind": "star"}, "kind"),
        ({"network_ttl": -2}, "network_ttl"),
        ({"consumer_ttl": "2"}, "consumer_ttl"),
        ({"prefetch": 0}, "prefetch"),
        ({"statically_included": ["A.>"]}, "statically_included"),
        ({"excluded": "A.B"}, "excluded"),
        ({"excluded": ["bad name"]}, "excluded"),
        ({"node_type": "root"}, "node_type"),
        ({"name": ""}, "name"),
    ])
    def test_bad_values_name_the_field(self, kwargs, key):
        """Every invalid option raises ConfigError naming that option."""
        with pytest.raises(ConfigError) as info:
            LinkSettings(**kwargs)
        assert info.value.key == key

    def test_options_round_trip(self):
        """from_options(to_options()) rebuilds equal settings (what the acceptor uses)."""
        s = LinkSettings(name="x", duplex=True, network_ttl=4, excluded=["A.>"],
                         statically_included=["S"], decrease_network_consumer_priority=True)
        assert LinkSettings.from_options(s.to_options()) == s

    def test_from_options_ignores_unknown_and_applies_overrides(self):
        """Newer peers' extra options are ignored; overrides replace sent values."""
        s = LinkSettings.from_options({"network_ttl": 2, "future_knob": 1}, name="n")
        assert (s.network_ttl, s.name) == (2, "n")

    def test_from_options_rejects_mistyped_values(self):
        """A mistyped option from a peer is a ConfigError, not a crash."""
        with pytest.raises(ConfigError):
            LinkSettings.from_options({"prefetch": "lots"})


class TestTreeSettings:
    def test_default_is_a_leaf_routing_unknown_up(self):
        """A site's tree position defaults to leaf with route_unknown_up on."""
        assert TreeSettings() == TreeSettings("leaf", True)

    def test_unknown_node_type_is_refused(self):
        """node_type must be leaf, branch or root."""
        with pytest.raises(ConfigError):
            TreeSettings("trunk")
