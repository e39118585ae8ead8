"""Run recording: every event of a run goes through one Recorder, which writes it and
tallies what the summary needs.

Theory of operation
-------------------
Engines differ in how brokers run (a synchronous loop, trio tasks, processes) but all of
them hand each event to ``Recorder.emit(ts, broker, event, fields)``.  The recorder
writes the line (``log.EventWriter``) and keeps only counters and per-message facts, so
every engine's summary is computed by the same code from the same events -- which is what
makes "identical counts across engines" a meaningful test.

Message facts come from the log alone (a procs run has nothing else): ``message.produced``
and ``message.forwarded`` move a queue message's *holder* to the producing broker or the
forward's peer; ``message.delivered`` records ``(broker, subscription)``; a drop (other
than a duplicate) ends it.  At ``finish`` a queue message that was neither delivered nor
dropped is **stranded** at its holder -- one ``message.stranded`` line each -- unless its
holder was killed while holding it and it was not persistent (then it is *lost*:
``Recorder.killed`` is told by the engine).  Deliveries are then judged against the
plan's expectations (workload.py): ``delivered`` counts expected deliveries that
happened, ``duplicates`` deliveries beyond one per expected unit, ``unexpected``
deliveries to consumers the plan did not expect.

The accounting closes per delivery unit (a queue message is one unit, a topic message one
per expected subscriber): ``expected = delivered + stranded + dropped + lost``.  An
undelivered queue message is *stranded* (waiting at its holder, one ``message.stranded``
line), or *dropped* with the reason of its ``message.dropped`` line, or with reason
``broker_killed`` when it was non-persistent at a broker that was killed.  A topic
message's undelivered units are dropped with the reason of its drop line (``no_route``:
a broker on its path knew no subscriber).  ``lost`` is what none of these explains --
it must be 0, and the report refuses a run where it is not.
"""

from __future__ import annotations

from typing import Any

from treefed.scenario.workload import Plan

__all__ = ["Recorder", "subscription_of", "KILLED"]

#: ``dropped_by_reason`` key of non-persistent messages held by a broker that was killed.
KILLED = "broker_killed"


def subscription_of(consumer: str) -> str:
    """The subscription id of a global consumer id ``<broker>/<conn>/<sub>``."""
    return consumer.rpartition("/")[2]


