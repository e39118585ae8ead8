"""The tuned-mesh baseline: each store's connector limited to its own, its region's and
HQ's queues and the broadcast topics (baselines.py), hand-checked on retail-small.

retail-small: HQ, 2 regions x 5 stores; per store a queue consumer (Store.<id>.Incoming)
and a Broadcast.Prices subscriber; HQ.Incoming at HQ; Region.<id>.Incoming per region.
TTL 2, duplex, filters only on the 10 store uplinks.  Advisory frames, by consumer:

* store queue: store -> region, region -> HQ; the 4 siblings' filters refuse it: 2 x 10;
* store topic: store -> region, region -> HQ and the 4 siblings (Broadcast.> is on every
  list): 6 x 10;
* HQ.Incoming: HQ -> 2 regions, each region -> its 5 stores: 12;
* Region.<r>.Incoming: region -> HQ and its 5 stores, HQ -> the other region: 7 x 2;

106 in all (the default TTL 2 mesh sends 146: the 40 sibling queue advisories).  Every
HQ-to-store, store-to-HQ and broadcast copy arrives; the 10 store-to-store messages strand.
"""

from __future__ import annotations

from pathlib import Path

from treefed.scenario.baselines import STORE_INCLUDES, TUNED_MODES, store_options
from treefed.scenario.engines.replay import ReplayEngine
from treefed.scenario.results import Recorder
from treefed.scenario.spec import Mode, load_scenario
from treefed.scenario.workload import build_plan

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
TUNED = Mode("mesh-tuned", *TUNED_MODES["mesh-tuned"])


def test_only_store_uplinks_are_filtered():
    plan = build_plan(load_scenario(SCENARIOS / "retail-small.toml"))
    by_id = {b.id: b for b in plan.topology.brokers}
    store = store_options(TUNED, by_id["store-r1-0002"])
    assert store["dynamically_included"] == [
        "queue://Store.store-r1-0002.>", "queue://Region.region-1.>", "queue://HQ.>",
        "topic://Broadcast.>"]
    assert STORE_INCLUDES not in store
    region = store_options(TUNED, by_id["region-1"])
    assert region == {"network_ttl": 2, "duplex": True}


def test_live_engines_get_the_same_filter():
    """The memory/tcp/procs engines build broker configs: the store's connector carries
    the filled-in list, the region's none."""
    from treefed.scenario.engines.live import site_config

    plan = build_plan(load_scenario(SCENARIOS / "retail-small.toml"))
    by_id = {b.id: b for b in plan.topology.brokers}
    cfg = site_config(TUNED, by_id["store-r2-0001"], parent_uri="tcp://127.0.0.1:1")
    (conn,) = cfg.network_connectors
    assert "queue://Store.store-r2-0001.>" in conn.dynamically_included
    cfg = site_config(TUNED, by_id["region-2"], parent_uri="tcp://127.0.0.1:1")
    (conn,) = cfg.network_connectors
    assert conn.dynamically_included == ()


def test_retail_small_hand_count():
    sc = load_scenario(SCENARIOS / "retail-small.toml")
    plan = build_plan(sc)
    out = ReplayEngine(plan, TUNED, Recorder(plan)).run()["outcome"]
    assert out["advisory_frames"] == 106 and out["advisory_receipts"] == 106
    assert {k: v["delivered"] for k, v in out["by_kind"].items()} == {
        "hq_to_store": 10, "store_to_hq": 10, "store_to_store": 0, "broadcast": 10}
    assert (out["expected"], out["delivered"], out["stranded"], out["dropped"],
            out["lost"]) == (40, 30, 10, 0, 0)
    ttl2 = ReplayEngine(plan, sc.mode("mesh-ttl2"), Recorder(plan)).run()["outcome"]
    assert ttl2["advisory_frames"] - out["advisory_frames"] == 40


def test_compare_sets_the_tuned_ttl_to_the_estate_depth():
    """An operator sets TTL = depth: 2 for HQ -> region -> store, 4 with two more layers
    (TTL 2 there strands everything between HQ and the stores)."""
    from treefed.scenario import compare

    for name, ttl in (("sweep-depth-2", 2), ("sweep-depth-4", 4)):
        sc = compare.with_compared_modes(load_scenario(SCENARIOS / f"{name}.toml"))
        assert sc.mode("mesh-tuned").options["network_ttl"] == ttl


def test_tuned_delivers_all_but_store_to_store_at_depth_4():
    from treefed.scenario import compare

    sc = compare.with_compared_modes(load_scenario(SCENARIOS / "sweep-depth-4.toml"))
    plan = build_plan(sc)
    out = ReplayEngine(plan, sc.mode("mesh-tuned"), Recorder(plan)).run()["outcome"]
    assert {k: v["delivered"] == v["expected"] for k, v in out["by_kind"].items()} == {
        "hq_to_store": True, "store_to_hq": True, "store_to_store": False,
        "broadcast": True}
    assert out["lost"] == 0
