"""The measured property: advisory and demand cost per store, tree versus mesh TTL 2.

Estate: HQ, 4 regions, S stores per region; one queue consumer per store
(``queue://<store>.Incoming``) plus one at HQ.  Tree: a store consumer's advisory costs
exactly its depth in frames and leaves interest at three places (HQ, its region, the
store itself).  Mesh with TTL 2 on the same estate spills to every sibling store.
"""

from collections import Counter

import pytest

from treefed.federation.settings import LinkSettings
from treefed.federation.testing import tree_estate

S = 50
REGIONS = 4


def build(mode):
    e, names = tree_estate([REGIONS, S], mode=mode,
                           mesh=LinkSettings(duplex=True, network_ttl=2))
    stores = names[2]
    for store in stores:
        e.subscribe(store, "in", f"queue://{store}.Incoming")
    e.subscribe("HQ", "in", "queue://HQ.Incoming")
    e.run_until_quiet()
    return e, stores


@pytest.fixture(scope="module")
def tree():
    return build("tree")


@pytest.fixture(scope="module")
def mesh():
    return build("mesh")


def frames_per_consumer(e):
    return Counter(f.consumer for _, _, f in e.advisories if f.kind == "add")


def demand_per_consumer(e):
    return Counter(ev["consumer"] for ev in e.events("demand.created"))


class TestCostPerStore:
    def test_tree_frames_per_store_consumer_equal_depth(self, tree):
        """Tree: every store consumer's advisory costs exactly 2 frames (its depth)."""
        e, stores = tree
        frames = frames_per_consumer(e)
        assert {frames[f"{s}/c/in"] for s in stores} == {2}
        # HQ's queue consumer is not advertised down: with route_unknown_up a queue
        # message climbs to it anyway (issue 18 part 4; the plain rule: test_advertise_down)
        assert frames.get("HQ/c/in", 0) == 0

    def test_tree_interest_is_three_entries_per_store(self, tree):
        """Tree: a store consumer is held at HQ, its region and itself: 3 entries."""
        e, stores = tree
        demand = demand_per_consumer(e)
        assert {demand[f"{s}/c/in"] + 1 for s in stores} == {3}  # + the local consumer
        assert not e.events("advisory.received", broker="R1.2", consumer="R1.1/c/in")

    def test_mesh_ttl2_spills_to_every_sibling(self, mesh):
        """Mesh TTL 2: each store consumer costs S+1 frames and S+1 demand entries."""
        e, stores = mesh
        frames, demand = frames_per_consumer(e), demand_per_consumer(e)
        assert {frames[f"{s}/c/in"] for s in stores} == {S + 1}
        assert {demand[f"{s}/c/in"] for s in stores} == {S + 1}

    def test_tree_is_cheaper_on_the_same_estate(self, tree, mesh):
        """Store-consumer demand: 2 per store (tree) versus S+1 per store (mesh TTL 2)."""
        def store_demand(e, stores):
            demand = demand_per_consumer(e)
            return sum(demand[f"{s}/c/in"] for s in stores)
        (te, stores), (me, _) = tree, mesh
        assert store_demand(te, stores) == 2 * len(stores)
        assert store_demand(me, stores) == (S + 1) * len(stores)

    def test_every_store_reachable_in_tree_mode(self, tree):
        """Tree: HQ reaches each store and each store reaches HQ and a far cousin."""
        e, stores = tree
        for store in stores[::25]:
            e.send("HQ", f"queue://{store}.Incoming")
            e.send(store, "queue://HQ.Incoming")
            e.send(stores[-1], f"queue://{store}.Incoming")
        e.run_until_quiet()
        assert all(len(e.delivered(s)) >= 2 for s in stores[::25])
        assert len(e.delivered("HQ")) == len(stores[::25])
