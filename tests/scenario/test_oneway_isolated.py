"""The one-way (concentrator) mesh and the NATS-style isolated-leaf baselines
(scenario/baselines.py), hand-checked on a 7-broker estate and held equal across engines.

TINY: hq -> region-1, region-2 -> two stores each (store-r1-0001, store-r1-0002,
store-r2-0001, store-r2-0002).  Consumers: per store a queue consumer on
Store.<id>.Incoming and a Broadcast.Prices subscriber; HQ.Incoming at hq;
Region.<r>.Incoming at each region.  Traffic (seed 7): hq -> each store's queue (4),
each store -> HQ.Incoming (4), store-r2-0001 -> Store.store-r1-0001 and store-r2-0002 ->
Store.store-r2-0001 (2), one Broadcast.Prices from hq (4 copies): 14 expected copies.
"Spill" is the report's: an add advisory received by a broker that never produces or
forwards a message of its destination.

mesh-tuned-oneway (TTL 2; region and HQ links duplex; each store's uplink NON-duplex,
limited to Region.<own region>.> and HQ.>).  A one-way link forwards messages only from
the dialing store up and only the region advertises down it, so no store advertises.
Advisories, by consumer:

* HQ.Incoming: hq -> 2 regions, each region -> its 2 stores: 6;
* Region.<r>.Incoming: region -> hq, region -> its 2 stores, hq -> the other region
  (that region does not pass it to its stores: their filters name their own region
  only): 4 x 2 = 8;
* store queue and topic consumers: 0.

14 frames, 14 demands (one per receipt): hq 2 (the region queues), each region 2
(HQ.Incoming, the other region's queue), each store 2 (its region's queue,
HQ.Incoming).  Spill 8 = hq 2 + each region 1 (the other region's queue) + each store 1
(its region's queue: downward interest); no sibling spill.  Delivered 4 (store -> HQ);
the 4 HQ -> store messages strand at hq, the 2 store -> store ones at their senders, and
the broadcast is dropped at hq (no_route, 4 copies): 14 = 4 + 6 + 4.

nats-isolated (tree connector, route_unknown_up false, so queue and topic interest is
advertised down): interest from a child goes to its parent only.

* each store's queue and topic consumer: store -> region -> hq: 2 x 8 = 16;
* HQ.Incoming: hq -> 2 regions -> 4 stores: 6;
* Region.<r>.Incoming: region -> hq and its 2 stores (hq keeps it from the other
  region): 3 x 2 = 6.

28 frames.  Demand 26: a topic conduit per (link, destination) folds hq's two
Broadcast.Prices receipts per region link into one: hq 8 (2 region queues, 4 store
queues, 2 topic conduits), each region 5 (HQ.Incoming, 2 store queues, 2 topics), each
store 2.  Spill 6 = hq 2 (region queues) + each store 1 (its region's queue); no store
hears a sibling.  Delivered 12: both store -> store messages strand at their senders
(store-r2-0002 -> store-r2-0001 too: the same region's sibling is never advertised).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import pytest

from treefed.events import validate_event
from treefed.scenario import compare
from treefed.scenario.baselines import ONEWAY_INCLUDES, STORE_DUPLEX, STORE_INCLUDES, \
    TUNED_MODES, store_options, tuned_modes
from treefed.scenario.engines import engine_class
from treefed.scenario.engines.live import site_config
from treefed.scenario.results import Recorder
from treefed.scenario.spec import Mode, load_scenario, parse_scenario
from treefed.scenario.workload import build_plan

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
ONEWAY = Mode("mesh-tuned-oneway", *TUNED_MODES["mesh-tuned-oneway"])
ISOLATED = Mode("nats-isolated", *TUNED_MODES["nats-isolated"])
NEW = ("mesh-tuned-oneway", "nats-isolated")

TINY = {"name": "tiny", "seed": 7, "topology": {"regions": 2, "stores_per_region": 2},
        "mode": [{"connector": "tree"}],
        "workload": {"store_queue_consumers": True, "store_topic_subscribers": True,
                     "hq_consumers": ["queue://HQ.Incoming"],
                     "region_consumers": ["queue://Region.{region}.Incoming"],
                     "hq_to_stores": 1, "stores_to_hq": 1, "store_to_store": 2,
                     "topic_broadcasts": 1}}

S11, S12, S21, S22 = "store-r1-0001", "store-r1-0002", "store-r2-0001", "store-r2-0002"


class Lines:
    def __init__(self) -> None:
        self.lines: list[dict] = []

    def write(self, ts: float, broker: str, event: str, fields: dict | None = None) -> None:
        self.lines.append({"ts": ts, "broker": broker, "event": event, **(fields or {})})


def run(scenario, engine: str, label: str) -> tuple[dict, dict, dict, list]:
    """(event counts, deliveries, summary figures, lines) of one run of ``label``."""
    sc = compare.with_compared_modes(scenario)
    plan = build_plan(sc)
    lines = Lines()
    rec = Recorder(plan, lines)
    figures = engine_class(engine)(plan, sc.mode(label), rec).run()["outcome"]
    return dict(rec.counts), rec.delivery_map(), figures, lines.lines


def per_broker(lines: list, event: str) -> Counter:
    return Counter(x["broker"] for x in lines
                   if x["event"] == event and x.get("kind", "add") == "add")


def spill(lines: list) -> tuple[Counter, int, int]:
    """(spilled add receipts per broker, sibling spill, downward spill)."""
    sends = defaultdict(set)
    for x in lines:
        if x["event"] in ("message.produced", "message.forwarded"):
            sends[x["broker"]].add(x["dst"])
    spilled = [x for x in lines if x["event"] == "advisory.received"
               and x.get("kind") == "add" and x["dst"] not in sends[x["broker"]]]
    at_store = [x for x in spilled if x["broker"].startswith("store-")]
    sibling = sum(1 for x in at_store if x["origin"].startswith("store-"))
    return Counter(x["broker"] for x in spilled), sibling, len(at_store) - sibling


def stranded_at(lines: list) -> Counter:
    return Counter((x["broker"], x["dst"]) for x in lines if x["event"] == "message.stranded")


class TestConfiguration:
    def test_store_uplink_is_one_way_and_filtered_regions_stay_duplex(self):
        plan = build_plan(load_scenario(SCENARIOS / "retail-small.toml"))
        by_id = {b.id: b for b in plan.topology.brokers}
        store = store_options(ONEWAY, by_id["store-r1-0002"])
        assert store == {"network_ttl": 2, "duplex": False, "dynamically_included": [
            "queue://Region.region-1.>", "queue://HQ.>"]}
        assert store_options(ONEWAY, by_id["region-1"]) == {"network_ttl": 2, "duplex": True}
        assert STORE_DUPLEX not in store and STORE_INCLUDES not in store
        assert len(ONEWAY_INCLUDES) == 2

    def test_live_engines_get_the_same_connectors(self):
        plan = build_plan(load_scenario(SCENARIOS / "retail-small.toml"))
        by_id = {b.id: b for b in plan.topology.brokers}
        (conn,) = site_config(ONEWAY, by_id[S21], parent_uri="tcp://127.0.0.1:1") \
            .network_connectors
        assert conn.duplex is False
        assert conn.dynamically_included == ("queue://Region.region-2.>", "queue://HQ.>")
        (conn,) = site_config(ONEWAY, by_id["region-2"], parent_uri="tcp://127.0.0.1:1") \
            .network_connectors
        assert conn.duplex is True and conn.dynamically_included == ()
        cfg = site_config(ISOLATED, by_id[S21], parent_uri="tcp://127.0.0.1:1")
        assert cfg.tree_connector.route_unknown_up is False
        assert cfg.network_connectors == ()

    def test_compare_runs_both_and_sets_ttl_for_the_mesh_only(self):
        for name, ttl in (("sweep-depth-2", 2), ("sweep-depth-4", 4)):
            sc = compare.with_compared_modes(load_scenario(SCENARIOS / f"{name}.toml"))
            assert sc.mode("mesh-tuned-oneway").options["network_ttl"] == ttl
            isolated = sc.mode("nats-isolated")
            assert (isolated.connector, isolated.options) == ("tree",
                                                              {"route_unknown_up": False})
        assert "network_ttl" not in tuned_modes(4)["nats-isolated"][1]


class TestHandCount:
    def test_oneway_tiny(self):
        _, _, out, lines = run(parse_scenario(TINY), "replay", "mesh-tuned-oneway")
        assert (out["advisory_frames"], out["advisory_receipts"], out["demand_created"]) \
            == (14, 14, 14)
        assert per_broker(lines, "demand.created") == {
            "hq": 2, "region-1": 2, "region-2": 2, S11: 2, S12: 2, S21: 2, S22: 2}
        spilled, sibling, downward = spill(lines)
        assert spilled == {"hq": 2, "region-1": 1, "region-2": 1, S11: 1, S12: 1, S21: 1,
                           S22: 1}
        assert (sum(spilled.values()), sibling, downward) == (8, 0, 4)
        assert not any(x["event"] == "advisory.sent" and x["broker"].startswith("store-")
                       for x in lines), "a store advertised over its one-way uplink"
        assert {k: (v["delivered"], v["expected"]) for k, v in out["by_kind"].items()} == {
            "hq_to_store": (0, 4), "store_to_hq": (4, 4), "store_to_store": (0, 2),
            "broadcast": (0, 4)}
        assert stranded_at(lines) == {
            ("hq", f"queue://Store.{s}.Incoming"): 1 for s in (S11, S12, S21, S22)} | {
            (S21, f"queue://Store.{S11}.Incoming"): 1,
            (S22, f"queue://Store.{S21}.Incoming"): 1}
        assert (out["expected"], out["delivered"], out["stranded"], out["dropped"],
                out["lost"]) == (14, 4, 6, 4, 0)

    def test_isolated_tiny(self):
        _, _, out, lines = run(parse_scenario(TINY), "replay", "nats-isolated")
        assert (out["advisory_frames"], out["advisory_receipts"], out["demand_created"]) \
            == (28, 28, 26)
        assert per_broker(lines, "demand.created") == {
            "hq": 8, "region-1": 5, "region-2": 5, S11: 2, S12: 2, S21: 2, S22: 2}
        spilled, sibling, downward = spill(lines)
        assert spilled == {"hq": 2, S11: 1, S12: 1, S21: 1, S22: 1}
        assert (sum(spilled.values()), sibling, downward) == (6, 0, 4)
        assert {k: (v["delivered"], v["expected"]) for k, v in out["by_kind"].items()} == {
            "hq_to_store": (4, 4), "store_to_hq": (4, 4), "store_to_store": (0, 2),
            "broadcast": (4, 4)}
        assert stranded_at(lines) == {(S21, f"queue://Store.{S11}.Incoming"): 1,
                                      (S22, f"queue://Store.{S21}.Incoming"): 1}
        assert (out["expected"], out["delivered"], out["stranded"], out["dropped"],
                out["lost"]) == (14, 12, 2, 0, 0)

    def test_tree_delivers_what_isolation_strands(self):
        """The same estate under the default tree: 18 frames (each store's two consumers
        up two levels, 16; each region's queue to hq, 2 -- queue interest from above is
        not advertised down, so hq's and the regions' queues stay off the stores), spill 2
        (hq: the region queues), and route_unknown_up carries the two store -> store
        messages up to the common ancestor and down."""
        _, _, out, lines = run(parse_scenario(TINY), "replay", "tree")
        assert out["advisory_frames"] == 18
        assert spill(lines) == (Counter({"hq": 2}), 0, 0)
        assert (out["delivered"], out["stranded"]) == (14, 0)

    def test_isolated_never_tells_a_leaf_about_another_branch(self):
        """retail-small: no advisory reaches a store or region from another subtree --
        only its own ancestors' consumers."""
        _, _, out, lines = run(load_scenario(SCENARIOS / "retail-small.toml"), "replay",
                               "nats-isolated")
        for x in lines:
            # below hq a receipt is about the sender's own consumer or hq's
            if x["event"] == "advisory.received" and x["broker"] != "hq":
                assert x["origin"] in ("hq", x["peer"]), x
        assert {k: v["delivered"] == v["expected"] for k, v in out["by_kind"].items()} == {
            "hq_to_store": True, "store_to_hq": True, "store_to_store": False,
            "broadcast": True}

    @pytest.mark.parametrize("label", NEW)
    def test_depth_4(self, label):
        """sweep-depth-4 (HQ, 3 layers, stores): the one-way estate serves only
        store -> HQ; the isolated one all but store -> store."""
        sc = load_scenario(SCENARIOS / "sweep-depth-4.toml")
        _, _, out, _ = run(sc, "replay", label)
        served = {k for k, v in out["by_kind"].items() if v["delivered"] == v["expected"]}
        assert served == ({"store_to_hq"} if label == "mesh-tuned-oneway"
                          else {"hq_to_store", "store_to_hq", "broadcast"})
        assert out["lost"] == 0