class Recorder:
    """Writes and tallies the events of one run (see the module docstring)."""

    __slots__ = ("plan", "writer", "counts", "adds_sent", "adds_received", "removes_sent",
                 "deliveries", "holder", "done", "lost", "_handlers", "_write", "_write_logs",
                 "last_ts", "drops")

    def __init__(self, plan: Plan, writer: Any | None = None) -> None:
        self.plan = plan
        self.writer = writer
        self._write = writer.write if writer is not None else None
        # a writer without the batch call gets the lines one by one
        self._write_logs = getattr(writer, "write_logs", None) if writer is not None else None
        self.counts: dict[str, int] = {}
        self.adds_sent = 0
        self.adds_received = 0
        self.removes_sent = 0
        self.deliveries: dict[str, list[tuple[str, str]]] = {}  # msg -> [(broker, sub)]
        self.holder: dict[str, str] = {}   # queue msg -> broker believed to hold it
        self.done: set[str] = set()        # queue msgs delivered or dropped
        self.lost: set[str] = set()        # held by a broker when it was killed
        self.drops: dict[str, str] = {}    # msg -> reason of its first (non-duplicate) drop
        self.last_ts = 0.0
        self._handlers = {
            "advisory.sent": self._advisory_sent,
            "advisory.received": self._advisory_received,
            "message.produced": self._produced,
            "message.forwarded": self._forwarded,
            "message.delivered": self._delivered,
            "message.dropped": self._dropped,
        }

    # -- the hot path ------------------------------------------------------------
    def emit(self, ts: float, broker: str, event: str, fields: dict) -> None:
        """One event: written, then counted."""
        if self._write is not None:
            self._write(ts, broker, event, fields)
        counts = self.counts
        counts[event] = counts.get(event, 0) + 1
        handler = self._handlers.get(event)
        if handler is not None:
            handler(broker, fields)

    def emit_logs(self, ts: float, broker: str, logs: list) -> None:
        """The ``Log`` actions of one site step, in order: ``emit`` for each, with
        the per-event calls batched (the replay engine's hot path)."""
        if self._write_logs is not None:
            self._write_logs(ts, broker, logs)
        elif self._write is not None:
            write = self._write
            for a in logs:
                write(ts, broker, a.event, a.fields)
        counts = self.counts
        handlers = self._handlers
        sent = removed = received = 0   # the advisory handlers, inlined (most events)
        for a in logs:
            event = a.event
            try:
                counts[event] += 1
            except KeyError:
                counts[event] = 1
            if event == "advisory.sent":
                if a.fields["kind"] == "add":
                    sent += 1
                else:
                    removed += 1
            elif event == "advisory.received":
                if a.fields["kind"] == "add":
                    received += 1
            else:
                handler = handlers.get(event)
                if handler is not None:
                    handler(broker, a.fields)
        if sent:
            self.adds_sent += sent
        if removed:
            self.removes_sent += removed
        if received:
            self.adds_received += received

    def _advisory_sent(self, broker: str, f: dict) -> None:
        if f["kind"] == "add":
            self.adds_sent += 1
        else:
            self.removes_sent += 1

    def _advisory_received(self, broker: str, f: dict) -> None:
        if f["kind"] == "add":
            self.adds_received += 1

    def _produced(self, broker: str, f: dict) -> None:
        if f["dst"].startswith("queue://"):
            self.holder[f["msg"]] = broker

    def _forwarded(self, broker: str, f: dict) -> None:
        msg = f["msg"]
        if msg not in self.done and f["dst"].startswith("queue://"):
            self.holder[msg] = f["peer"]
            if self.lost:  # re-sent by a survivor after the broker that had it died
                self.lost.discard(msg)

    def _delivered(self, broker: str, f: dict) -> None:
        msg = f["msg"]
        self.deliveries.setdefault(msg, []).append((broker, subscription_of(f["consumer"])))
        self.done.add(msg)

    def _dropped(self, broker: str, f: dict) -> None:
        reason = f.get("reason")
        if reason != "duplicate":
            self.done.add(f["msg"])
            self.drops.setdefault(f["msg"], str(reason))

    # -- engine notices ----------------------------------------------------------
    def killed(self, broker: str) -> None:
        """``broker`` died: the non-persistent queue messages it held are gone."""
        messages = self.plan.messages
        for msg, where in self.holder.items():
            if where == broker and msg not in self.done:
                planned = messages.get(msg)
                if planned is None or not planned.persistent:
                    self.lost.add(msg)

    def restarted(self, broker: str) -> None:
        """Nothing to forget: a restarted broker restores only what was persistent."""

    # -- the end -----------------------------------------------------------------
    def finish(self, ts: float) -> dict[str, Any]:
        """Write ``message.stranded`` lines and return the run's figures (JSON-able)."""
        stranded = 0
        for msg, where in self.holder.items():
            if msg in self.done or msg in self.lost:
                continue
            planned = self.plan.messages.get(msg)
            dst = planned.dst if planned is not None else ""
            self.emit(ts, where, "message.stranded", {"msg": msg, "dst": dst})
            stranded += 1

        expected = delivered = duplicates = unexpected = 0
        by_kind: dict[str, dict[str, int]] = {}
        stranded_ids = {m for m, _ in self.holder.items()
                        if m not in self.done and m not in self.lost}
        dropped: dict[str, int] = {}
        for msg in self.plan.messages.values():
            got = self.deliveries.get(msg.id, ())
            units = msg.units
            ok = 0
            if msg.fanout:
                want = set(msg.expected)
                seen: set[tuple[str, str]] = set()
                for key in got:
                    if key not in want:
                        unexpected += 1
                    elif key in seen:
                        duplicates += 1
                    else:
                        seen.add(key)
                ok = len(seen)
            elif got:
                want = set(msg.expected)
                hits = sum(1 for key in got if key in want)
                unexpected += len(got) - hits
                ok = 1 if hits else 0
                duplicates += max(0, hits - 1)
            expected += units
            delivered += ok
            short = units - ok
            if short:   # where the undelivered units went (see ``accounting``)
                if msg.id in stranded_ids:
                    reason = None if msg.fanout else "stranded"
                elif msg.id in self.lost:
                    reason = KILLED
                else:
                    reason = self.drops.get(msg.id)
                if reason is not None and reason != "stranded":
                    dropped[reason] = dropped.get(reason, 0) + short
            k = by_kind.setdefault(msg.kind, {"messages": 0, "expected": 0, "delivered": 0})
            k["messages"] += 1
            k["expected"] += units
            k["delivered"] += ok

        c = self.counts
        return dict(
            advisory_frames=self.adds_sent,
            advisory_receipts=self.adds_received,
            advisory_removals=self.removes_sent,
            advisories_dropped=c.get("advisory.dropped", 0),
            demand_created=c.get("demand.created", 0),
            demand_removed=c.get("demand.removed", 0),
            messages=len(self.plan.messages),
            produced=c.get("message.produced", 0),
            forwarded=c.get("message.forwarded", 0),
            expected=expected,
            delivered=delivered,
            duplicates=duplicates,
            unexpected=unexpected,
            missing=expected - delivered,
            stranded=stranded,
            dropped=sum(dropped.values()),
            dropped_by_reason=dict(sorted(dropped.items())),
            lost=expected - delivered - stranded - sum(dropped.values()),
            by_kind=by_kind,
            events=sum(c.values()),
        )

    def delivery_map(self) -> dict[str, list[tuple[str, str]]]:
        """msg id -> sorted deliveries: what a cross-engine comparison looks at."""
        return {m: sorted(v) for m, v in sorted(self.deliveries.items())}
