"""Tests for treefed.scenario.engines.replay: the virtual-clock engine end to end."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from treefed.events import validate_event
from treefed.scenario.engines.replay import ReplayEngine
from treefed.scenario.results import Recorder
from treefed.scenario.spec import load_scenario, parse_scenario
from treefed.scenario.workload import build_plan

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


class ListWriter:
    """EventWriter stand-in keeping decoded lines in memory."""

    def __init__(self) -> None:
        self.lines: list[dict] = []

    def write(self, ts: float, broker: str, event: str, fields: dict | None = None) -> None:
        self.lines.append({"ts": ts, "broker": broker, "event": event, **(fields or {})})


def run(sc, label: str):
    plan = build_plan(sc)
    writer = ListWriter()
    rec = Recorder(plan, writer)
    figures = ReplayEngine(plan, sc.mode(label), rec).run()
    return figures["outcome"], writer.lines, rec


def estate(timeline: list | None = None, **workload: object):
    doc = {"name": "r", "seed": 1, "topology": {"regions": 2, "stores_per_region": 3},
           "mode": [{"connector": "tree"},
                    {"connector": "mesh", "network_ttl": 1, "duplex": True},
                    {"connector": "mesh", "network_ttl": 2, "duplex": True}],
           "workload": {"store_queue_consumers": True, **workload}}
    if timeline:
        doc["timeline"] = timeline
    return parse_scenario(doc)


@pytest.fixture(scope="module")
def small():
    return load_scenario(SCENARIOS / "retail-small.toml")


class TestRetailSmall:
    def test_tree_delivers_everything(self, small) -> None:
        """Tree mode: every expected delivery happens exactly once, nothing strands."""
        out, lines, _ = run(small, "tree")
        assert out["expected"] == 40 and out["delivered"] == 40
        assert out["duplicates"] == 0 and out["unexpected"] == 0 and out["stranded"] == 0

    def test_mesh_ttl1_strands_hq_to_store(self, small) -> None:
        """TTL 1: store interest reaches the region only, so HQ->store messages strand
        (at HQ) and no broadcast arrives."""
        out, lines, _ = run(small, "mesh-ttl1")
        assert out["by_kind"]["hq_to_store"]["delivered"] == 0
        assert out["by_kind"]["broadcast"]["delivered"] == 0
        stranded = [e for e in lines if e["event"] == "message.stranded"]
        at_hq = [e for e in stranded if e["dst"].startswith("queue://Store.")
                 and e["broker"] == "hq"]
        assert len(at_hq) == 10 and out["stranded"] == len(stranded)

    def test_mesh_ttl2_reaches_siblings_not_cousins(self, small) -> None:
        """TTL 2: HQ->store and store->HQ arrive; store->store only within a region."""
        out, _, _ = run(small, "mesh-ttl2")
        kinds = out["by_kind"]
        assert kinds["hq_to_store"]["delivered"] == 10
        assert kinds["store_to_hq"]["delivered"] == 10
        assert 0 < kinds["store_to_store"]["delivered"] < 10
        assert out["stranded"] == 10 - kinds["store_to_store"]["delivered"]

    def test_every_line_is_valid(self, small) -> None:
        """Each event line passes events.validate_event; run.* and broker.info present."""
        _, lines, _ = run(small, "mesh-ttl2")
        assert [p for line in lines for p in validate_event(line)] == []
        names = Counter(e["event"] for e in lines)
        assert names["run.started"] == 1 and names["run.finished"] == 1
        assert names["broker.info"] == 13

    def test_deterministic(self, small) -> None:
        """Two runs of one mode give identical counts and deliveries."""
        a, _, rec_a = run(small, "tree")
        b, _, rec_b = run(small, "tree")
        assert a == b and rec_a.delivery_map() == rec_b.delivery_map()


class TestGarbageCollection:
    def test_run_leaves_gc_as_it_found_it(self, small) -> None:
        """A run restores the gc thresholds and leaves nothing in the permanent
        generation, so the caller's collection can free the estate."""
        import gc

        before = gc.get_threshold()
        gc.set_threshold(700, 10, 10)
        try:
            out, _, _ = run(small, "mesh-ttl2")
            assert gc.get_threshold() == (700, 10, 10)
            assert gc.get_freeze_count() == 0
            assert out["expected"] > 0
        finally:
            gc.set_threshold(*before)


