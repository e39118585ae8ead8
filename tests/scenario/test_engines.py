"""Cross-engine tests: the same scenario gives the same counts and deliveries under the
replay, memory, tcp and procs engines, in both connector modes."""

from __future__ import annotations

from pathlib import Path

import pytest

from treefed.events import validate_event
from treefed.scenario.engines import engine_class
from treefed.scenario.engines.live import site_config
from treefed.scenario.results import Recorder
from treefed.scenario.runner import run_scenario
from treefed.scenario.spec import load_scenario, parse_scenario
from treefed.scenario.workload import build_plan

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


class Lines:
    def __init__(self) -> None:
        self.lines: list[dict] = []

    def write(self, ts: float, broker: str, event: str, fields: dict | None = None) -> None:
        self.lines.append({"ts": ts, "broker": broker, "event": event, **(fields or {})})


def outcome(name: str, engine: str, label: str) -> tuple[dict, dict, dict, list]:
    """(event counts, deliveries, summary figures, lines) of one engine run."""
    sc = load_scenario(SCENARIOS / f"{name}.toml")
    plan = build_plan(sc)
    lines = Lines()
    rec = Recorder(plan, lines)
    figures = engine_class(engine)(plan, sc.mode(label), rec).run()["outcome"]
    return dict(rec.counts), rec.delivery_map(), figures, lines.lines


_REFERENCE: dict = {}


def reference(name: str, label: str):
    if (name, label) not in _REFERENCE:
        _REFERENCE[name, label] = outcome(name, "replay", label)
    return _REFERENCE[name, label]


def assert_same(name: str, engine: str, label: str) -> list:
    counts, deliveries, figures, lines = outcome(name, engine, label)
    ref_counts, ref_deliveries, ref_figures, _ = reference(name, label)
    assert counts == ref_counts, f"{engine} {label}: event counts differ"
    assert deliveries == ref_deliveries, f"{engine} {label}: deliveries differ"
    for key in ("advisory_frames", "advisory_receipts", "demand_created", "expected",
                "delivered", "duplicates", "stranded"):
        assert figures[key] == ref_figures[key], (engine, label, key)
    return lines


MODES = ("tree", "mesh-ttl1", "mesh-ttl2")


class TestCrossEngine:
    @pytest.mark.parametrize("label", MODES)
    def test_memory_matches_replay(self, label: str) -> None:
        """retail-small on in-memory BrokerNodes: same advisories, demand, deliveries."""
        lines = assert_same("retail-small", "memory", label)
        assert [p for line in lines for p in validate_event(line)] == []

    @pytest.mark.parametrize("label", MODES)
    def test_tcp_matches_replay(self, label: str) -> None:
        """retail-small on BrokerNodes over loopback TCP: same counts and deliveries."""
        assert_same("retail-small", "tcp", label)

    @pytest.mark.slow
    @pytest.mark.parametrize("label", ("tree", "mesh-ttl2"))
    def test_procs_matches_replay(self, label: str) -> None:
        """retail-small with one `treefed broker` process per site: same results."""
        lines = assert_same("retail-small", "procs", label)
        assert [p for line in lines for p in validate_event(line)] == []

    @pytest.mark.parametrize("label", ("tree", "mesh-ttl2"))
    def test_timeline_matches_replay(self, label: str) -> None:
        """churn (consumer churn, cut and restored links, a killed and restarted region)
        on in-memory nodes gives exactly the replay engine's results."""
        _, _, figures, _ = reference("churn", label)
        assert figures["delivered"] > 0
        assert_same("churn", "memory", label)

    @pytest.mark.slow
    def test_reconfigure_matches_replay(self) -> None:
        """Inserting a layer mid-run re-links the moved regions the same way."""
        assert_same("reconfigure", "memory", "mesh-ttl2")


