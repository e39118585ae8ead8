"""Where messages go: delivered or stranded, per sender -> destination, from modelled demand.

Theory of operation
-------------------
``exact.propagate(..., held=[...])`` lists the demand every broker's core holds once
interest has settled (first convergence): per accepted, active instance the broker, the
link end it came over, its group, its demand priority and whether it joined a conduit.
This module turns that list into the consumers each broker's core would hold -- local
consumers, one network consumer per conduit (its priority the best of its members', its
place renewed when a member raises it, as ``Bridge._refresh`` re-installs it) or per
non-conduit instance, static consumers of ``statically_included`` destinations, and a
tree child's fallback consumers (``route_unknown_up``) -- and replays the core's dispatch
rules (``core/broker.py``) for one message at a time, in send order:

* queue: the first *eligible* consumer in (priority desc, subscription order), rotated
  within its level once it took a message; a fallback only when no regular consumer is
  eligible.  A network consumer is eligible unless its peer is on the message's path or
  the path is already ``message_ttl`` long.  A local consumer takes it: *delivered*.  A
  network consumer: forwarded to its peer, path + this broker.  None: the message waits
  here -- *stranded at* this broker.
* topic: a copy to every eligible consumer, one per link (the fallback pass too, on a
  link not used yet); a copy arriving over a mesh link where the message was seen before,
  or over a tree link where it was seen with the same path length, is a duplicate; a
  broker where nothing takes it drops it (``no_route``).

Consumer credit is not modelled (every consumer eventually takes what it is given, so a
prefetch limit delays but never re-routes a message of these workloads); selectors are
refused (``NotModelled``) rather than guessed.  The workload is the scenario's own sends
at ``SEND_AT`` on a settled estate; timeline sends and faults are not modelled.

Groups only meet groups of the same destination in the walk (conduits are per
destination, suppression per group), so each batch of destinations is walked with only
the groups that match it, and the ``held`` list never holds the whole estate's demand.
Pure: no I/O.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from treefed.core.destinations import is_topic, is_wildcard, matches
from treefed.model.exact import Counts, Estate, Group, NotModelled, propagate

__all__ = ["Send", "Outcome", "route", "route_batches", "route_plan", "senders",
           "summarise", "MAX_HOPS"]

#: the core refuses a forward whose path is this long (core/broker.py MAX_HOPS)
MAX_HOPS = 64


@dataclass(frozen=True, slots=True)
class Send:
    """One message sent at ``broker`` to ``dst`` (``id``: the plan's message id)."""

    id: str
    broker: str
    dst: str


@dataclass(slots=True)
class Outcome:
    """What became of one message.  Queue: ``delivered_at`` the broker whose local
    consumer took it, else ``stranded_at`` the broker where it waits.  Topic:
    ``deliveries`` (broker, group name) per subscriber reached (a group of n counts n),
    ``dropped_at`` the brokers that dropped a copy for want of a route."""

    send: Send
    delivered_at: str | None = None
    stranded_at: str | None = None
    deliveries: list = field(default_factory=list)
    dropped_at: list = field(default_factory=list)
    path: tuple = ()                       # queue: the brokers it visited, in order
    forwarded_by: set = field(default_factory=set)   # topic: brokers that sent a copy on

    @property
    def delivered(self) -> int:
        if is_topic(self.send.dst):
            return len(self.deliveries)
        return 1 if self.delivered_at is not None else 0


class _Consumer:
    __slots__ = ("pattern", "priority", "seq", "peer", "conn", "ttl", "fallback", "group",
                 "count", "kind")

    def __init__(self, pattern, priority, seq, *, peer=None, conn=None, ttl=-1,
                 fallback=False, group=None, count=1, kind="mesh"):
        self.pattern = pattern
        self.priority = priority
        self.seq = seq
        self.peer = peer          # None: a local consumer
        self.conn = conn          # the link (index) a network consumer sends over
        self.ttl = ttl
        self.fallback = fallback
        self.group = group        # local: the Group
        self.count = count        # local: members of the group (subscribers)
        self.kind = kind          # network: the link's kind (tree links allow revisits)


class _Cores:
    """Every broker's consumers after first convergence, and the dispatch rules."""

    def __init__(self, estate: Estate, groups: Sequence[Group], held: list) -> None:
        self.by_broker: dict[str, list[_Consumer]] = defaultdict(list)
        self._dests: dict[tuple[str, str], list[_Consumer]] = {}
        seq = 0
        for g in groups:   # subscribed before any link is up (replay engine's _start)
            if g.selector is not None:
                raise NotModelled(f"group {g.name}: selectors are not modelled for messages")
            for _ in range(g.count):   # each member its own consumer: round robin
                self.by_broker[g.broker].append(_Consumer(g.dst, 0, seq, group=g))
                seq += 1
        conduits: dict[tuple, _Consumer] = {}
        statics: set = set()
        for r, end, gi, prio, conduit in held:
            g = groups[gi]
            s = end.settings
            ttl = s.message_ttl if end.kind == "mesh" else -1
            if conduit:
                key = (r, end.index, g.dst)
                c = conduits.get(key)
                static = end.kind == "mesh" and end.forwards and s.conduit_subscriptions \
                    and g.dst in s.statically_included
                if static:
                    if key not in statics:
                        statics.add(key)
                        self.by_broker[r].append(_Consumer(
                            g.dst, 0, -1, peer=end.peer, conn=(r, end.index), ttl=ttl))
                    continue
                if c is None:
                    seq += 1
                    c = conduits[key] = _Consumer(g.dst, prio, seq, peer=end.peer,
                                                  conn=(r, end.index), ttl=ttl,
                                                  kind=end.kind)
                    self.by_broker[r].append(c)
                elif prio > c.priority:      # re-installed at the new priority
                    seq += 1
                    c.priority, c.seq = prio, seq
            else:
                for _ in range(g.count):
                    seq += 1
                    self.by_broker[r].append(_Consumer(g.dst, prio, seq, peer=end.peer,
                                                       conn=(r, end.index), ttl=ttl,
                                                       kind=end.kind))
        self._shape_ends(estate)

    def _shape_ends(self, estate: Estate) -> None:
        """Static consumers the walk never met and tree fallbacks, per link end."""
        from treefed.model.exact import _Shape

        shape = _Shape(estate)
        for b, ends in shape.ends.items():
            tree = estate.tree.get(b)
            for end in ends:
                s = end.settings
                if end.kind == "mesh" and end.forwards and s.statically_included:
                    have = {c.pattern for c in self.by_broker[b]
                            if c.conn == (b, end.index) and c.seq == -1}
                    for dst in s.statically_included:
                        if dst not in have:
                            self.by_broker[b].append(_Consumer(
                                dst, 0, -1, peer=end.peer, conn=(b, end.index),
                                ttl=s.message_ttl))
                if end.lane == "parent" and tree is not None and tree.route_unknown_up:
                    for dst in ("queue://>", "topic://>"):
                        self.by_broker[b].append(_Consumer(
                            dst, 0, -1, peer=end.peer, conn=(b, end.index), fallback=True,
                            kind=end.kind))

    def _index(self) -> None:
        """Per broker: consumers by exact pattern, and the wildcard ones apart (a store
        at TTL 2 holds demand for every sibling's queue: no scan of them per message)."""
        self._exact: dict[str, dict[str, list]] = {}
        self._wild: dict[str, list] = {}
        for b, cons in self.by_broker.items():
            exact: dict[str, list] = defaultdict(list)
            wild = []
            for c in cons:
                (wild if is_wildcard(c.pattern) else exact[c.pattern]).append(c)
            self._exact[b], self._wild[b] = exact, wild

    def dest(self, broker: str, dst: str) -> list[_Consumer]:
        key = (broker, dst)
        found = self._dests.get(key)
        if found is None:
            if not hasattr(self, "_exact"):
                self._index()
            mine = list(self._exact.get(broker, {}).get(dst, ()))
            mine += [c for c in self._wild.get(broker, ()) if matches(c.pattern, dst)]
            found = sorted(mine, key=lambda c: (-c.priority, c.seq))
            self._dests[key] = found
        return found

    @staticmethod
    def eligible(c: _Consumer, path: tuple) -> bool:
        if c.peer is None:
            return True
        if c.peer in path:
            return False
        return not (c.ttl >= 0 and len(path) >= c.ttl)

    @staticmethod
    def take(cons: list, i: int) -> None:
        """Consumer ``i`` took a message: to the end of its priority level."""
        c = cons[i]
        j = i + 1
        while j < len(cons) and cons[j].priority == c.priority:
            j += 1
        if j - 1 > i:
            cons.insert(j - 1, cons.pop(i))

    def route_queue(self, send: Send) -> Outcome:
        here, path = send.broker, ()
        while True:
            cons = self.dest(here, send.dst)
            pick = -1
            for fallback_pass in (False, True):
                for i, c in enumerate(cons):
                    if c.fallback is fallback_pass and self.eligible(c, path):
                        pick = i
                        break
                if pick >= 0:
                    break
            if pick < 0:
                return Outcome(send, stranded_at=here, path=path + (here,))
            c = cons[pick]
            self.take(cons, pick)
            if c.peer is None:
                return Outcome(send, delivered_at=here, path=path + (here,))
            path = path + (here,)
            if len(path) >= MAX_HOPS:
                raise NotModelled(f"message {send.id} passes {MAX_HOPS} hops")
            here = c.peer

    def route_topic(self, send: Send) -> Outcome:
        out = Outcome(send)
        seen: set = set()
        todo = deque([(send.broker, (), None)])
        while todo:
            here, path, kind = todo.popleft()
            # the core's duplicate key: over a tree link (revisits allowed) the id and
            # the path length, over a mesh link the id alone; a loop never gets in
            key = (here, len(path)) if kind == "tree" else (here, None)
            if here in path or key in seen:
                continue
            if kind is not None:
                seen.add(key)
            cons = self.dest(here, send.dst)
            links: set = set()
            taken = False
            for fallback_pass in (False, True):
                for c in cons:
                    if c.fallback is not fallback_pass or not self.eligible(c, path):
                        continue
                    taken = True
                    if c.peer is None:
                        out.deliveries += [(here, c.group.name)] * c.count
                        continue
                    if c.conn in links:
                        continue
                    links.add(c.conn)
                    if len(path) + 1 >= MAX_HOPS:
                        raise NotModelled(f"message {send.id} passes {MAX_HOPS} hops")
                    todo.append((c.peer, path + (here,), c.kind))
                    out.forwarded_by.add(here)
            if not taken:
                out.dropped_at.append(here)
        return out


def _merge(into: Counts, part: Counts) -> None:
    for name in ("adds_sent", "adds_received", "dropped", "demand", "interest",
                 "received_by_dst", "demand_by_dst"):
        mine = getattr(into, name)
        for k, v in getattr(part, name).items():
            mine[k] += v


def route(estate: Estate, groups: Sequence[Group], sends: Iterable[Send], *,
          counts: Counts | None = None, origins: dict | None = None) -> list[Outcome]:
    """Each send's outcome, in send order, over the demand ``groups`` create (only the
    groups matching a sent destination are walked; their figures are added to
    ``counts`` when given, their receipts per (broker, dst, origin) to ``origins``)."""
    sends = list(sends)
    held: list = []
    wanted = {s.dst for s in sends}
    mine = [g for g in groups if any(matches(g.dst, d) for d in wanted)]
    found = propagate(estate, mine, held=held, origins=origins)
    if counts is not None:
        _merge(counts, found)
    cores = _Cores(estate, mine, held)
    return [cores.route_topic(s) if is_topic(s.dst) else cores.route_queue(s)
            for s in sends]


def route_batches(plan, mode, *, batch: int = 256, everything: bool = False):
    """``plan``'s workload sends (not its timeline sends) under ``mode`` on the estate
    at the start, ``batch`` destinations at a time: yields ``(outcomes, counts,
    origins)`` per batch -- the batch's groups' figures and receipts per (broker, dst,
    origin) -- so no more than a batch's demand is ever held.  ``everything``: also
    yield the groups no send matches (with no outcomes), so the batches' figures add
    up to the whole first convergence.  A wildcard consumer that matches sent
    destinations makes one batch of all (its interest would be counted twice)."""
    from treefed.model.exact import estate_from_topology, groups_from_consumers

    estate = estate_from_topology(plan.topology, mode)
    groups = groups_from_consumers(plan.consumers)
    sends = [Send(m.id, m.broker, m.dst) for m in plan.messages.values()
             if m.kind != "timeline"]
    order = list(dict.fromkeys(s.dst for s in sends))
    sent = set(order)
    if any(g.dst not in sent and any(matches(g.dst, d) for d in order) for g in groups):
        batch = max(batch, len(order))
    for i in range(0, len(order), batch):
        chunk = set(order[i:i + batch])
        counts, origins = Counts(), {}
        outcomes = route(estate, groups, [s for s in sends if s.dst in chunk],
                         counts=counts, origins=origins)
        yield outcomes, counts, origins
    if everything:
        rest = [g for g in groups if not any(matches(g.dst, d) for d in order)]
        for i in range(0, len(rest), batch * 16):
            origins = {}
            counts = propagate(estate, rest[i:i + batch * 16], origins=origins)
            yield [], counts, origins


def route_plan(plan, mode, *, batch: int = 256) -> list[Outcome]:
    """Every workload send's outcome, in send order (``route_batches``)."""
    outcomes: dict[str, Outcome] = {}
    for part, _counts, _origins in route_batches(plan, mode, batch=batch):
        for o in part:
            outcomes[o.send.id] = o
    return [outcomes[m.id] for m in plan.messages.values() if m.kind != "timeline"]


def senders(outcomes: Sequence[Outcome]) -> dict[str, set]:
    """dst -> brokers that *send to* it (the report's definition): produced a message
    of it, or forwarded one (every broker on a path but the last)."""
    out: dict[str, set] = defaultdict(set)
    for o in outcomes:
        out[o.send.dst].add(o.send.broker)
        if o.path:
            out[o.send.dst].update(o.path[:-1])
        out[o.send.dst].update(o.forwarded_by)
    return out


def summarise(outcomes: Sequence[Outcome], expected: dict[str, int] | None = None) -> dict:
    """Run figures (runs.csv names): expected, delivered, stranded, stranded_at (the
    job's "broker: n, ... +N more brokers" form), dropped (topic units not reached)."""
    delivered = stranded = expected_n = 0
    where: dict[str, int] = defaultdict(int)
    for o in outcomes:
        units = (expected or {}).get(o.send.id)
        if units is None:
            units = o.delivered if is_topic(o.send.dst) else 1
        expected_n += units
        delivered += min(o.delivered, units)
        if o.stranded_at is not None:
            stranded += 1
            where[o.stranded_at] += 1
    top = sorted(where.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{b}: {n}" for b, n in top[:3])
    if len(top) > 3:
        text += f", +{len(top) - 3} more brokers"
    return {"expected": expected_n, "delivered": delivered, "stranded": stranded,
            "dropped": expected_n - delivered - stranded, "stranded_at": text}