class TestFanOutQueue:
    def test_one_frame_to_many_links_is_one_entry(self) -> None:
        """Consecutive Outs of one frame object share a queue entry (one target per
        link, in order); another frame, or the same one later, starts a new entry."""
        from treefed.core.actions import Out
        from treefed.scenario.engines.replay import _Link, _Node
        from treefed.wire.frames import Advisory

        sc = estate()
        plan = build_plan(sc)
        engine = ReplayEngine(plan, sc.mode("mesh-ttl2"), Recorder(plan))
        specs = plan.topology.brokers
        hub = _Node(specs[0])
        links = [_Link(_Node(spec), hub, "mesh") for spec in specs[1:4]]
        for link in links:
            hub.ends[link.parent_conn] = (link, link.child, link.child_conn)
        adv = Advisory("add", "c/a/s", "queue://q", "c", None, 0, [])
        other = Advisory("add", "d/a/s", "queue://q", "d", None, 0, [])
        engine._perform(hub, [Out(link.parent_conn, adv) for link in links]
                        + [Out(links[0].parent_conn, other)], 1.0)
        engine._perform(hub, [Out(links[1].parent_conn, other)], 2.0)
        entries = list(engine._q)
        assert [(t, frame is adv, len(targets) // 4) for t, frame, targets in entries] == \
            [(1.0 + engine.latency, True, 3), (1.0 + engine.latency, False, 1),
             (2.0 + engine.latency, False, 1)]
        assert entries[0][2][0::4] == [link.child for link in links]
        assert engine._queued() == 5


class TestInterestCost:
    def test_tree_advisories_equal_depth(self) -> None:
        """Tree: a store consumer's advisory travels one frame per level, demand at its
        two ancestors only."""
        out, _, _ = run(estate(), "tree")
        assert out["advisory_frames"] == 6 * 2 and out["demand_created"] == 6 * 2

    def test_mesh_ttl2_spills_to_siblings(self) -> None:
        """Mesh TTL 2: demand at the region, HQ and both siblings of every store."""
        out, _, _ = run(estate(), "mesh-ttl2")
        assert out["demand_created"] == 6 * 4


class TestTimeline:
    def test_cut_link_holds_then_delivers(self) -> None:
        """A message sent while a store's link is cut is delivered once it returns."""
        sc = estate([{"at": 2.0, "action": "cut_link", "target": "store-r1-0001"},
                     {"at": 3.0, "action": "send", "target": "hq",
                      "dst": "queue://Store.store-r1-0001.Incoming"},
                     {"at": 4.0, "action": "restore_link", "target": "store-r1-0001"}])
        for label in ("tree", "mesh-ttl2"):
            out, lines, _ = run(sc, label)
            assert out["delivered"] == out["expected"] == 1, label
            delivered = [e for e in lines if e["event"] == "message.delivered"]
            assert delivered[0]["ts"] > 4.0
            downs = [e for e in lines if e["event"] == "link.down"]
            assert {e["broker"] for e in downs} == {"store-r1-0001", "region-1"}

    def test_restart_keeps_persistent_loses_the_rest(self) -> None:
        """Killing HQ while it holds unconsumed messages: the persistent one survives the
        restart and is delivered to a later consumer; the other is gone with the broker:
        dropped with reason broker_killed, not stranded, and the accounting closes."""
        sc = estate([{"at": 2.0, "action": "send", "target": "hq",
                      "dst": "queue://Orphans", "persistent": True},
                     {"at": 2.0, "action": "send", "target": "hq", "dst": "queue://Orphans"},
                     {"at": 3.0, "action": "kill_broker", "target": "hq"},
                     {"at": 4.0, "action": "restart_broker", "target": "hq"},
                     {"at": 5.0, "action": "add_consumer", "target": "store-r2-0003",
                      "dst": "queue://Orphans", "consumer": "late"}])
        out, lines, rec = run(sc, "tree")
        assert out["expected"] == 2 and out["delivered"] == 1 and out["lost"] == 0
        assert out["stranded"] == 0
        assert out["dropped"] == 1 and out["dropped_by_reason"] == {"broker_killed": 1}
        (got,) = [e for e in lines if e["event"] == "message.delivered"]
        assert got["broker"] == "store-r2-0003" and got["ts"] > 5.0

    def test_insert_layer_breaks_ttl2_not_tree(self) -> None:
        """After a layer is inserted, TTL 2 no longer carries store interest to HQ;
        the tree still delivers everything."""
        sc = load_scenario(SCENARIOS / "reconfigure.toml")
        tree, _, _ = run(sc, "tree")
        mesh, lines, _ = run(sc, "mesh-ttl2")
        assert tree["delivered"] == tree["expected"] and tree["stranded"] == 0
        assert mesh["by_kind"]["timeline"]["delivered"] < mesh["by_kind"]["timeline"][
            "expected"]
        assert mesh["by_kind"]["hq_to_store"]["delivered"] == 100  # sent before the change
        info = [e for e in lines if e["event"] == "broker.info" and e["broker"].startswith(
            "country-")]
        assert len(info) == 2 and all(e["parent"] == "hq" for e in info)


class TestRecorder:
    def test_duplicates_and_unexpected(self) -> None:
        """A second delivery of a queue message is a duplicate; one to a consumer the
        plan did not expect is unexpected."""
        plan = build_plan(estate(hq_to_stores=1))
        rec = Recorder(plan)
        msg = next(iter(plan.messages.values()))
        (broker, sub), = msg.expected
        for consumer in (f"{broker}/app/{sub}", f"{broker}/app/{sub}", "hq/app/other"):
            rec.emit(1.0, consumer.split("/")[0], "message.delivered",
                     {"msg": msg.id, "dst": msg.dst, "consumer": consumer})
        out = rec.finish(2.0)
        assert out["delivered"] == 1 and out["duplicates"] == 1 and out["unexpected"] == 1

    def test_batch_counts_like_single_events(self) -> None:
        """emit_logs writes and tallies a step's Log actions exactly as emit does."""
        from treefed.core.actions import Log

        plan = build_plan(estate(hq_to_stores=1))
        msg = next(iter(plan.messages.values()))
        adv = {"link": "l", "peer": "p", "consumer": "c/a/s", "dst": "queue://q",
               "origin": "c", "hops": 1}
        logs = [Log("advisory.sent", {**adv, "kind": "add"}),
                Log("advisory.sent", {**adv, "kind": "remove"}),
                Log("advisory.received", {**adv, "kind": "add"}),
                Log("advisory.received", {**adv, "kind": "remove"}),
                Log("demand.created", {**adv, "priority": 0, "conduit": False}),
                Log("message.produced", {"msg": msg.id, "dst": msg.dst})]
        one, many = Recorder(plan, ListWriter()), Recorder(plan, ListWriter())
        for log in logs:
            one.emit(1.0, "hq", log.event, log.fields)
        many.emit_logs(1.0, "hq", logs)
        assert many.writer.lines == one.writer.lines
        assert many.counts == one.counts
        assert (many.adds_sent, many.removes_sent, many.adds_received) == (1, 1, 1)
        assert many.holder == one.holder == {msg.id: "hq"}
        assert many.finish(2.0) == one.finish(2.0)

    def test_stranded_at_last_holder(self) -> None:
        """An undelivered queue message is stranded where it was last forwarded to."""
        plan = build_plan(estate(hq_to_stores=1))
        sink = ListWriter()
        rec = Recorder(plan, sink)
        msg = next(iter(plan.messages.values()))
        rec.emit(1.0, "hq", "message.produced", {"msg": msg.id, "dst": msg.dst})
        rec.emit(1.0, "hq", "message.forwarded", {"msg": msg.id, "dst": msg.dst,
                                                  "link": "tree", "peer": "region-1",
                                                  "hops": 1})
        out = rec.finish(2.0)
        assert out["stranded"] == 1
        assert sink.lines[-1] == {"ts": 2.0, "broker": "region-1",
                                  "event": "message.stranded", "msg": msg.id,
                                  "dst": msg.dst}


class TestSameTimeBatches:
    """_deliver hands same-time entries over site by site: each link stays FIFO, every
    frame is delivered once, time never goes back, a timer due now goes first."""

    def engine(self, monkeypatch, batch: int):
        import treefed.scenario.engines.replay as replay_module

        monkeypatch.setattr(replay_module, "_BATCH", batch)
        sc = estate()
        plan = build_plan(sc)
        eng = ReplayEngine(plan, sc.mode("tree"), Recorder(plan, None))
        seen: list[tuple] = []
        eng._handle = lambda node, conn, frame, link, epoch, t: seen.append(
            (node, conn, frame, t))
        return eng, seen

    @pytest.mark.parametrize("batch", [1, 3, 256])
    def test_every_site_gets_its_frames_in_queue_order(self, monkeypatch, batch) -> None:
        eng, seen = self.engine(monkeypatch, batch)
        link = object()
        for i in range(7):   # seven fan-outs of one time, then a later frame
            eng._q.append((1.0, f"f{i}", ["a", "x", link, 0, "b", "x", link, 0,
                                          "c", "y", link, 0]))
        eng._q.append((2.0, "g", ["a", "x", link, 0]))
        eng._deliver(5.0)
        assert len(seen) == 22
        for node in "abc":
            got = [frame for n, _, frame, _ in seen if n == node]
            assert got == [f"f{i}" for i in range(7)] + (["g"] if node == "a" else [])
        assert [t for *_, t in seen] == sorted(t for *_, t in seen)
        if batch == 3:   # a batch goes site by site: a takes f0..f2 in a row
            assert [(n, f) for n, _, f, _ in seen[:4]] == [
                ("a", "f0"), ("a", "f1"), ("a", "f2"), ("b", "f0")]

    def test_not_past_until(self, monkeypatch) -> None:
        eng, seen = self.engine(monkeypatch, 256)
        link = object()
        eng._q.extend([(1.0, "f", ["a", "x", link, 0]), (1.0, "f2", ["b", "x", link, 0]),
                       (3.0, "late", ["a", "x", link, 0])])
        eng._deliver(2.0)
        assert [f for _, _, f, _ in seen] == ["f", "f2"] and len(eng._q) == 1