FAULTY = {
    "name": "faulty", "seed": 2, "topology": {"regions": 2, "stores_per_region": 2},
    "mode": [{"connector": "tree"}, {"connector": "mesh", "network_ttl": 2, "duplex": True}],
    "workload": {"hq_consumers": ["queue://HQ.Incoming"], "hq_to_stores": 1,
                 "stores_to_hq": 1, "store_to_store": 3, "persistent": True},
    "timeline": [
        {"at": 2.0, "action": "cut_link", "target": "store-r1-0001"},
        {"at": 2.5, "action": "send", "target": "hq", "count": 2,
         "dst": "queue://Store.store-r1-0001.Incoming"},
        {"at": 3.0, "action": "kill_broker", "target": "region-2"},
        {"at": 3.5, "action": "send", "target": "store-r2-*", "dst": "queue://HQ.Incoming"},
        {"at": 4.0, "action": "restart_broker", "target": "region-2"},
        {"at": 4.5, "action": "restore_link", "target": "store-r1-0001"},
        {"at": 5.0, "action": "remove_consumer", "target": "store-r2-0002",
         "dst": "queue://Store.{broker}.Incoming"},
        {"at": 5.5, "action": "send", "target": "hq",
         "dst": "queue://Store.store-r2-0002.Incoming"},
        {"at": 6.0, "action": "add_consumer", "target": "store-r2-0002", "consumer": "back",
         "dst": "queue://Store.{broker}.Incoming"}]}


class TestFaults:
    @pytest.mark.parametrize("engine", ("memory", "tcp"))
    @pytest.mark.parametrize("label", ("tree", "mesh-ttl2"))
    def test_faults_match_replay(self, engine: str, label: str) -> None:
        """A persistent workload through a cut link, a killed and restarted region and a
        consumer that leaves and returns: same counts and deliveries as replay."""
        sc = parse_scenario(FAULTY)
        results = {}
        for name in ("replay", engine):
            plan = build_plan(sc)
            rec = Recorder(plan)
            figures = engine_class(name)(plan, sc.mode(label), rec).run()["outcome"]
            results[name] = (rec.counts, rec.delivery_map(), figures)
        (ref_counts, ref_map, ref), (counts, deliveries, got) = results.values()
        assert counts == ref_counts and deliveries == ref_map
        assert got["delivered"] == ref["delivered"] > 0 and got["lost"] == 0


class TestLiveEngines:
    def test_runner_writes_memory_runs(self, tmp_path: Path) -> None:
        """run_scenario(engine="memory") writes the same kind of run directory."""
        (r,) = run_scenario(SCENARIOS / "retail-small.toml", engine="memory", out=tmp_path,
                            modes=["tree"])
        assert r.summary["engine"] == "memory" and r.path.name == r.run_id
        assert r.run_id.startswith("retail-small-tree-memory-")
        assert r.summary["delivered"] == 40 and (r.path / "events.jsonl.gz").stat().st_size

    def test_site_config_per_mode(self) -> None:
        """Generated configs: a leaf dials a tree connector, a mesh site an uplink with the
        mode's options, the root dials nothing."""
        sc = load_scenario(SCENARIOS / "retail-small.toml")
        topo = sc.build_topology()
        store, hq = topo.broker("store-r1-0001"), topo.root
        tree = site_config(sc.mode("tree"), store, parent_uri="tcp://127.0.0.1:1")
        assert tree.tree_connector.node_type == "leaf" and not tree.network_connectors
        assert not tree.broker.accept_tree_children and tree.logging.message_events
        mesh = site_config(sc.mode("mesh-ttl2"), store, parent_uri="tcp://127.0.0.1:1")
        (nc,) = mesh.network_connectors
        assert (nc.name, nc.network_ttl, nc.consumer_ttl, nc.duplex) == ("uplink", 2, 2, True)
        root = site_config(sc.mode("tree"), hq, parent_uri=None)
        assert root.tree_connector is None and root.broker.accept_tree_children

    def test_procs_refuses_big_estates(self) -> None:
        """The procs engine refuses estates beyond MAX_BROKERS before starting anything."""
        sc = load_scenario(SCENARIOS / "retail-4x250.toml")
        plan = build_plan(sc)
        with pytest.raises(ValueError, match="at most"):
            engine_class("procs")(plan, sc.modes[0], Recorder(plan))
