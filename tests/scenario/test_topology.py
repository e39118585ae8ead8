"""Tests for treefed.scenario.topology: generated estates and layer insertion."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from treefed.scenario.topology import BrokerSpec, LayerSpec, Topology, TopologySpec, build

SMALL = TopologySpec(regions=2, stores_per_region=5)
DEEP = TopologySpec(regions=4, stores_per_region=60, layers=(LayerSpec("country", 4),))


class TestBuild:
    def test_small_estate(self) -> None:
        """HQ, 2 regions, 5 stores each: 13 brokers, depth 2, readable ids."""
        topo = build(SMALL)
        assert len(topo) == 13 and topo.depth == 2
        assert topo.root.id == "hq" and topo.root.role == "root" and topo.root.parent is None
        assert topo.children("hq") == ["region-1", "region-2"]
        assert topo.children("region-2") == [f"store-r2-000{i}" for i in range(1, 6)]
        store = topo.broker("store-r2-0003")
        assert (store.role, store.depth, store.parent, store.region, store.kind) == (
            "leaf", 2, "region-2", "region-2", "store")
        region = topo.broker("region-1")
        assert (region.role, region.depth, region.region, region.kind) == (
            "branch", 1, "region-1", "region")

    def test_deep_estate_counts_are_per_parent(self) -> None:
        """HQ -> 4 countries -> 4 regions each -> 60 stores each is 981 brokers, depth 3."""
        topo = build(DEEP)
        kinds = Counter(b.kind for b in topo.brokers)
        assert kinds == {"hq": 1, "country": 4, "region": 16, "store": 960}
        assert topo.depth == 3
        assert topo.path_to_root("store-r16-0060") == ["store-r16-0060", "region-16",
                                                        "country-4", "hq"]
        assert all(topo.broker(c).role == "branch" for c in topo.children("hq"))

    def test_large_estate_builds_fast(self) -> None:
        """4 x 1,000 stores build in well under a second."""
        start = time.perf_counter()
        topo = build(TopologySpec(regions=4, stores_per_region=1000))
        assert time.perf_counter() - start < 0.5
        assert len(topo) == 4005 and topo.broker("store-r4-1000").parent == "region-4"

    def test_store_numbers_widen_beyond_four_digits(self) -> None:
        """More than 9,999 stores per region still sort and stay unique."""
        topo = build(TopologySpec(regions=1, stores_per_region=10_000))
        assert topo.children("region-1")[0] == "store-r1-00001"
        assert len(topo) == 10_002

    def test_links_and_breadth_first_order(self) -> None:
        """links() has one (parent, child) per non-root broker; parents come first."""
        topo = build(DEEP)
        links = topo.links()
        assert len(links) == len(topo) - 1
        position = {b.id: i for i, b in enumerate(topo.brokers)}
        assert all(position[parent] < position[child] for parent, child in links)
        depths = [b.depth for b in topo.brokers]
        assert depths == sorted(depths)

    def test_match(self) -> None:
        """match() takes an exact id or a glob and returns ids in broker order."""
        topo = build(SMALL)
        assert topo.match("region-1") == ["region-1"]
        assert topo.match("store-r1-*") == [f"store-r1-000{i}" for i in range(1, 6)]
        assert topo.match("nowhere-*") == []
        assert "hq" in topo and "nowhere" not in topo

    def test_rejects_empty_levels(self) -> None:
        """Zero regions or stores is a ValueError."""
        with pytest.raises(ValueError):
            build(TopologySpec(regions=0, stores_per_region=5))


class TestInsertLayer:
    def test_depth_two_becomes_three(self) -> None:
        """A country layer under HQ pushes regions and stores one level down."""
        before = build(TopologySpec(regions=4, stores_per_region=3))
        after = before.insert_layer("country", 2)
        assert (before.depth, after.depth) == (2, 3)
        assert len(after) == len(before) + 2
        assert after.children("hq") == ["country-1", "country-2"]
        assert after.children("country-1") == ["region-1", "region-2"]
        assert after.children("country-2") == ["region-3", "region-4"]
        assert after.path_to_root("store-r3-0001") == ["store-r3-0001", "region-3",
                                                        "country-2", "hq"]
        assert after.broker("store-r3-0001").depth == 3
        assert after.broker("country-1").role == "branch"

    def test_original_is_unchanged(self) -> None:
        """insert_layer returns a new Topology; the old one keeps its shape."""
        before = build(SMALL)
        before.insert_layer("country", 1)
        assert before.depth == 2 and before.broker("region-1").parent == "hq"

    def test_uneven_split_is_near_equal(self) -> None:
        """Five regions over two countries are split 3/2 or 2/3, never 4/1."""
        after = build(TopologySpec(regions=5, stores_per_region=1)).insert_layer("country", 2)
        sizes = sorted(len(after.children(c)) for c in ("country-1", "country-2"))
        assert sizes == [2, 3]

    def test_below_a_branch(self) -> None:
        """A layer can go below a region: only that region's stores move."""
        after = build(SMALL).insert_layer("aisle", 5, parent="region-1")
        assert after.broker("store-r1-0005").depth == 3
        assert after.broker("store-r2-0005").depth == 2
        assert isinstance(after, Topology) and after.children("aisle-5") == ["store-r1-0005"]

    @pytest.mark.parametrize("count", [0, 3])
    def test_bad_count(self, count: int) -> None:
        """count must be between 1 and the number of children."""
        with pytest.raises(ValueError, match="count"):
            build(SMALL).insert_layer("country", count)

    def test_name_clash(self) -> None:
        """A layer whose ids already exist is refused."""
        topo = Topology([BrokerSpec("hq", "root", 0, None, None, "hq"),
                         BrokerSpec("country-1", "leaf", 1, "hq", None, "store")])
        with pytest.raises(ValueError, match="already exists"):
            topo.insert_layer("country", 1)
