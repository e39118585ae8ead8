"""The retail tree under the classic connector: stores -> region -> HQ, all duplex.

HQ has two regions: R1 with five stores S1..S5 (the N=5 of the brief) and R2 with two
stores T1, T2, so a TTL large enough to cross HQ shows spillage into the other region.
"""

from treefed.federation.settings import LinkSettings
from treefed.federation.testing import Estate

STORE1 = "queue://Store1.Incoming"
R1_STORES = ["S1", "S2", "S3", "S4", "S5"]


def retail(ttl):
    e = Estate()
    for n in ["HQ", "R1", "R2", *R1_STORES, "T1", "T2"]:
        e.add(n)
    s = LinkSettings(duplex=True, network_ttl=ttl)
    e.link("R1", "HQ", s)
    e.link("R2", "HQ", s)
    for store in R1_STORES:
        e.link(store, "R1", s)
    for store in ("T1", "T2"):
        e.link(store, "R2", s)
    e.run_until_quiet()
    return e


def demand_brokers(e, consumer):
    return {ev["broker"] for ev in e.events("demand.created", consumer=consumer)}


class TestRetailMesh:
    def test_ttl1_demand_at_region_only_and_routes_strand(self):
        """TTL 1: only R1 learns of Store1's consumer; HQ->S1 and S2->S1 are stranded."""
        e = retail(1)
        e.subscribe("S1", "in", STORE1)
        e.run_until_quiet()
        assert demand_brokers(e, "S1/c/in") == {"R1"}
        e.send("HQ", STORE1)
        e.send("S2", STORE1)
        e.run_until_quiet()
        assert e.delivered("S1") == []
        assert e.held("HQ", STORE1) == 1 and e.held("S2", STORE1) == 1

    def test_ttl2_spills_to_hq_and_every_sibling(self):
        """TTL 2: demand at R1, HQ and all N-1 sibling stores; the other region is spared."""
        e = retail(2)
        e.subscribe("S1", "in", STORE1)
        e.run_until_quiet()
        assert demand_brokers(e, "S1/c/in") == {"R1", "HQ", "S2", "S3", "S4", "S5"}
        assert {ev["broker"] for ev in e.events("advisory.received")} == \
            {"R1", "HQ", "S2", "S3", "S4", "S5"}
        ids = e.send("HQ", STORE1) + e.send("S3", STORE1)
        e.run_until_quiet()
        assert sorted(e.delivered("S1")) == sorted(ids)

    def test_ttl3_spills_into_the_other_region(self):
        """TTL 3: R2 also holds demand for a store queue it never uses."""
        e = retail(3)
        e.subscribe("S1", "in", STORE1)
        e.run_until_quiet()
        assert demand_brokers(e, "S1/c/in") == {"R1", "HQ", "S2", "S3", "S4", "S5", "R2"}
        ids = e.send("T2", STORE1)
        e.run_until_quiet()
        assert e.delivered("S1") == [] and e.held("T2", STORE1) == 1 and ids

    def test_region_consumer_reaches_hq_and_its_stores_at_ttl1(self):
        """A consumer at R1 gives demand to HQ and R1's own stores with TTL 1."""
        e = retail(1)
        e.subscribe("R1", "in", "queue://R1.Incoming")
        e.run_until_quiet()
        assert demand_brokers(e, "R1/c/in") == {"HQ", *R1_STORES}

    def test_hq_consumer_needs_ttl2_to_reach_stores(self):
        """An HQ consumer reaches only regions at TTL 1; at TTL 2 every store sends to it."""
        e = retail(1)
        e.subscribe("HQ", "in", "queue://HQ.Incoming")
        e.run_until_quiet()
        assert demand_brokers(e, "HQ/c/in") == {"R1", "R2"}
        e.send("S4", "queue://HQ.Incoming")
        e.run_until_quiet()
        assert e.delivered("HQ") == []
        e = retail(2)
        e.subscribe("HQ", "in", "queue://HQ.Incoming")
        e.run_until_quiet()
        assert demand_brokers(e, "HQ/c/in") == {"R1", "R2", *R1_STORES, "T1", "T2"}
        ids = e.send("S4", "queue://HQ.Incoming")
        e.run_until_quiet()
        assert e.delivered("HQ") == ids
