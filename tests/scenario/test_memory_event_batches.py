"""The in-process engines' event path (issue #14, in-process estate): a node hands the
Recorder the Log actions of one step in one call (``BrokerNode(event_logs=...)`` ->
``Recorder.emit_logs``), not one ``_log_event`` -> sink -> ``emit`` -> ``write`` chain per
event; refused advisories keep their place among the other lines and message ids are
named as the producer knows them.  Counts, not timings."""

from __future__ import annotations

from pathlib import Path

import trio

from treefed.core.actions import Drop, Log
from treefed.node import BrokerNode
from treefed.node.node import _client_ids, _client_log
from treefed.scenario.engines.memory import MemoryEngine
from treefed.scenario.results import Recorder
from treefed.scenario.spec import load_scenario
from treefed.scenario.workload import build_plan
from treefed.wire.ids import SCOPE_SEP

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


class _Lines:
    """A writer with the batch call, as the runner's ``EventWriter``; keeps the lines."""

    def __init__(self) -> None:
        self.lines: list[tuple] = []
        self.batches = 0

    def write(self, ts, broker, event, fields=None) -> None:
        self.lines.append((broker, event, dict(fields or {})))

    def write_logs(self, ts, broker, logs) -> None:
        self.batches += 1
        self.lines.extend((broker, a.event, dict(a.fields)) for a in logs)


class _Counting(Recorder):
    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.single = 0

    def emit(self, ts, broker, event, fields) -> None:
        self.single += 1
        super().emit(ts, broker, event, fields)


def _run(name: str = "retail-small") -> tuple[_Counting, _Lines, dict, int]:
    sc = load_scenario(SCENARIOS / f"{name}.toml")
    plan = build_plan(sc)
    lines = _Lines()
    rec = _Counting(plan, lines)
    figures = MemoryEngine(plan, sc.mode("tree"), rec).run()["outcome"]
    return rec, lines, figures, len(plan.topology.brokers)


def test_a_node_hands_the_recorder_its_lines_per_step() -> None:
    """At retail-small every node event arrives through ``emit_logs`` (several per
    call); the per-event ``emit`` is left to the runner's own lines (run.started,
    broker.info per site, run.finished) -- before, every one of the ~330 lines was an
    ``emit`` call of its own."""
    rec, lines, figures, brokers = _run()
    assert figures["delivered"] == figures["expected"] > 0
    assert figures["stranded"] == 0
    events = sum(rec.counts.values())
    assert rec.single <= brokers + 2, (rec.single, events)
    node_events = events - rec.single
    assert lines.batches < node_events / 2, (lines.batches, node_events)
    assert len(lines.lines) == events


def test_message_events_name_the_producers_ids() -> None:
    """The batched lines carry message ids without the broker's producer scope (as
    ``_client_ids`` names them on the per-event path)."""
    rec, lines, figures, _ = _run()
    msgs = [f["msg"] for _, event, f in lines.lines if event.startswith("message.")]
    assert msgs and not [m for m in msgs if SCOPE_SEP in m]
    assert rec.counts.get("message.delivered") == figures["delivered"]


def test_client_log_unscopes_only_a_scoped_message() -> None:
    plain = Log("message.produced", {"msg": "m-1", "dst": "queue://a"})
    assert _client_log(plain) is plain
    assert plain.fields == {"msg": "m-1", "dst": "queue://a"}
    scoped = Log("message.produced", {"msg": f"m-1{SCOPE_SEP}3", "dst": "queue://a"})
    got = _client_log(scoped)
    assert got.fields == {"msg": "m-1", "dst": "queue://a"} == {**_client_ids(
        {"msg": f"m-1{SCOPE_SEP}3", "dst": "queue://a"})}   # as the per-event path


def test_a_refused_advisory_keeps_its_place_among_the_lines() -> None:
    """``_perform`` with ``event_logs``: one call for the step, a Drop rendered as its
    ``advisory.dropped`` Log in order; no per-event sink call."""
    from treefed.config import parse_config

    batches: list = []
    single: list = []
    node = BrokerNode(parse_config({"broker": {"id": "b1"}}),
                      event_sink=lambda event, fields: single.append(event),
                      event_logs=batches.append)
    drop = Drop("malformed", "tree", "b2", "b2/c1/s", "queue://q", "b2")
    actions = [Log("consumer.added", {"consumer": "x", "dst": "queue://q"}), drop,
               Log("message.produced", {"msg": f"m-7{SCOPE_SEP}1", "dst": "queue://q"})]

    async def main() -> None:
        await node._perform(actions, 0.0)

    trio.run(main)
    assert single == []
    assert len(batches) == 1
    (logs,) = batches
    assert [a.event for a in logs] == ["consumer.added", "advisory.dropped",
                                       "message.produced"]
    assert logs[1].fields == drop.fields()
    assert logs[2].fields["msg"] == "m-7"