_REFERENCE: dict = {}


def assert_same(engine: str, label: str, name: str = "retail-small") -> list:
    """``name`` under ``engine`` gives the replay engine's counts and deliveries."""
    sc = load_scenario(SCENARIOS / f"{name}.toml")
    if (name, label) not in _REFERENCE:
        _REFERENCE[name, label] = run(sc, "replay", label)
    counts, deliveries, figures, lines = run(sc, engine, label)
    ref_counts, ref_deliveries, ref_figures, _ = _REFERENCE[name, label]
    assert counts == ref_counts, f"{engine} {label}: event counts differ"
    assert deliveries == ref_deliveries, f"{engine} {label}: deliveries differ"
    for key in ("advisory_frames", "advisory_receipts", "demand_created", "expected",
                "delivered", "duplicates", "stranded"):
        assert figures[key] == ref_figures[key], (engine, label, key)
    return lines


class TestCrossEngine:
    @pytest.mark.parametrize("label", NEW)
    def test_memory_matches_replay(self, label):
        lines = assert_same("memory", label)
        assert [p for line in lines for p in validate_event(line)] == []

    @pytest.mark.parametrize("label", NEW)
    def test_tcp_matches_replay(self, label):
        assert_same("tcp", label)

    @pytest.mark.slow
    @pytest.mark.parametrize("label", NEW)
    def test_procs_matches_replay(self, label):
        lines = assert_same("procs", label)
        assert [p for line in lines for p in validate_event(line)] == []

    @pytest.mark.parametrize("label", NEW)
    def test_churn_timeline_matches_replay(self, label):
        """churn (consumer churn, cut and restored links, a killed and restarted region)
        on in-memory nodes gives exactly the replay engine's results."""
        assert_same("memory", label, "churn")

    @pytest.mark.parametrize("engine", ("memory", "tcp"))
    @pytest.mark.parametrize("label", NEW)
    def test_faults_match_replay(self, engine, label):
        """test_engines' persistent workload through a cut link, a killed and restarted
        region and a consumer that leaves and returns: same counts and deliveries."""
        from tests.scenario.test_engines import FAULTY

        counts, deliveries, got, _ = run(parse_scenario(FAULTY), engine, label)
        ref_counts, ref_map, ref, _ = run(parse_scenario(FAULTY), "replay", label)
        assert counts == ref_counts and deliveries == ref_map
        assert got["delivered"] == ref["delivered"] > 0 and got["lost"] == 0
