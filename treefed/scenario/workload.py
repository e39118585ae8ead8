"""Workload planning: what a scenario run does, and what *should* come of it.

Theory of operation
-------------------
``build_plan(scenario)`` turns a validated Scenario into a ``Plan`` that every engine
executes the same way: the consumers that exist from the start, then ``Step`` s in time
order (the workload's sends at ``SEND_AT``, after interest has settled, and the
timeline's actions at their ``at``).  Broker globs, ``{broker}`` / ``{region}``
templates, "remove every consumer on this destination" and "re-attach this broker's
consumers after a restart" are all resolved here, so an engine never re-derives them.

Every message carries its **expectation**: what should arrive exactly once if the
federation works, independent of the connector mode (that is the point: tree and mesh
runs are held to the same plan).

* A **queue** message is expected once, at any one of the consumers whose pattern and
  selector match it and which, at some moment at or after the send, is alive (added,
  not removed, its broker running) and connected to the producer (every broker on the
  tree path running, no link on it cut) -- a message sent into a partition waits and is
  delivered when the partition heals.
* A **topic** message is expected once at every matching subscriber alive and connected
  *at the send*: topic subscriptions are not durable, nothing waits for them.
* A send whose producing broker is down at that moment is not planned at all.

Randomness (store-to-store pairs) comes from ``random.Random(scenario.seed)`` alone, so
a plan is a pure function of the scenario.  Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from treefed.core.destinations import is_topic, matches, parse_destination
from treefed.core.selector import compile_selector
from treefed.scenario.spec import (
    BROADCAST_TOPIC, HQ_QUEUE, STORE_QUEUE, Scenario, TimelineEvent, expand_destination,
)
from treefed.scenario.topology import Topology

__all__ = ["SEND_AT", "PlannedConsumer", "PlannedMessage", "Step", "Plan", "build_plan"]

#: Virtual second of the workload's own sends: late enough for interest to have settled
#: everywhere (a hop costs about a millisecond), early enough that timelines at 5 s and
#: later act on a settled estate.
SEND_AT = 1.0


@dataclass(frozen=True, slots=True)
class PlannedConsumer:
    broker: str                   # the site the application is attached to
    sub: str                      # subscription id, unique at that broker
    dst: str                      # canonical destination or pattern
    selector: str | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.broker, self.sub)


@dataclass(frozen=True, slots=True)
class PlannedMessage:
    id: str                       # unique across the run
    broker: str                   # producing site
    dst: str                      # canonical destination
    at: float                     # virtual send time
    kind: str                     # hq_to_store | store_to_hq | store_to_store | broadcast
                                  # | timeline
    expected: tuple[tuple[str, str], ...]  # consumer keys (broker, sub)
    fanout: bool                  # topic: once at *each* expected; queue: once at *one*
    persistent: bool = False
    headers: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def units(self) -> int:
        """Deliveries this message should produce."""
        if not self.expected:
            return 0
        return len(self.expected) if self.fanout else 1


@dataclass(frozen=True, slots=True)
class Step:
    """One action of the run at virtual time ``at``.

    ``action`` is a timeline action (``spec.ACTIONS``) or ``send`` for workload sends.
    cut_link / restore_link / kill_broker: ``targets``.  restart_broker: ``targets`` and
    the ``consumers`` to re-attach there.  add_consumer / remove_consumer: ``consumers``.
    send: ``messages``.  insert_layer: ``targets == (parent,)``, ``layer``, ``count`` and
    ``topology``, the estate after the change.
    """

    at: float
    action: str
    targets: tuple[str, ...] = ()
    consumers: tuple[PlannedConsumer, ...] = ()
    messages: tuple[PlannedMessage, ...] = ()
    layer: str | None = None
    count: int = 0
    topology: Topology | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    scenario: Scenario
    topology: Topology                    # the estate at the start
    final_topology: Topology              # after every insert_layer
    consumers: tuple[PlannedConsumer, ...]  # attached at t = 0
    steps: tuple[Step, ...]               # in execution order
    messages: dict[str, PlannedMessage]   # id -> message, in send order

    @property
    def expected(self) -> int:
        """Deliveries the whole run should produce."""
        return sum(m.units for m in self.messages.values())

    @property
    def end(self) -> float:
        """Virtual time of the last step."""
        return max((s.at for s in self.steps), default=0.0)


# --------------------------------------------------------------------------- state


class _State:
    """The estate as the plan sees it between steps (who runs, what is cut, who consumes)."""

    __slots__ = ("topology", "cut", "killed", "consumers", "by_broker")

    def __init__(self, topology: Topology, consumers: list[PlannedConsumer]) -> None:
        self.topology = topology
        self.cut: set[str] = set()                  # children whose parent link is down
        self.killed: set[str] = set()
        self.consumers: dict[tuple[str, str], PlannedConsumer] = {c.key: c for c in consumers}

    def snapshot(self) -> _Snapshot:
        return _Snapshot(self.topology, frozenset(self.cut), frozenset(self.killed),
                         tuple(self.consumers.values()))


@dataclass(frozen=True, slots=True)
class _Snapshot:
    topology: Topology
    cut: frozenset[str]
    killed: frozenset[str]
    consumers: tuple[PlannedConsumer, ...]

    def connected(self, a: str, b: str) -> bool:
        """Both running and every broker and link on the tree path between them up."""
        if a == b:
            return a not in self.killed
        up_a = self.topology.path_to_root(a)
        up_b = self.topology.path_to_root(b)
        common = set(up_a) & set(up_b)
        for path in (up_a, up_b):
            for broker in path:
                if broker in self.killed:
                    return False
                if broker in common:
                    break
                if broker in self.cut:  # the link from broker to its parent
                    return False
        return True


class _Matcher:
    """Which consumers of a snapshot take a message: exact destinations by dict, the few
    wildcard patterns by scan, selectors compiled once."""

    __slots__ = ("exact", "wild", "selectors")

    def __init__(self, consumers: tuple[PlannedConsumer, ...],
                 selectors: dict[str, object]) -> None:
        self.exact: dict[str, list[PlannedConsumer]] = {}
        self.wild: list[PlannedConsumer] = []
        self.selectors = selectors
        for c in consumers:
            if "*" in c.dst or ">" in c.dst:
                self.wild.append(c)
            else:
                self.exact.setdefault(c.dst, []).append(c)

    def __call__(self, dst: str, headers: dict) -> list[PlannedConsumer]:
        out = [c for c in self.exact.get(dst, ()) if self._selects(c, headers)]
        out += [c for c in self.wild if matches(c.dst, dst) and self._selects(c, headers)]
        return out

    def _selects(self, c: PlannedConsumer, headers: dict) -> bool:
        if c.selector is None:
            return True
        sel = self.selectors.get(c.selector)
        if sel is None:
            sel = self.selectors[c.selector] = compile_selector(c.selector)
        return sel.matches(headers)


# --------------------------------------------------------------------------- planning


def build_plan(scenario: Scenario) -> Plan:
    """The run every engine performs for ``scenario`` (see the module docstring)."""
    topology = scenario.build_topology()
    w = scenario.workload
    rng = random.Random(scenario.seed)

    consumers: list[PlannedConsumer] = []
    for b in topology.brokers:
        if b.kind == "store":
            if w.store_queue_consumers:
                consumers.append(PlannedConsumer(b.id, "store-queue",
                                                 STORE_QUEUE.format(broker=b.id)))
            if w.store_topic_subscribers:
                consumers.append(PlannedConsumer(b.id, "store-topic", BROADCAST_TOPIC))
        elif b.kind == "hq":
            for i, t in enumerate(w.hq_consumers):
                consumers.append(PlannedConsumer(b.id, f"hq-{i}", _canon(t, b)))
        elif b.kind == "region":
            for i, t in enumerate(w.region_consumers):
                consumers.append(PlannedConsumer(b.id, f"region-{i}", _canon(t, b)))

    # Raw sends first (ids in a fixed order), expectations once every step is known.
    counter = iter(range(1, 1 << 62))
    sends: list[tuple[str, str, str, str, bool]] = []  # (id, broker, dst, kind, persistent)

    def new_id() -> str:
        return f"m{next(counter)}"

    hq = topology.root.id
    stores = [b.id for b in topology.of_kind("store")]
    for _ in range(w.hq_to_stores):
        for s in stores:
            sends.append((new_id(), hq, STORE_QUEUE.format(broker=s), "hq_to_store",
                          w.persistent))
    for _ in range(w.stores_to_hq):
        for s in stores:
            sends.append((new_id(), s, HQ_QUEUE, "store_to_hq", w.persistent))
    for _ in range(w.store_to_store):
        src, dst = rng.sample(stores, 2)
        sends.append((new_id(), src, STORE_QUEUE.format(broker=dst), "store_to_store",
                      w.persistent))
    for _ in range(w.topic_broadcasts):
        sends.append((new_id(), hq, BROADCAST_TOPIC, "broadcast", w.persistent))

    raw_steps: list[tuple[float, str, dict]] = []
    if sends:
        raw_steps.append((SEND_AT, "send", {"sends": sends}))
    # Timeline events keep file order among equal times; workload sends go before a
    # timeline event at exactly SEND_AT (a stable sort keeps that).
    state = _State(topology, consumers)
    timeline = sorted(enumerate(scenario.timeline), key=lambda p: p[1].at)
    merged = sorted(raw_steps + [(ev.at, ev.action, {"event": ev, "index": i})
                                 for i, ev in timeline], key=lambda s: s[0])

    steps: list[tuple[Step, _Snapshot]] = []
    for at, action, info in merged:
        if action == "send" and "sends" in info:
            snap = state.snapshot()
            live = [s for s in info["sends"] if s[1] not in state.killed]
            steps.append((Step(at, "send", messages=tuple(_raw(at, s) for s in live)), snap))
            continue
        step = _timeline_step(info["event"], state, new_id, w.persistent)
        steps.append((step, state.snapshot()))

    messages = _expectations(steps)
    final = [s for s, _ in steps]
    final_steps = [_with_messages(s, messages) for s in final]
    return Plan(scenario, topology, state.topology, tuple(consumers), tuple(final_steps),
                messages)


def _canon(template: str, broker) -> str:
    return parse_destination(expand_destination(template, broker), allow_wildcards=True)


def _raw(at: float, send: tuple) -> PlannedMessage:
    msg_id, broker, dst, kind, persistent = send
    return PlannedMessage(msg_id, broker, dst, at, kind, (), is_topic(dst), persistent,
                          {"kind": kind})


def _timeline_step(ev: TimelineEvent, state: _State, new_id, persistent: bool) -> Step:
    action = ev.action
    topo = state.topology
    if action == "insert_layer":
        parent = ev.target or topo.root.id
        state.topology = topo.insert_layer(ev.name, ev.count, parent=parent)
        return Step(ev.at, action, (parent,), layer=ev.name, count=ev.count,
                    topology=state.topology)
    targets = tuple(topo.match(ev.target))
    if action == "cut_link":
        state.cut.update(targets)
        return Step(ev.at, action, targets)
    if action == "restore_link":
        state.cut.difference_update(targets)
        return Step(ev.at, action, targets)
    if action == "kill_broker":
        state.killed.update(targets)
        return Step(ev.at, action, targets)
    if action == "restart_broker":
        state.killed.difference_update(targets)
        mine = set(targets)
        back = tuple(c for c in state.consumers.values() if c.broker in mine)
        return Step(ev.at, action, targets, consumers=back)
    if action == "add_consumer":
        added = []
        for t in targets:
            c = PlannedConsumer(t, ev.consumer, _canon(ev.dst, topo.broker(t)), ev.selector)
            state.consumers[c.key] = c
            added.append(c)
        return Step(ev.at, action, targets, consumers=tuple(added))
    if action == "remove_consumer":
        gone = []
        for t in targets:
            if ev.consumer is not None:
                c = state.consumers.pop((t, ev.consumer), None)
                if c is not None:
                    gone.append(c)
            else:
                dst = _canon(ev.dst, topo.broker(t))
                for key in [k for k, c in state.consumers.items()
                            if c.broker == t and c.dst == dst]:
                    gone.append(state.consumers.pop(key))
        return Step(ev.at, action, targets, consumers=tuple(gone))
    if action == "send":
        sends = []
        for t in targets:
            if t in state.killed:
                continue
            dst = parse_destination(expand_destination(ev.dst, topo.broker(t)))
            for _ in range(ev.count):
                sends.append(_raw(ev.at, (new_id(), t, dst, "timeline",
                                          ev.persistent or persistent)))
        return Step(ev.at, action, targets, messages=tuple(sends))
    raise ValueError(f"unknown timeline action {action!r}")  # spec.py validated it


def _expectations(steps: list[tuple[Step, _Snapshot]]) -> dict[str, PlannedMessage]:
    """Fill in ``expected`` for every planned message (rules in the module docstring)."""
    selectors: dict[str, object] = {}
    matchers: list[_Matcher | None] = [None] * len(steps)
    out: dict[str, PlannedMessage] = {}
    for i, (step, snap) in enumerate(steps):
        for msg in step.messages:
            # the snapshot before a send step is the state the send sees; a queue message
            # may also be taken by any later state of the estate
            later = range(i, len(steps)) if not msg.fanout else range(i, i + 1)
            seen: dict[tuple[str, str], None] = {}
            for j in later:
                if matchers[j] is None:
                    matchers[j] = _Matcher(steps[j][1].consumers, selectors)
                snap_j = steps[j][1]
                for c in matchers[j](msg.dst, msg.headers):
                    if c.key not in seen and snap_j.connected(msg.broker, c.broker):
                        seen[c.key] = None
            out[msg.id] = PlannedMessage(msg.id, msg.broker, msg.dst, msg.at, msg.kind,
                                         tuple(seen), msg.fanout, msg.persistent, msg.headers)
    return out


def _with_messages(step: Step, messages: dict[str, PlannedMessage]) -> Step:
    if not step.messages:
        return step
    return Step(step.at, step.action, step.targets, step.consumers,
                tuple(messages[m.id] for m in step.messages), step.layer, step.count,
                step.topology)
