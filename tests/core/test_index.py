"""Tests for treefed.core.index.SubscriptionIndex: the subject trie and its cache."""

from hypothesis import given, settings
from hypothesis import strategies as st

from treefed.core.destinations import matches
from treefed.core.index import SubscriptionIndex


def _index(*pairs):
    idx = SubscriptionIndex()
    for pattern, item in pairs:
        idx.insert(pattern, item)
    return idx


class TestSubscriptionIndex:
    def test_literal_and_wildcard_patterns_match(self):
        """A lookup finds literal, '*' and '>' patterns that match, and nothing else."""
        idx = _index(("topic://A.B", "lit"), ("topic://A.*", "star"), ("topic://A.>", "gt"),
                     ("topic://>", "all"), ("topic://A.C", "other"), ("queue://A.B", "queue"))
        assert set(idx.match("topic://A.B")) == {"lit", "star", "gt", "all"}
        assert set(idx.match("topic://A.B.C")) == {"gt", "all"}
        assert set(idx.match("topic://A")) == {"all"}

    def test_gt_needs_at_least_one_segment(self):
        """'A.>' does not match 'A' itself."""
        idx = _index(("queue://A.>", 1))
        assert idx.match("queue://A") == ()
        assert idx.match("queue://A.x") == (1,)

    def test_item_under_two_matching_patterns_is_returned_once(self):
        """Results hold each item once even when several of its patterns match."""
        idx = _index(("topic://A.*", "x"), ("topic://A.>", "x"), ("topic://A.B", "y"))
        result = idx.match("topic://A.B")
        assert sorted(result) == ["x", "y"]

    def test_duplicate_insert_and_missing_remove_report_false(self):
        """insert/remove say whether they changed anything."""
        idx = SubscriptionIndex()
        assert idx.insert("queue://A", 1) is True
        assert idx.insert("queue://A", 1) is False
        assert idx.remove("queue://A", 2) is False
        assert idx.remove("queue://B", 1) is False
        assert idx.remove("queue://A", 1) is True
        assert len(idx) == 0

    def test_remove_prunes_empty_nodes(self):
        """Removing the last pattern leaves no trie nodes behind."""
        idx = _index(("topic://A.B.C", 1), ("topic://A.*.D", 2))
        assert idx.statistics()["nodes"] == 5
        idx.remove("topic://A.B.C", 1)
        assert idx.statistics()["nodes"] == 3
        idx.remove("topic://A.*.D", 2)
        assert idx.statistics()["nodes"] == 0
        assert idx.match("topic://A.B.C") == ()

    def test_cache_hits_and_invalidation(self):
        """A repeated lookup is served from the cache; changes invalidate stale answers."""
        idx = _index(("queue://A.B", 1))
        assert idx.match("queue://A.B") == (1,)
        assert idx.match("queue://A.B") == (1,)
        assert idx.statistics()["cache_hits"] == 1
        idx.insert("queue://A.*", 2)          # wildcard change: whole cache dropped
        assert set(idx.match("queue://A.B")) == {1, 2}
        idx.insert("queue://A.B", 3)          # literal change: that entry dropped
        assert set(idx.match("queue://A.B")) == {1, 2, 3}
        idx.remove("queue://A.*", 2)
        assert set(idx.match("queue://A.B")) == {1, 3}

    def test_literal_change_keeps_other_cache_entries(self):
        """Inserting a literal pattern leaves unrelated cached results in place."""
        idx = _index(("queue://A", 1), ("queue://B", 2))
        idx.match("queue://A")
        idx.match("queue://B")
        idx.insert("queue://A", 3)
        assert idx.statistics()["cache_size"] == 1
        assert idx.match("queue://B") == (2,)
        assert idx.statistics()["cache_hits"] == 1

    def test_cache_is_bounded(self):
        """The cache never holds more than its configured number of entries."""
        idx = SubscriptionIndex(cache_size=8)
        idx.insert("queue://>", 1)
        for i in range(50):
            assert idx.match(f"queue://Q{i}") == (1,)
        assert idx.statistics()["cache_size"] <= 8

    def test_select_finds_literal_keys_by_pattern(self):
        """select() is the reverse query: stored concrete names a pattern matches."""
        idx = _index(("queue://A.B", "ab"), ("queue://A.C", "ac"), ("queue://A.B.C", "abc"),
                     ("queue://X", "x"), ("topic://A.B", "tab"))
        assert sorted(idx.select("queue://A.*")) == ["ab", "ac"]
        assert sorted(idx.select("queue://A.>")) == ["ab", "abc", "ac"]
        assert sorted(idx.select("queue://>")) == ["ab", "abc", "ac", "x"]
        assert idx.select("queue://A.B") == ["ab"]
        assert idx.select("temp-queue://>") == []

    def test_many_demand_subscriptions(self):
        """Thousands of per-store patterns: each store's queue matches only its own."""
        idx = SubscriptionIndex()
        for i in range(5000):
            idx.insert(f"queue://Store{i}.Incoming", i)
        idx.insert("queue://*.Incoming", "all")
        assert set(idx.match("queue://Store4321.Incoming")) == {4321, "all"}
        assert idx.statistics()["subscriptions"] == 5001

    @settings(max_examples=150, deadline=None)
    @given(
        patterns=st.lists(st.lists(st.sampled_from(["a", "b", "c", "*"]), min_size=1,
                                   max_size=3).map(".".join)
                          .flatmap(lambda p: st.sampled_from([p, p + ".>"])),
                          min_size=1, max_size=12),
        dst=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4).map(".".join),
    )
    def test_match_agrees_with_matches(self, patterns, dst):
        """The trie returns exactly the patterns that destinations.matches accepts."""
        idx = SubscriptionIndex()
        for p in patterns:
            idx.insert("topic://" + p, p)
        expected = {p for p in patterns if matches("topic://" + p, "topic://" + dst)}
        assert set(idx.match("topic://" + dst)) == expected


