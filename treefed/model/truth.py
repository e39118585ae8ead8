"""Ground truth for the model: per-broker counts read off a replay-engine run.

``replay_counts(plan, mode)`` runs the scenario's estate in the replay engine with the
plan's consumers attached at t = 0 and nothing else (no timeline, no messages) and
tallies the events the model predicts, per broker, from the engine's own event stream.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from treefed.model.exact import Counts

__all__ = ["steady_plan", "replay_counts", "sends_plan", "replay_messages"]


class _Tally:
    """An event writer that only counts what the model predicts."""

    def __init__(self) -> None:
        self.counts = Counts()

    def write(self, ts: float, broker: str, event: str, fields: Any) -> None:
        c = self.counts
        if event == "advisory.sent":
            if fields["kind"] == "add":
                c.adds_sent[broker] += 1
        elif event == "advisory.received":
            if fields["kind"] == "add":
                c.adds_received[broker] += 1
                c.received_by_dst[broker, fields["dst"]] += 1
        elif event == "advisory.dropped":
            c.dropped[broker, fields["reason"]] += 1
        elif event == "demand.created":
            c.demand[broker] += 1
            c.demand_by_dst[broker, fields["dst"]] += 1

    def write_logs(self, ts: float, broker: str, logs: list) -> None:
        for a in logs:
            self.write(ts, broker, a.event, a.fields)


def steady_plan(plan):
    """``plan`` with its timeline and messages removed: the estate's first convergence."""
    return dataclasses.replace(plan, steps=(), messages={})


def replay_counts(plan, mode) -> Counts:
    """Per-broker counts of a replay run of ``steady_plan(plan)`` under ``mode``."""
    from treefed.scenario.engines.replay import ReplayEngine
    from treefed.scenario.results import Recorder

    steady = steady_plan(plan)
    tally = _Tally()
    engine = ReplayEngine(steady, mode, Recorder(steady, tally))
    engine.run()
    counts = tally.counts
    # interest entries held at the end: local consumers + accepted active instances
    for node in engine.nodes.values():
        if node.site is not None:
            n = len(node.site._active)
            if n:
                counts.interest[node.id] = n
    return counts


def sends_plan(plan):
    """``plan`` with only its workload sends (at ``SEND_AT``, on the settled estate):
    no faults, no timeline sends -- what ``messages.route_plan`` models."""
    steps, messages = [], {}
    for step in plan.steps:
        if step.action != "send":
            continue
        kept = tuple(m for m in step.messages if m.kind != "timeline")
        if kept:
            steps.append(dataclasses.replace(step, messages=kept))
            messages.update((m.id, plan.messages[m.id]) for m in kept)
    return dataclasses.replace(plan, steps=tuple(steps), messages=messages)


def replay_messages(plan, mode) -> dict[str, dict]:
    """Per workload message of a replay run of ``sends_plan(plan)``: ``delivered``
    (expected units delivered), ``delivered_at`` (queue: the broker of the consumer that
    took it), ``stranded_at`` (queue: where it waits) and the run's summary figures
    under the key ``None``."""
    from treefed.scenario.engines.replay import ReplayEngine
    from treefed.scenario.results import Recorder

    sends = sends_plan(plan)
    rec = Recorder(sends, None)
    engine = ReplayEngine(sends, mode, rec)
    summary = engine.run()
    out: dict = {None: summary}
    for msg in sends.messages.values():
        got = rec.deliveries.get(msg.id, [])
        want = set(msg.expected)
        hits = {k for k in got if k in want}
        stranded = rec.holder.get(msg.id) if not msg.fanout and msg.id not in rec.done \
            else None
        out[msg.id] = {"delivered": len(hits) if msg.fanout else min(1, len(hits)),
                       "delivered_at": got[0][0] if got and not msg.fanout else None,
                       "stranded_at": stranded, "units": msg.units}
    return out
