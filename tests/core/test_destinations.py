"""Tests for treefed.core.destinations: canonical names, refusals, kinds, wildcards."""

import pytest

from treefed.core.destinations import (
    MAX_LENGTH,
    is_queue,
    is_temp,
    is_topic,
    is_wildcard,
    kind,
    matches,
    parse_destination,
)
from treefed.errors import DestinationError


class TestParseDestination:
    def test_bare_name_is_a_queue(self):
        """A name without a scheme becomes queue://name."""
        assert parse_destination("Store1.Incoming") == "queue://Store1.Incoming"

    @pytest.mark.parametrize("text", ["queue://A.B", "topic://A.B", "temp-queue://c1.7",
                                      "temp-topic://x"])
    def test_canonical_names_are_unchanged(self, text):
        """Names already in canonical form come back as they are."""
        assert parse_destination(text) == text

    @pytest.mark.parametrize("text, fragment", [
        ("", "empty destination name"),
        ("queue://", "empty destination name"),
        ("A..B", "empty segment 2"),
        (".A", "empty segment 1"),
        ("A.", "empty segment 2"),
        ("A B", "character ' '"),
        ("A.\tB", "character '\\t'"),
        ("A/B", "character '/'"),
        ("A.\x01", "character '\\x01'"),
        ("fifo://A", "unknown destination kind 'fifo'"),
        ("PRICE.>", "wildcard '>' is not allowed"),
        ("PRICE.*.IBM", "wildcard '*' is not allowed"),
        ("PRI*", "wildcard inside a segment"),
    ])
    def test_bad_names_are_refused_with_the_reason(self, text, fragment):
        """Each malformed name raises DestinationError naming what is wrong."""
        with pytest.raises(DestinationError) as info:
            parse_destination(text)
        assert fragment in info.value.message
        assert info.value.code == "bad_destination"

    def test_wildcards_are_accepted_in_patterns(self):
        """allow_wildcards admits whole-segment * and a trailing >."""
        assert parse_destination("PRICE.*.IBM", allow_wildcards=True) == "queue://PRICE.*.IBM"
        assert parse_destination("topic://PRICE.>", allow_wildcards=True) == "topic://PRICE.>"

    def test_gt_must_be_last(self):
        """'>' anywhere but the last segment is refused even in patterns."""
        with pytest.raises(DestinationError, match="last segment"):
            parse_destination("topic://A.>.B", allow_wildcards=True)

    def test_partial_wildcard_is_refused_in_patterns(self):
        """A wildcard character inside a segment is refused, not taken literally."""
        with pytest.raises(DestinationError, match="inside a segment"):
            parse_destination("topic://A.B>", allow_wildcards=True)

    def test_length_limit(self):
        """Names up to MAX_LENGTH characters pass; one more is refused."""
        ok = "queue://" + "a" * (MAX_LENGTH - len("queue://"))
        assert parse_destination(ok) == ok
        with pytest.raises(DestinationError, match="longer than 1024"):
            parse_destination(ok + "a")

    def test_non_string_is_refused(self):
        """A destination that is not a string raises DestinationError, not TypeError."""
        with pytest.raises(DestinationError, match="must be a string"):
            parse_destination(42)  # type: ignore[arg-type]


class TestKinds:
    def test_kind_of_each_scheme(self):
        """kind() names the scheme of a canonical destination."""
        assert [kind(d) for d in ("queue://a", "topic://a", "temp-queue://a",
                                  "temp-topic://a")] == ["queue", "topic", "temp-queue",
                                                         "temp-topic"]

    def test_kind_of_non_canonical_raises(self):
        """kind() refuses a name without a known scheme."""
        with pytest.raises(DestinationError):
            kind("a.b")

    def test_predicates(self):
        """is_queue / is_topic / is_temp / is_wildcard classify canonical names."""
        assert is_queue("queue://a") and is_queue("temp-queue://a") and not is_queue("topic://a")
        assert is_topic("temp-topic://a") and not is_topic("queue://a")
        assert is_temp("temp-queue://a") and not is_temp("queue://a")
        assert is_wildcard("topic://A.>") and is_wildcard("queue://*.B")
        assert not is_wildcard("queue://A.B")


class TestMatches:
    @pytest.mark.parametrize("pattern, dst, expected", [
        ("queue://A.B", "queue://A.B", True),
        ("queue://A.B", "queue://A.C", False),
        ("queue://A.*", "queue://A.B", True),
        ("queue://A.*", "queue://A.B.C", False),
        ("queue://A.*", "queue://A", False),
        ("topic://PRICE.STOCK.*.IBM", "topic://PRICE.STOCK.NYSE.IBM", True),
        ("topic://PRICE.STOCK.*.IBM", "topic://PRICE.STOCK.NYSE.SUN", False),
        ("topic://PRICE.>", "topic://PRICE.STOCK.NYSE.IBM", True),
        ("topic://PRICE.>", "topic://PRICE", False),
        ("topic://>", "topic://X", True),
        ("topic://PRICE.>", "queue://PRICE.STOCK", False),
        ("queue://*", "temp-queue://x", False),
    ])
    def test_matches(self, pattern, dst, expected):
        """'*' matches one segment, '>' one or more, and kinds must agree."""
        assert matches(pattern, dst) is expected
