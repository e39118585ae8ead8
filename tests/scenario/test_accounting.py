"""The runner's accounting: expected = delivered + stranded + dropped + lost, per copy.

Hand-checked: a two-store estate fed synthetic events (each term on its own), and
retail-small in the replay engine, where mesh TTL 1 strands the 30 queue messages and
HQ drops the one broadcast (10 copies, no route) -- 0 + 30 + 10 + 0 = 40.
"""

from __future__ import annotations

from pathlib import Path

from treefed.scenario.engines.replay import ReplayEngine
from treefed.scenario.results import KILLED, Recorder
from treefed.scenario.spec import load_scenario, parse_scenario
from treefed.scenario.workload import build_plan

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
TERMS = ("expected", "delivered", "stranded", "dropped", "lost")


def two_stores():
    """m1 -> store-r1-0001's queue, m2 -> store-r1-0002's queue, m3 broadcast (2 copies)."""
    sc = parse_scenario({"name": "a", "topology": {"regions": 1, "stores_per_region": 2},
                         "mode": [{"connector": "tree"}],
                         "workload": {"store_queue_consumers": True,
                                      "store_topic_subscribers": True,
                                      "hq_to_stores": 1, "topic_broadcasts": 1}})
    return build_plan(sc)


def terms(out: dict) -> dict:
    return {k: out[k] for k in TERMS}


def produce_all(rec: Recorder) -> None:
    for m in ("m1", "m2"):
        rec.emit(1.0, "hq", "message.produced",
                 {"msg": m, "dst": rec.plan.messages[m].dst})
    rec.emit(1.0, "hq", "message.produced", {"msg": "m3", "dst": "topic://Broadcast.Prices"})


def deliver(rec: Recorder, msg: str, broker: str, sub: str) -> None:
    rec.emit(2.0, broker, "message.delivered",
             {"msg": msg, "dst": rec.plan.messages[msg].dst, "consumer": f"{broker}/app/{sub}"})


class TestTerms:
    def test_everything_delivered(self):
        rec = Recorder(two_stores())
        produce_all(rec)
        deliver(rec, "m1", "store-r1-0001", "store-queue")
        deliver(rec, "m2", "store-r1-0002", "store-queue")
        deliver(rec, "m3", "store-r1-0001", "store-topic")
        deliver(rec, "m3", "store-r1-0002", "store-topic")
        out = rec.finish(5.0)
        assert terms(out) == dict(expected=4, delivered=4, stranded=0, dropped=0, lost=0)
        assert out["dropped_by_reason"] == {}

    def test_stranded_dropped_and_partial_topic(self):
        """m1 waits at the region (stranded), m2 dropped for its limit, the broadcast
        reaches one store and is dropped (no_route) at the region for the other."""
        rec = Recorder(two_stores())
        produce_all(rec)
        rec.emit(1.5, "hq", "message.forwarded",
                 {"msg": "m1", "dst": rec.plan.messages["m1"].dst, "peer": "region-1"})
        rec.emit(1.5, "hq", "message.dropped",
                 {"msg": "m2", "dst": rec.plan.messages["m2"].dst, "reason": "limit"})
        deliver(rec, "m3", "store-r1-0001", "store-topic")
        rec.emit(1.5, "region-1", "message.dropped",
                 {"msg": "m3", "dst": "topic://Broadcast.Prices", "reason": "no_route"})
        out = rec.finish(5.0)
        assert terms(out) == dict(expected=4, delivered=1, stranded=1, dropped=2, lost=0)
        assert out["dropped_by_reason"] == {"limit": 1, "no_route": 1}

    def test_killed_holder_is_a_drop_with_its_reason(self):
        rec = Recorder(two_stores())
        produce_all(rec)
        deliver(rec, "m2", "store-r1-0002", "store-queue")
        deliver(rec, "m3", "store-r1-0001", "store-topic")
        deliver(rec, "m3", "store-r1-0002", "store-topic")
        rec.killed("hq")      # m1 (non-persistent) was still at HQ
        out = rec.finish(5.0)
        assert terms(out) == dict(expected=4, delivered=3, stranded=0, dropped=1, lost=0)
        assert out["dropped_by_reason"] == {KILLED: 1}

    def test_unexplained_copies_are_lost(self):
        """m1 delivered only to a consumer the plan did not expect, one broadcast copy
        never arrives with no drop logged: 2 lost."""
        rec = Recorder(two_stores())
        produce_all(rec)
        deliver(rec, "m1", "store-r1-0002", "store-queue")
        deliver(rec, "m2", "store-r1-0002", "store-queue")
        deliver(rec, "m3", "store-r1-0002", "store-topic")
        out = rec.finish(5.0)
        assert terms(out) == dict(expected=4, delivered=2, stranded=0, dropped=0, lost=2)
        assert out["unexpected"] == 1


class TestRetailSmall:
    def test_every_mode_closes(self):
        sc = load_scenario(SCENARIOS / "retail-small.toml")
        plan = build_plan(sc)
        got = {}
        for mode in sc.modes:
            rec = Recorder(plan)
            out = ReplayEngine(plan, mode, rec).run()["outcome"]
            got[mode.label] = (terms(out), out["dropped_by_reason"])
        assert got == {
            "tree": (dict(expected=40, delivered=40, stranded=0, dropped=0, lost=0), {}),
            "mesh-ttl1": (dict(expected=40, delivered=0, stranded=30, dropped=10, lost=0),
                          {"no_route": 10}),
            "mesh-ttl2": (dict(expected=40, delivered=33, stranded=7, dropped=0, lost=0), {}),
        }