class TestFlatLiterals:
    def test_literal_items_bare_then_set_then_bare(self):
        """A literal pattern holds one item bare, a set from the second, bare again after."""
        idx = SubscriptionIndex(flat_literals=True)
        assert idx.insert("queue://A", 1) and not idx.insert("queue://A", 1)
        assert idx.insert("queue://A", 2)
        assert idx.match("queue://A") == (1, 2)
        assert idx.remove("queue://A", 1) and not idx.remove("queue://A", 1)
        assert idx.match("queue://A") == (2,)
        assert idx.remove("queue://A", 2) and idx.match("queue://A") == ()
        assert len(idx) == 0 and idx.statistics()["nodes"] == 0

    def test_literals_build_no_trie_and_no_cache(self):
        """Literal patterns make no trie nodes; lookups need no cache until a wildcard."""
        idx = SubscriptionIndex(flat_literals=True)
        for i in range(100):
            idx.insert(f"queue://Store{i}.Incoming", i)
        assert idx.match("queue://Store7.Incoming") == (7,)
        assert idx.statistics()["nodes"] == 0 and idx.statistics()["cache_size"] == 0
        idx.insert("queue://*.Incoming", "all")
        assert set(idx.match("queue://Store7.Incoming")) == {7, "all"}
        idx.insert("queue://Store7.Incoming", 70)      # a literal change refreshes its entry
        assert set(idx.match("queue://Store7.Incoming")) == {7, 70, "all"}

    def test_select_scans_flat_names(self):
        """select() still finds literal keys by pattern when they are stored flat."""
        idx = SubscriptionIndex(flat_literals=True)
        for name in ("queue://A.B", "queue://A.C", "queue://X", "topic://A.B"):
            idx.insert(name, name)
        assert sorted(idx.select("queue://A.*")) == ["queue://A.B", "queue://A.C"]
        assert idx.select("queue://X") == ["queue://X"]
        assert idx.select("queue://Y") == []

    @settings(max_examples=100, deadline=None)
    @given(
        patterns=st.lists(st.lists(st.sampled_from(["a", "b", "*"]), min_size=1,
                                   max_size=3).map(".".join)
                          .flatmap(lambda p: st.sampled_from([p, p + ".>"])),
                          min_size=1, max_size=12),
        removed=st.integers(min_value=0, max_value=11),
        dst=st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=4).map(".".join),
    )
    def test_same_answers_as_the_trie(self, patterns, removed, dst):
        """Flat literals and the all-trie layout answer every match identically."""
        flat, trie = SubscriptionIndex(flat_literals=True), SubscriptionIndex()
        for i, p in enumerate(patterns):
            for idx in (flat, trie):
                idx.insert("topic://" + p, i % 3)
        victim = patterns[removed % len(patterns)]
        for idx in (flat, trie):
            idx.remove("topic://" + victim, removed % len(patterns) % 3)
        assert set(flat.match("topic://" + dst)) == set(trie.match("topic://" + dst))
        assert len(flat) == len(trie)
