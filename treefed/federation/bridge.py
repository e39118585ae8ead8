"""The Bridge: one broker link's state machine, shared by both connector kinds.

Theory of operation
-------------------
A Bridge holds what one link taught us and what we told it:

* ``remote`` — every interest instance learned over the link, keyed by
  ``(consumer id, path)`` where ``path`` already ends with the peer (the same consumer
  can reach us over several routes; each route is a distinct instance).
* ``conduits`` — demand consumers shared by several instances of one destination.
  A demand is a network consumer on the core Broker (``peer=`` set), so the core
  forwards matching messages over this link; its selector and priority are refreshed
  only when the set of member selectors or the best member priority changes.
* static consumers (statically included destinations, demand-less) and the tree's
  fallback consumers for ``route_unknown_up``.

Direction (DESIGN §4.1): a link ``forwards`` messages from the dialing side to the
accepting side, so the dialing side ``accepts`` advisories and creates demand while the
accepting side ``advertises``; duplex and tree links do both.  A static bridge forwards
its static includes and exchanges no advisories at all.

The Bridge never decides policy: ``self.policy`` (mesh or tree) answers whether an
advisory is accepted or sent and what its demand looks like, and the Site decides where
interest fans out (``routing.py``).  ``receive`` is the one decision point for an
arriving advisory; a policy's ``accept`` only answers, and its subtree ``claims`` are
applied after every check (the per-link limit included) passed.  Every refusal becomes
one ``Drop`` action (when logging is on; the shell renders it as ``advisory.dropped``)
and one count in ``Site.dropped``.  A malformed advisory is refused alone: the link
stays up.  Nothing here does I/O; results are appended to the caller's ``out`` list.

Memory: a mesh estate holds millions of interest instances, so each is kept lean --
slotted objects, broker ids / destinations / consumer ids interned (``sys.intern``: a
real node decodes a fresh string per frame), paths, keys and demand sub ids shared
through the Site's ``Sharing`` (``sharing.py``: owned by the engine), ``sent_to`` a
shared empty tuple until the first link takes the interest, and a demand standing for
one interest holds it in a 1-tuple (only conduits keep member dicts and counts).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from treefed.core.actions import Drop, Log, Out
from treefed.core.destinations import parse_destination
from treefed.core.selector import compile_selector
from treefed.errors import DestinationError, SelectorError, TreefedError
from treefed.federation.merged import MergedSelector
from treefed.federation.settings import LinkSettings
from treefed.federation.summary import NotOwned, receive_cover
from treefed.federation.temps import refused_error
from treefed.wire.frames import Advisory

if TYPE_CHECKING:  # pragma: no cover
    from treefed.federation.site import Site

__all__ = ["Bridge", "Interest", "Demand", "MAX_PATH", "malformed"]

#: Longer advisory paths are refused as malformed: no sane estate is that deep.
MAX_PATH = 64
_MAX_ID = 1024

_intern = sys.intern
_NOBODY: tuple = ()        # Interest.sent_to until a link takes it (shared, never mutated)


#: One client connection (consumer ids "<origin>/<conn>/<sub>" share "<origin>/<conn>")
#: may hold at most a quarter of a link's interest cap, and never less than
#: CLIENT_SHARE_FLOOR entries: a client that opened endless subscriptions at a store
#: (one whose own per-connection limit is off) cannot fill the cap and so starve every
#: other consumer behind that link (issue #12, defect 7).
CLIENT_SHARE_DIVISOR = 4
CLIENT_SHARE_FLOOR = 1000


def client_share(cap: int) -> int:
    """Most entries of one client connection on a link whose cap is ``cap``."""
    return max(cap // CLIENT_SHARE_DIVISOR, min(cap, CLIENT_SHARE_FLOOR))


def malformed(adv: Advisory) -> bool:
    """Cheap structural check of a received advisory (the codec checks types, but the
    replay engine hands frames over directly)."""
    path = adv.path
    if type(path) is not list or len(path) > MAX_PATH:
        return True
    for broker in path:
        if type(broker) is not str or not broker or len(broker) > _MAX_ID:
            return True
    origin, consumer = adv.origin, adv.consumer
    if type(origin) is not str or not origin or len(origin) > _MAX_ID:
        return True
    if type(consumer) is not str or not consumer or len(consumer) > _MAX_ID:
        return True
    if type(adv.priority) is not int or adv.kind not in ("add", "remove"):
        return True
    try:  # both memoised in core; a non-canonical spelling is as bad as an invalid one
        if adv.selector is not None:
            compile_selector(adv.selector)  # a conduit drops it, the next hop may not
        return parse_destination(adv.dst, allow_wildcards=True) != adv.dst
    except (DestinationError, SelectorError):
        return True


class Interest:
    """One consumer's interest as known at this broker: a local consumer (``source`` is
    None, ``path`` empty) or an instance learned over a link."""

    __slots__ = (
        "key",             # (consumer, path): identity within the whole Site
        "consumer",        # global consumer id "<origin>/<conn>/<sub>"
        "dst", "origin", "selector",
        "priority",        # the consumer's own priority, passed along unchanged
        "path",            # brokers passed, origin first, the sender last (excl. us)
        "source",          # Bridge it came over, None when local
        "demand_priority", # priority of the demand it creates (policy)
        "conduit",         # shares its link's per-destination demand (policy)
        "demand",          # the Demand it belongs to while active
        "sent_to",         # bridges we advertised it on: a removal retraces exactly these
        "active",          # False while suppressed as a duplicate
        "seq",             # arrival order: the tie-break of duplicate suppression
        "_frame",          # the add frame, built once and shared by every link
    )

    def __init__(self, consumer: str, dst: str, origin: str, selector: str | None,
                 priority: int, path: tuple[str, ...], source: "Bridge | None",
                 seq: int, key: tuple | None = None) -> None:
        self.key = key if key is not None else (consumer, path)
        self.consumer = consumer
        self.dst = dst
        self.origin = origin
        self.selector = selector
        self.priority = priority
        self.path = path
        self.source = source
        self.demand_priority = 0
        self.conduit = False
        self.demand: Demand | None = None
        self.sent_to: list[Bridge] | tuple = _NOBODY
        self.active = False
        self.seq = seq
        self._frame: Advisory | None = None

    def frame(self, kind: str) -> Advisory:
        if kind == "add":
            if self._frame is None:
                self._frame = Advisory("add", self.consumer, self.dst, self.origin,
                                       self.selector, self.priority, list(self.path))
            return self._frame
        return Advisory("remove", self.consumer, self.dst, self.origin, self.selector,
                        self.priority, list(self.path))


class Demand:
    """A network consumer on the core Broker standing for one or more interests."""

    __slots__ = ("sub", "dst", "conduit", "static", "members", "selectors", "priorities",
                 "selector", "priority", "merged")

    def __init__(self, sub: str, dst: str, *, conduit: bool, static: bool = False) -> None:
        self.sub = sub
        self.dst = dst
        self.conduit = conduit
        self.static = static              # statically included: lives as long as the link
        # conduits: an ordered set of members; otherwise the one member in a 1-tuple
        # (a dict per demand was ~230 bytes of millions)
        self.members: dict[Interest, None] | tuple = {} if conduit else ()
        # conduits only (a single-member demand copies its member): reference counts
        # so the merged selector / best priority change only when a count hits 0 or 1
        self.selectors: dict[str | None, int] | None = {} if conduit else None
        self.priorities: dict[int, int] | None = {} if conduit else None
        self.selector: Any = None         # text, a MergedSelector, or None (installed)
        self.priority = 0
        # conduits of a policy that merges selectors (tree): the members' selectors,
        # each compiled once; changed in place, O(one member) per change
        self.merged: MergedSelector | None = None

    def add(self, it: Interest) -> bool:
        """Count ``it`` in; True when the merged selector grew (matches more).  Raises
        SelectorError (nothing changed) for a selector that does not compile."""
        if not self.conduit:
            self.members = (it,)
            return False
        text = it.selector
        grew = False
        if self.merged is not None and text is not None and text not in self.selectors:
            grew = self.merged.add(text)
        self.members[it] = None
        self.selectors[text] = self.selectors.get(text, 0) + 1
        self.priorities[it.demand_priority] = self.priorities.get(it.demand_priority, 0) + 1
        return grew

    def discard(self, it: Interest) -> None:
        if not self.conduit:
            if self.members and self.members[0] is it:
                self.members = ()
            return
        del self.members[it]
        for table, value in ((self.selectors, it.selector),
                             (self.priorities, it.demand_priority)):
            left = table[value] - 1
            if left:
                table[value] = left
            else:
                del table[value]
                if table is self.selectors and value is not None and self.merged is not None:
                    self.merged.discard(value)

    def installed_selector(self, policy: Any) -> Any:
        """The selector the core consumer should have for the current members."""
        if self.merged is not None:
            return None if None in self.selectors else self.merged
        return policy.conduit_selector(self.selectors)


class Bridge:
    """State of one broker link (see the module docstring)."""

    __slots__ = ("site", "conn", "peer", "settings", "policy", "lane", "name", "duplex",
                 "forwards", "accepts", "advertises", "up", "remote", "conduits", "owned",
                 "peer_role", "_subs", "clients", "down", "summarised", "members", "covers")

    def __init__(self, site: "Site", conn: str, peer: str, settings: LinkSettings,
                 policy: Any, *, lane: str, forwards: bool, accepts: bool,
                 advertises: bool, peer_role: str) -> None:
        self.site = site
        self.conn = conn
        self.peer = peer
        self.settings = settings
        self.policy = policy
        self.lane = lane                  # "mesh" | "parent" | "child": ROUTES key
        self.name = settings.name
        self.duplex = settings.duplex
        self.forwards = forwards          # messages flow to the peer (static includes)
        self.accepts = accepts            # we take its advisories and hold demand for it
        self.advertises = advertises      # we send it our interest
        self.up = True
        self.remote: dict[tuple, Interest] = {}
        self.conduits: dict[str, Demand] = {}
        self.owned: set[str] = set()      # tree child: brokers claimed for its subtree
        self.peer_role = peer_role
        self._subs = 0                    # demand sub ids issued on this conn
        self.clients: dict[str, int] = {}  # "<origin>/<conn>" -> its entries in remote
        # a child link: destination prefixes whose interest from above goes down it
        # (settings.advertise_down).  Temporary destinations always do: a reply travels
        # on the requester's temp queue, and the fallback route up covers queue:// and
        # topic:// only (temp names are owned by one connection, never wildcarded)
        self.down: tuple[str, ...] = tuple(
            f"{kind}://" for kind in settings.advertise_down) + (
            "temp-queue://", "temp-topic://")
        # summaries (summary.py): both ends agreed in the hello; a child link's announced
        # members (its Subtree frames) and covers (pattern -> the OwnedBy selector)
        self.summarised = False
        self.members: set[str] = set()
        self.covers: dict[str, Any] = {}

    # -- lifecycle -----------------------------------------------------------------
    def start(self, out: list, now: float) -> None:
        """Static and fallback consumers: forwarding that needs no advisory."""
        broker, s = self.site.broker, self.settings
        if self.forwards:
            for dst in s.statically_included:
                sub = "s:" + dst
                out += broker.add_consumer(self.conn, sub, dst, now, prefetch=s.prefetch,
                                           peer=self.peer,
                                           message_ttl=self.policy.message_ttl)
                if s.conduit_subscriptions:  # dynamic demand for it joins this consumer
                    self.conduits[dst] = Demand(sub, dst, conduit=True, static=True)
        if self.lane == "parent" and self.site.route_unknown_up:
            summary = self.site._summary
            for dst in ("queue://>", "topic://>"):
                sub = "f:" + dst
                # summarising (summary.py): not the queues our subtree owns while covered
                sel = NotOwned(self.site, summary) if summary is not None \
                    and summary.bridge is self and dst == "queue://>" else None
                out += broker.add_consumer(self.conn, sub, dst, now, prefetch=s.prefetch,
                                           peer=self.peer, fallback=True, replay=True,
                                           selector=sel)

    # -- receiving -----------------------------------------------------------------
    def receive(self, adv: Advisory, out: list, now: float) -> None:
        """The one decision point for an advisory arriving over this link: refused
        (one ``Drop`` with its reason), a removal retraced, or accepted -- and only then
        are the policy's subtree claims applied and the interest admitted."""
        if adv.cover is not None:   # a summarising child's cover (summary.py)
            receive_cover(self, adv, out, now)
            return
        site = self.site
        shared = site.sharing
        site.counters["advisories_received"] += 1
        if site.log:   # a fan-out's receivers share these fields
            out.append(Log("advisory.received",
                           shared.received_fields(adv, self.name, self.peer)))
        # Sharing.malformed's hit inlined (a fan-out's frame is checked once)
        if not self.accepts or (shared.checked.get(id(adv)) is not adv
                                and shared.malformed(adv, malformed)):
            # a one-way link's accepting side takes no interest: the peer broke the rules
            self.drop(adv, "malformed", out)
            return
        probe = (adv.consumer, (*adv.path, self.peer))
        key = shared.keys.get(probe)   # Sharing.key's hit, inlined
        if key is None:
            key = shared.key(*probe)
        if adv.kind == "remove":
            it = self.remote.pop(key, None)
            if it is not None:  # unknown: its add was refused (and logged) already
                self.unclient(it.consumer)
                site.forget(it, out, now)
            return
        if key in self.remote:
            return  # a repeated add (replay racing a live update): idempotent
        policy = self.policy
        reason = policy.accept(self, adv)
        client = adv.consumer.rpartition("/")[0]
        if reason is None:
            cap = self.settings.max_demand_per_link
            if len(self.remote) >= cap or self.clients.get(client, 0) >= client_share(cap):
                reason = "limit"
        if reason is not None:
            self.drop(adv, reason, out)
            if reason == "forbidden":   # a temp destination claimed (issue #12, defect 3)
                out.append(Out(self.conn, refused_error(adv)))
            return
        if self.lane == "child":   # every check passed: now the child's subtree may grow
            site.claim_subtree(self, policy.claims(self, adv))
        site._seq += 1   # Site.next_seq, inlined: once per accepted advisory
        it = Interest(key[0], _intern(adv.dst), _intern(adv.origin), adv.selector,
                      adv.priority, key[1], self, site._seq, key)
        hops = len(it.path)
        it.demand_priority = policy.demand_priority(hops)
        it.conduit = policy.conduit(it.dst, hops)
        self.remote[key] = it
        self.clients[client] = self.clients.get(client, 0) + 1
        site.admit(it, out, now)

    def unclient(self, consumer: str) -> None:
        """An entry of ``consumer`` left ``remote``: its client's count goes down."""
        client = consumer.rpartition("/")[0]
        left = self.clients.get(client, 0) - 1
        if left > 0:
            self.clients[client] = left
        else:
            self.clients.pop(client, None)

    def drop(self, adv: Advisory | Interest, reason: str, out: list) -> None:
        """Refuse ``adv`` for ``reason``: counted here, one ``Drop`` action for the shell
        to render (``advisory.dropped``) when advisories are logged."""
        site = self.site
        site.dropped[reason] += 1
        if site.log:
            out.append(Drop(reason, self.name, self.peer, adv.consumer, adv.dst, adv.origin,
                            adv.kind if type(adv) is Advisory else "add"))

    # -- sending -------------------------------------------------------------------
    def offer(self, it: Interest, out: list) -> None:
        """Advertise ``it`` here unless the policy refuses (a reason is logged)."""
        reason = self.policy.offer(self, it)
        if reason is not None:
            if reason:
                self.drop(it, reason, out)
            return
        frame = it._frame    # it.frame("add"), inlined: built once per interest
        out.append(Out(self.conn, frame if frame is not None else it.frame("add")))
        if it.sent_to:
            it.sent_to.append(self)
        else:
            it.sent_to = [self]
        site = self.site
        site.counters["advisories_sent"] += 1
        if site.log:
            out.append(Log("advisory.sent", {
                "link": self.name, "peer": self.peer, "consumer": it.consumer,
                "dst": it.dst, "origin": it.origin, "kind": "add",
                "hops": len(it.path) + 1}))

    def retract_frame(self, add: Advisory, out: list) -> None:
        """Retract an interest we no longer hold, from its add frame (delta resync)."""
        out.append(Out(self.conn, Advisory("remove", add.consumer, add.dst, add.origin,
                                           add.selector, add.priority, list(add.path))))
        site = self.site
        site.counters["removals_sent"] += 1
        if site.log:
            out.append(self._log("advisory.sent", add, hops=len(add.path) + 1,
                                 kind="remove"))

    def retract(self, it: Interest, out: list) -> None:
        out.append(Out(self.conn, it.frame("remove")))
        site = self.site
        site.counters["removals_sent"] += 1
        if site.log:
            out.append(self._log("advisory.sent", it, hops=len(it.path) + 1, kind="remove"))

    # -- demand --------------------------------------------------------------------
    def join_demand(self, it: Interest, out: list, now: float) -> bool:
        """Make ``it`` part of a demand consumer; False when the core refuses it."""
        d = self.conduits.get(it.dst) if it.conduit else None
        if d is not None:
            try:
                grew = d.add(it)
            except SelectorError:
                return False
            it.demand = d
            if not d.static and not self._refresh(d, out, now, grew=grew):
                d.discard(it)
                it.demand = None
                return False
            return True
        self._subs += 1
        d = Demand(self.site.sharing.sub_id(self._subs), it.dst, conduit=it.conduit)
        if it.conduit and self.policy.merges_selectors:
            d.merged = MergedSelector()
        try:
            d.add(it)
        except SelectorError:
            return False
        d.selector = d.installed_selector(self.policy) if it.conduit else it.selector
        d.priority = it.demand_priority
        try:
            out += self._install(d, now)
        except TreefedError:
            return False
        if it.conduit:
            self.conduits[it.dst] = d
        it.demand = d
        self.site.counters["demand_created"] += 1
        if self.site.log:
            out.append(self._log_demand("demand.created", it, d))
        return True

    def leave_demand(self, it: Interest, out: list, now: float, *, gone: bool = False) -> None:
        """Take ``it`` out of its demand; ``gone``: the core already dropped the conn."""
        d = it.demand
        if d is None:
            return
        it.demand = None
        d.discard(it)
        if d.members or d.static:
            if not gone and not d.static:
                self._refresh(d, out, now)
            return
        if d.conduit:
            del self.conduits[d.dst]
        if not gone:
            out += self.site.broker.remove_consumer(self.conn, d.sub, now)
        self.site.counters["demand_removed"] += 1
        if self.site.log:
            out.append(self._log_demand("demand.removed", it, d))

    def demand_count(self) -> int:
        seen = {id(it.demand) for it in self.remote.values() if it.demand is not None}
        return len(seen)

    def _install(self, d: Demand, now: float) -> list:
        s = self.settings
        return self.site.broker.add_consumer(
            self.conn, d.sub, d.dst, now, selector=d.selector, prefetch=s.prefetch,
            priority=d.priority, peer=self.peer, message_ttl=self.policy.message_ttl,
            replay=self.policy.replay)

    def _refresh(self, d: Demand, out: list, now: float, *, grew: bool = False) -> bool:
        """Conduits: re-create the core consumer when its selector or the best member
        priority changed (members come and go far more often than that).  A merged
        selector changes in place: when it ``grew``, the core re-offers waiting messages."""
        shape = d.installed_selector(self.policy), max(d.priorities)
        if shape[0] is d.selector and shape[1] == d.priority or shape == (d.selector,
                                                                         d.priority):
            if grew and d.selector is d.merged:
                out += self.site.broker.selector_widened(self.conn, d.sub, now)
            return True
        old = d.selector, d.priority
        d.selector, d.priority = shape
        broker = self.site.broker
        out += broker.remove_consumer(self.conn, d.sub, now)
        try:
            out += self._install(d, now)
        except TreefedError:
            d.selector, d.priority = old
            out += self._install(d, now)
            return False
        return True

    # -- logging (only called when Site.log is on) ---------------------------------
    def _log(self, event: str, adv: Any, **extra: Any) -> Log:
        fields = {"link": self.name, "peer": self.peer, "consumer": adv.consumer,
                  "dst": adv.dst, "origin": adv.origin,
                  "kind": adv.kind if type(adv) is Advisory else "add"}
        fields.update(extra)
        return Log(event, fields)

    def _log_demand(self, event: str, it: Interest, d: Demand) -> Log:
        # shared between the sites that learn the same instance (the interest key is one
        # object everywhere, see Sharing.key) over links of the same name and peer
        return Log(event, self.site.sharing.demand_fields(
            it.key, event, self.name, self.peer, it.consumer, d.dst, it.origin,
            d.priority, d.conduit))
