"""The exact propagation model: where consumer interest goes, computed without brokers.

Theory of operation
-------------------
The federation layer (``federation/site.py``, ``bridge.py`` and the two policies) decides
for every advisory whether it is sent, received, refused (and why) and which demand it
creates.  This module restates those rules as a plain graph walk over an estate
description (``Estate``: brokers, links with their connector settings, each broker's
tree position) and a workload reduced to *consumer groups* (``Group``: ``count``
consumers of one destination at one broker, alike in every way the rules look at).  It
needs no core Broker, no frames and no clock, so it is the model the Spark job
(``model/spark.py``) is checked against, and it is itself checked against the replay
engine and the in-process ``federation.testing.Estate`` (tests/model).

The walk is the replay order: one FIFO of frames, a broker's frames emitted in the
order ``Site._advertise`` emits them (lanes in ROUTES order, links in link order).  A
group of ``count`` consumers travels as one instance whose every figure is multiplied by
``count`` -- except conduit demand, which is one per (broker, link, destination)
whatever the number of members, and is therefore kept as a set of keys.

What the model does not cover, and says so rather than guessing:

* ``max_demand_per_link``: which advisories hit the cap depends on the interleaving of
  groups; the walk raises ``NotModelled`` when a link would exceed it.
* a duplicate that displaces an earlier instance (only possible when a longer route is
  heard before a shorter one, which a FIFO walk with equal link latencies never does)
  raises ``NotModelled`` too.

Counted per broker (``Counts``), with the event names of ``events.py``: add frames sent
(``advisory.sent``), add frames received (``advisory.received``), refusals by reason
(``advisory.dropped``, logged where the refusal happens: the sender for a duplex link's
ttl/loop checks, the receiver otherwise), demand created (``demand.created``) and the
interest entries held (local consumers and accepted instances that are active).
Per (broker, destination) the same receipts and demand, which is what spillage is
computed from.  Pure: no I/O.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from treefed.core.destinations import is_temp, is_topic, matches
from treefed.federation.settings import LinkSettings, TreeSettings

__all__ = ["Link", "Estate", "Group", "Counts", "NotModelled", "propagate",
           "estate_from_topology", "groups_from_consumers"]


class NotModelled(ValueError):
    """The estate or workload needs a rule the exact model does not reproduce."""


@dataclass(frozen=True, slots=True)
class Link:
    """A connector: ``dialer`` opened it towards ``acceptor`` with ``settings`` (the
    dialing side's settings rule the link, DESIGN §4.1)."""

    dialer: str
    acceptor: str
    settings: LinkSettings


@dataclass(frozen=True, slots=True)
class Estate:
    """Brokers and links; ``tree[b]`` is a broker's TreeSettings (None: root or mesh),
    ``accepts_children`` the brokers that take tree children."""

    brokers: tuple[str, ...]
    links: tuple[Link, ...]
    tree: dict = field(default_factory=dict, hash=False)
    accepts_children: frozenset = frozenset()

    def __post_init__(self) -> None:
        known = set(self.brokers)
        if len(known) != len(self.brokers):
            raise ValueError("broker ids must be unique")
        for link in self.links:
            if link.dialer not in known or link.acceptor not in known:
                raise ValueError(f"link {link.dialer}->{link.acceptor} names an unknown "
                                 "broker")
            if link.dialer == link.acceptor:
                raise ValueError(f"link {link.dialer}->{link.acceptor} loops to itself")


@dataclass(frozen=True, slots=True)
class Group:
    """``count`` alike consumers of ``dst`` attached at ``broker``."""

    broker: str
    dst: str
    count: int = 1
    selector: str | None = None
    name: str = ""


@dataclass(slots=True)
class Counts:
    """What the walk found, per broker (and per broker and destination)."""

    adds_sent: dict = field(default_factory=lambda: defaultdict(int))
    adds_received: dict = field(default_factory=lambda: defaultdict(int))
    dropped: dict = field(default_factory=lambda: defaultdict(int))   # (broker, reason)
    demand: dict = field(default_factory=lambda: defaultdict(int))
    interest: dict = field(default_factory=lambda: defaultdict(int))
    received_by_dst: dict = field(default_factory=lambda: defaultdict(int))  # (b, dst)
    demand_by_dst: dict = field(default_factory=lambda: defaultdict(int))    # (b, dst)

    def per_broker(self, brokers: Iterable[str]) -> dict[str, dict[str, int]]:
        """One plain row per broker (zeros included), for comparison and output."""
        rows = {}
        for b in brokers:
            row = {"adds_sent": self.adds_sent.get(b, 0),
                   "adds_received": self.adds_received.get(b, 0),
                   "demand": self.demand.get(b, 0),
                   "interest": self.interest.get(b, 0)}
            rows[b] = row
        for (b, reason), n in self.dropped.items():
            if b in rows and n:
                rows[b][f"dropped_{reason}"] = n
        return rows


# -- the estate as the federation layer sees it -----------------------------------------

#: where interest came from -> lanes it is offered to (mesh ROUTES + tree ROUTES).
_ROUTES = {
    "local": ("mesh", "parent", "child"),
    "mesh": ("mesh", "parent", "child"),
    "parent": ("mesh", "child"),
    "child": ("mesh", "parent"),
}


def _down(s: LinkSettings) -> tuple[str, ...]:
    """Destination prefixes a child hears of from above (Bridge.down)."""
    kinds = getattr(s, "advertise_down", None)
    if kinds is None:
        return ("queue://", "topic://", "temp-queue://", "temp-topic://")
    return tuple(f"{k}://" for k in kinds) + ("temp-queue://", "temp-topic://")


class _End:
    """One side of a link as ``Site.link_up`` sets it up."""

    __slots__ = ("broker", "peer", "settings", "kind", "lane", "forwards", "accepts",
                 "advertises", "index", "remote")

    def __init__(self, broker: str, peer: str, settings: LinkSettings, lane: str,
                 forwards: bool, accepts: bool, advertises: bool, index: int) -> None:
        self.broker = broker
        self.peer = peer
        self.settings = settings
        self.kind = settings.kind
        self.lane = lane
        self.forwards = forwards
        self.accepts = accepts
        self.advertises = advertises
        self.index = index        # link order: the order bridges were brought up
        self.remote = 0           # consumer instances accepted over this end

    # mesh offer (sending side), DESIGN §4.1 / MeshPolicy.offer
    def offer(self, origin: str, dst: str, path: tuple) -> str | None:
        s = self.settings
        if self.kind != "mesh":
            # a tree parent sends interest down only in the kinds the child asked for
            # (LinkSettings.advertise_down; temporary destinations always go down)
            if self.lane == "child" and not dst.startswith(_down(s)):
                return ""
            return None
        if s.dynamically_included and not is_temp(dst) and dst not in s.statically_included \
                and not any(matches(p, dst) for p in s.dynamically_included):
            return ""
        if s.duplex:
            if s.consumer_ttl != -1 and len(path) >= s.consumer_ttl:
                return "ttl"
            if self.peer == origin or self.peer in path:
                return "loop"
        return None

    def permit(self, dst: str) -> str | None:
        s = self.settings
        if is_temp(dst):
            return None if s.bridge_temp_destinations else "filter"
        if any(matches(p, dst) for p in s.excluded):
            return "filter"
        if dst in s.statically_included:
            return None
        if s.dynamically_included:
            return None if any(matches(p, dst) for p in s.dynamically_included) \
                else "filter"
        return None

    def conduit(self, dst: str, hops: int) -> bool:
        if self.kind == "tree":
            return True
        return self.settings.conduit_subscriptions and (hops == 1 or is_topic(dst))

    def demand_priority(self, hops: int) -> int:
        if self.kind == "tree":
            return -hops
        if not self.settings.decrease_network_consumer_priority:
            return 0
        return -5 if hops <= 1 else -5 - (hops + 1)

    def suppresses(self, dst: str) -> bool:
        if self.kind == "tree":
            return False
        s = self.settings
        return s.suppress_duplicate_topic_subscriptions if is_topic(dst) \
            else s.suppress_duplicate_queue_subscriptions


class _Shape:
    """The estate's link ends, ancestry and subtrees, computed once."""

    def __init__(self, estate: Estate) -> None:
        self.ends: dict[str, list[_End]] = {b: [] for b in estate.brokers}
        parent: dict[str, str] = {}
        for i, link in enumerate(estate.links):
            s = link.settings
            if s.kind == "tree":
                if link.dialer in parent:
                    raise NotModelled(f"{link.dialer} has two tree parents")
                parent[link.dialer] = link.acceptor
                down = _End(link.dialer, link.acceptor, s, "parent", True, True, True, i)
                up = _End(link.acceptor, link.dialer, s, "child", True, True, True, i)
            else:
                duplex, static = s.duplex, s.static_bridge
                down = _End(link.dialer, link.acceptor, s, "mesh", True, not static,
                            duplex and not static, i)
                up = _End(link.acceptor, link.dialer, s, "mesh", duplex,
                          duplex and not static, not static, i)
            self.ends[link.dialer].append(down)
            self.ends[link.acceptor].append(up)
        # the two ends of link i are the i-th pair appended above
        self.peer_end: dict[int, _End] = {}
        by_index: dict[int, list[_End]] = defaultdict(list)
        for ends in self.ends.values():
            for e in ends:
                by_index[e.index].append(e)
        for pair in by_index.values():
            a, b = pair
            self.peer_end[id(a)] = b
            self.peer_end[id(b)] = a
        self.ancestors: dict[str, frozenset] = {}
        for b in estate.brokers:
            chain, seen, cur = [], {b}, b
            while cur in parent:
                cur = parent[cur]
                if cur in seen:
                    raise NotModelled(f"tree links form a cycle through {cur}")
                seen.add(cur)
                chain.append(cur)
            self.ancestors[b] = frozenset(chain)
        self.descendants: dict[str, set] = defaultdict(set)
        for b, ups in self.ancestors.items():
            for a in ups:
                self.descendants[a].add(b)


# -- the walk ------------------------------------------------------------------------

def propagate(estate: Estate, groups: Sequence[Group], *,
              held: list | None = None, origins: dict | None = None) -> Counts:
    """Every group's interest, walked to quiet in replay order (module docstring).
    ``held``: a list that receives ``(broker, end, group index, priority, conduit)`` for
    every accepted, active instance in walk order -- the demand the broker's core holds,
    which ``messages.py`` routes messages over.  ``origins``: a dict that counts add
    receipts per (broker, destination, origin broker)."""
    shape = _Shape(estate)
    counts = Counts()
    conduits: set[tuple[str, int, str]] = set()   # (broker, link index, dst)
    # per (broker, group name): the kept instance's demand priority (suppression)
    kept: dict[tuple[str, int], int] = {}
    queue: deque = deque()
    routes = {b: {src: [e for lane in lanes for e in shape.ends[b] if e.lane == lane]
                  for src, lanes in _ROUTES.items()} for b in estate.brokers}

    def advertise(b: str, gi: int, g: Group, path: tuple, src: _End | None) -> None:
        n = g.count
        for e in routes[b][src.lane if src is not None else "local"]:
            if e is src or not e.advertises:
                continue
            reason = e.offer(g.broker, g.dst, path)
            if reason is not None:
                if reason:
                    counts.dropped[b, reason] += n
                continue
            counts.adds_sent[b] += n
            queue.append((shape.peer_end[id(e)], gi, path + (b,)))

    for gi, g in enumerate(groups):
        if g.broker not in shape.ends:
            raise ValueError(f"group {g.name or gi}: unknown broker {g.broker}")
        if g.count < 1:
            raise ValueError(f"group {g.name or gi}: count must be >= 1")
        counts.interest[g.broker] += g.count
        advertise(g.broker, gi, g, (), None)

    while queue:
        end, gi, path = queue.popleft()
        g = groups[gi]
        r, n = end.broker, g.count
        counts.adds_received[r] += n
        counts.received_by_dst[r, g.dst] += n
        if origins is not None:
            k = (r, g.dst, g.broker)
            origins[k] = origins.get(k, 0) + n
        sender_path = path[:-1]
        if not end.accepts:
            counts.dropped[r, "malformed"] += n
            continue
        reason = _accept(end, shape, r, g, sender_path, path)
        if reason is None and end.remote + n > end.settings.max_demand_per_link:
            raise NotModelled(f"link {end.index} at {r} would pass max_demand_per_link")
        if reason is not None:
            counts.dropped[r, reason] += n
            continue
        end.remote += n
        hops = len(path)
        prio = end.demand_priority(hops)
        if end.suppresses(g.dst):
            have = kept.get((r, gi))
            if have is not None:
                if prio <= have:
                    counts.dropped[r, "duplicate"] += n
                    continue
                raise NotModelled("a later, shorter route displaces a kept duplicate")
            kept[r, gi] = prio
        # demand on the link it came over
        if end.conduit(g.dst, hops):
            key = (r, end.index, g.dst)
            static = end.forwards and g.dst in end.settings.statically_included \
                and end.kind == "mesh" and end.settings.conduit_subscriptions
            if key not in conduits and not static:
                conduits.add(key)
                counts.demand[r] += 1
                counts.demand_by_dst[r, g.dst] += 1
            if held is not None:
                held.append((r, end, gi, prio, True))
        else:
            counts.demand[r] += n
            counts.demand_by_dst[r, g.dst] += n
            if held is not None:
                held.append((r, end, gi, prio, False))
        counts.interest[r] += n
        advertise(r, gi, g, path, end)
    return counts


def _accept(end: _End, shape: _Shape, me: str, g: Group, sender_path: tuple,
            path: tuple) -> str | None:
    """MeshPolicy.accept / TreePolicy.accept for a well-formed advisory."""
    origin = g.broker
    if end.kind == "mesh":
        s = end.settings
        if s.consumer_ttl != -1 and len(sender_path) >= s.consumer_ttl:
            return "ttl"
        if origin == me or me in sender_path:
            return "loop"
        return end.permit(g.dst)
    if end.lane == "parent":
        if origin == me or me in sender_path:
            return "loop"
        if origin in shape.descendants[me]:
            return "loop"
        return None
    above = shape.ancestors[me]
    if me in sender_path or not above.isdisjoint(sender_path):
        return "tree_rule"
    if origin == me or origin in above:
        return "malformed"
    return None


# -- from the scenario runner's vocabulary ------------------------------------------

def estate_from_topology(topology, mode) -> Estate:
    """The estate a scenario engine builds for ``topology`` under ``mode`` (every link
    dialed by the child, settings from ``scenario.engines.common``)."""
    from treefed.scenario.engines.common import dial_settings, site_position

    links, tree, accepting = [], {}, set()
    for spec in topology.brokers:
        settings, accepts = site_position(mode, spec)
        tree[spec.id] = settings
        if accepts:
            accepting.add(spec.id)
        if spec.parent is not None:
            links.append(Link(spec.id, spec.parent, dial_settings(mode, spec)))
    return Estate(tuple(b.id for b in topology.brokers), tuple(links), tree,
                  frozenset(accepting))


def groups_from_consumers(consumers: Iterable) -> list[Group]:
    """Planned consumers (anything with ``broker``, ``dst``, ``selector``) folded into
    groups of alike consumers, in first-seen order."""
    order: dict[tuple, int] = {}
    for c in consumers:
        key = (c.broker, c.dst, c.selector)
        order[key] = order.get(key, 0) + 1
    return [Group(b, d, n, s, name=f"{b}|{d}|{s}") for (b, d, s), n in order.items()]
