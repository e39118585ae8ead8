"""Site: one broker plus its links — the federation's single entry point per broker.

Theory of operation
-------------------
A Site wraps a pure ``core.Broker`` and owns one ``Bridge`` per broker link.  It keeps
the broker's *interest*: every local consumer (path ``()``, origin = this broker) and
every instance accepted over a link, in ``_active`` (activation order, which is also the
replay order when a link comes up).  For each active interest it

1. holds demand on the link it came over (``Bridge.join_demand``), and
2. offers it to the links of the lanes ``routing.py`` lists for where it came from —
   mesh: every other mesh link; tree: up for local and child interest, down for local
   and parent interest — each link's policy may still refuse (a ``Drop``) or skip
   (silent).

Links come up through ``handshake.plan_link`` (a pure function of our settings and the
peer's hello); ``link_up`` only builds what the plan says.

A removal retraces exactly the links the add went to (``Interest.sent_to``); losing a
link forgets everything learned over it and cascades the removals.

Duplicate suppression: when the receiving link's policy suppresses the destination's
kind, only one instance per consumer id is active — the highest demand priority, ties
to the earlier arrival; the others are remembered and the best one is activated if the
kept one goes away, so routes fail over deterministically.

Events (``events.py`` names): ``advisory.sent`` (per frame; ``hops`` = the length the
receiver will see, ``len(path) + 1``), ``advisory.received``, ``advisory.dropped``,
``demand.created`` / ``demand.removed``, ``link.up`` / ``link.down`` (``role`` = the
peer's position: root | branch | leaf | mesh) and ``link.refused``.  With
``log_advisories=False`` none of the per-advisory events is built; ``counters`` still
counts them.  ``sharing`` (``sharing.py``) holds memory-saving tables the engine may
share between its Sites.  Nothing here does I/O or reads a clock: ``now`` is an
argument and every method returns (or extends) a list of actions.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Sequence

from treefed.core.actions import Close, Log, Out
from treefed.errors import LocalError
from treefed.events import DROP_REASONS
from treefed.federation.bridge import Bridge, Interest
from treefed.federation.handshake import Refusal, check_tree_hello, plan_link
from treefed.federation.mesh import MeshPolicy
from treefed.federation.resync import DELTA, FULL, OPTION as RESYNC, Held, digest
from treefed.core.destinations import parse_destination
from treefed.federation.routing import DOWN, ROUTES_ALL as _ROUTES
from treefed.federation.settings import LinkSettings, TreeSettings
from treefed.federation.sharing import Sharing
from treefed.federation.summary import OPTION as SUMMARY, Summary, owns, receive_subtree
from treefed.federation.tree import TreePolicy
from treefed.wire.frames import PROTOCOL_VERSION, Advisory, Error, Forward, ForwardAck, \
    Hello, Subscribe, Subtree, Unsubscribe

__all__ = ["Site", "POLICIES", "check_tree_hello"]

#: Frames that only a broker link may carry: a client sending one is refused and closed
#: (issue #12: a client's Forward chose its own path, redelivery count and timestamp).
LINK_ONLY_FRAMES = (Advisory, Forward, ForwardAck)

#: connector kind -> policy class (chosen by name from config).
POLICIES = MappingProxyType({"mesh": MeshPolicy, "tree": TreePolicy})

class Site:
    """A broker and its federation links (see the module docstring)."""

    __slots__ = ("broker_id", "broker", "tree", "accept_tree_children", "log", "counters",
                 "dropped", "route_unknown_up", "ancestry_set", "_ancestry", "_bridges",
                 "_lanes", "_active", "_rivals", "_locals", "_owner", "_seq", "temp_owners",
                 "sharing", "_held_up", "_suspended", "_summary", "_members_dirty")

    def __init__(self, broker_id: str, *, broker: Any, tree: TreeSettings | None = None,
                 accept_tree_children: bool = True, log_advisories: bool = True,
                 sharing: Sharing | None = None) -> None:
        self.broker_id = broker_id
        self.sharing = sharing if sharing is not None else Sharing()
        self.broker = broker
        self.tree = tree
        self.accept_tree_children = accept_tree_children
        self.log = log_advisories
        self.route_unknown_up = tree.route_unknown_up if tree is not None else False
        self.counters = {"advisories_sent": 0, "advisories_received": 0,
                         "removals_sent": 0, "demand_created": 0, "demand_removed": 0,
                         "peer_errors": 0}
        self.dropped = dict.fromkeys(DROP_REASONS, 0)
        self._ancestry: list[str] = []              # [parent, grandparent, ...]
        self.ancestry_set: frozenset[str] = frozenset()
        self._bridges: dict[str, Bridge] = {}       # conn -> bridge
        self._lanes: dict[str, list[Bridge]] = {"mesh": [], "parent": [], "child": []}
        self._active: dict[tuple, Interest] = {}    # key -> interest holding demand
        self._rivals: dict[str, Any] = {}  # consumer -> its instance, or a list of them
        #                                    (duplicate suppression: the kept one + rivals)
        self._locals: dict[str, dict[str, Interest]] = {}  # client conn -> sub -> interest
        self._owner: dict[str, Bridge] = {}         # broker id -> child link (tree)
        # temp destination -> [its owner "<origin>/<conn>", active interests in it]
        # (federation/temps.py: one temp name, one owning connection; issue #12)
        self.temp_owners: dict[str, list] = {}
        self._seq = 0
        # resync (resync.py): what we advertised up when the parent link dropped, and
        # per (child id, link name) the interest learned from a dropped child link,
        # suspended: (deadline, [Interest], digest)
        self._held_up: Held | None = None
        self._suspended: dict[tuple[str, str], tuple[float, list[Interest], str]] = {}
        # summaries (summary.py): our side of a summarising parent link, and whether our
        # subtree changed since the parent was last told
        self._summary: Summary | None = None
        self._members_dirty = False

    # -- identity ------------------------------------------------------------------
    @property
    def node_type(self) -> str:
        if self.tree is not None:
            return self.tree.node_type
        return "root" if self.accept_tree_children else "mesh"

    def ancestry(self) -> list[str]:
        """[parent id, grandparent id, ...] as learned from the parent's Hello."""
        return list(self._ancestry)

    def hello(self, settings: LinkSettings | None = None, *,
              reply_to: Hello | None = None) -> Hello:
        """Our Hello for a broker link: with ``settings`` when we dial (sent as options),
        with ``reply_to`` when answering a dialer (its connector and link echoed)."""
        if settings is None:
            kind = reply_to.connector if reply_to is not None else None
            verdict = self._resync_verdict(reply_to) if kind == "tree" else None
            options = {RESYNC: verdict} if verdict else {}
            if kind == "tree" and isinstance(reply_to.options, dict) \
                    and reply_to.options.get("summary_budget") \
                    and self._passes_covers():
                # we understand covers and can pass them on (summary.py)
                options[SUMMARY] = 1
            return Hello(PROTOCOL_VERSION, "broker", broker_id=self.broker_id,
                         name=self.broker_id, connector=kind,
                         node_type=self.node_type if kind == "tree" else "mesh",
                         ancestry=self.ancestry(),
                         link_name=reply_to.link_name if reply_to is not None else None,
                         duplex=reply_to.duplex if reply_to is not None else False,
                         options=options)
        options = settings.to_options()
        held = self._held_up
        if settings.kind == "tree" and held is not None and held.link == settings.name:
            options[RESYNC] = held.digest()   # "count:hash", see resync.digest
        return Hello(PROTOCOL_VERSION, "broker", broker_id=self.broker_id,
                     name=self.broker_id, connector=settings.kind,
                     node_type=self.node_type if settings.kind == "tree" else "mesh",
                     ancestry=self.ancestry(), link_name=settings.name,
                     duplex=settings.duplex, options=options)

    def _resync_verdict(self, hello: Hello | None) -> str | None:
        """The parent's answer to a child's resync offer: DELTA when we still hold
        exactly what it says it advertised to us, FULL when it offered and we do not,
        None when it made no offer."""
        if hello is None or not isinstance(hello.options, dict):
            return None
        offer = hello.options.get(RESYNC)
        if not isinstance(offer, str) or offer in (DELTA, FULL):
            return None
        held = self._suspended.get((hello.broker_id, hello.link_name or "tree"))
        if held is not None and offer == held[2]:
            return DELTA
        return FULL

    def check_tree_hello(self, hello: Hello, *, dialed: bool) -> str | None:
        return check_tree_hello(self.tree, hello, me=self.broker_id, dialed=dialed,
                                ancestry=self._ancestry,
                                accept_children=self.accept_tree_children)

    # -- clients -------------------------------------------------------------------
    def client_connected(self, conn: str, now: float) -> list:
        return self.broker.connect(conn, now)

    def client_closed(self, conn: str, now: float) -> list:
        out = self.broker.disconnect(conn, now)
        for it in (self._locals.pop(conn, None) or {}).values():
            self.forget(it, out, now)
        return out

    # -- frames --------------------------------------------------------------------
    def handle_frame(self, conn: str, frame: Any, now: float) -> list:
        bridge = self._bridges.get(conn)
        if bridge is not None:
            if type(frame) is Advisory:
                out: list = []
                bridge.receive(frame, out, now)
                if self._members_dirty:
                    self._sync_summary(out)
                return out
            if type(frame) is Subtree:   # a summarising child's membership (summary.py)
                out = []
                receive_subtree(bridge, frame, out, now)
                self._sync_summary(out)
                return out
            if type(frame) is Error:  # the peer refused something of ours
                self.counters["peer_errors"] += 1
                # fatal (no ref): the peer is closing; a refusal: nothing to answer, and
                # the core must not see it (it would reply with an error of its own)
                return [Close(conn)] if frame.ref is None else []
            return self.broker.handle_frame(conn, frame, now)
        kind = type(frame)
        if kind in LINK_ONLY_FRAMES:
            return [Close(conn, Error("bad_frame", f"{kind.__name__} frames belong on broker "
                                                   "links; a client may not send them"))]
        if kind is Subscribe:
            return self._subscribe(conn, frame, now)
        if kind is Unsubscribe:
            return self._unsubscribe(conn, frame, now)
        return self.broker.handle_frame(conn, frame, now)

    def handle_forwards(self, conn: str, frames: list, now: float, out: list) -> None:
        """A run of Forward frames from ``conn``: ``handle_frame`` of each, their actions
        appended to ``out``; on a link, one core call for the run
        (``Broker.accept_forwards``: one ForwardAck for all of it, issue #14)."""
        if conn in self._bridges:
            self.broker.accept_forwards(conn, frames, now, out)
        else:
            for frame in frames:   # not a link: each is refused as handle_frame does
                out += self.handle_frame(conn, frame, now)

    def handle_sends(self, conn: str, frames: list, now: float, out: list) -> None:
        """A run of a client's Send frames: ``handle_frame`` of each, their actions
        appended to ``out``, in one core call (``Broker.send_many``, issue #14)."""
        if conn in self._bridges:
            for frame in frames:
                out += self.handle_frame(conn, frame, now)
        else:
            self.broker.send_many(conn, frames, now, out)

    def _subscribe(self, conn: str, frame: Subscribe, now: float) -> list:
        broker = self.broker
        existed = broker.has_consumer(conn, frame.id)
        out = broker.handle_frame(conn, frame, now)
        if existed or not broker.has_consumer(conn, frame.id):
            return out  # refused by the core (its Error is in ``out``)
        dst = parse_destination(frame.dst, allow_wildcards=True)
        if broker.policies.for_destination(dst).local_only:
            return out  # never leaves this broker, so nobody else needs to know
        it = Interest(f"{self.broker_id}/{conn}/{frame.id}", dst, self.broker_id,
                      frame.selector, frame.priority, (), None, self.next_seq())
        self._locals.setdefault(conn, {})[frame.id] = it
        self._activate(it, out, now)
        return out

    def _unsubscribe(self, conn: str, frame: Unsubscribe, now: float) -> list:
        out = self.broker.handle_frame(conn, frame, now)
        subs = self._locals.get(conn)
        it = subs.pop(frame.id, None) if subs else None
        if it is not None:
            self.forget(it, out, now)
        return out

    # -- links ---------------------------------------------------------------------
    def link_up(self, conn: str, local: LinkSettings, remote_hello: Hello, now: float, *,
                dialed: bool) -> list:
        """Bring a broker link up after the hello exchange.  The dialing side's settings
        rule the link: the accepting side rebuilds them from ``remote_hello.options``.
        A refused link returns ``[Out(conn, Error(...)), Close(conn), Log(link.refused)]``."""
        if conn in self._bridges:
            raise LocalError(f"link {conn} is already up")
        peer = remote_hello.broker_id or "?"
        # linked already: as a child of ours, or below one (its owner is a live link)
        children = (peer,) if self.subtree_owner(peer) is not None else ()
        plan = plan_link(local, remote_hello, me=self.broker_id, dialed=dialed,
                         tree=self.tree, ancestry=self._ancestry,
                         accept_children=self.accept_tree_children,
                         has_parent=bool(self._lanes["parent"]), children=children,
                         sharing=self.sharing)
        if type(plan) is Refusal:
            return self._refuse(conn, plan.settings, peer, plan.why, remote_hello)
        settings, lane, advertises = plan.settings, plan.lane, plan.advertises
        if plan.tree is not self.tree:
            self.tree, self.route_unknown_up = plan.tree, plan.tree.route_unknown_up
        bridge = Bridge(self, conn, peer, settings, POLICIES[settings.kind](settings),
                        lane=lane, forwards=plan.forwards, accepts=plan.accepts,
                        advertises=advertises, peer_role=plan.peer_role)
        summarise = settings.kind == "tree" and bool(settings.summary_budget) and (
            lane == "child" or (lane == "parent" and isinstance(remote_hello.options, dict)
                                and remote_hello.options.get(SUMMARY)))
        if summarise:   # summary.py: both ends agreed (the child asked, the parent said so)
            bridge.summarised = True
            if lane == "parent":
                self._summary = Summary(self, bridge)
        out = self.broker.connect(conn, now)
        if bridge.policy.replay:
            self.broker.allow_revisits(conn)
        if lane == "parent":
            self._ancestry = [peer, *remote_hello.ancestry]
            self.ancestry_set = frozenset(self._ancestry)
        elif lane == "child":
            self._owner[peer] = bridge
            bridge.owned.add(peer)
            self._members_dirty = True
        self._bridges[conn] = bridge
        self._lanes[lane].append(bridge)
        bridge.start(out, now)
        out.append(Log("link.up", {"link": settings.name, "peer": peer,
                                   "connector": settings.kind, "role": plan.peer_role}))
        if lane == "child":
            self._resume_child(bridge, remote_hello, out, now)
            self._sync_summary(out)
        elif lane == "parent" and bridge.summarised:
            self._held_up = None
            self._summary.start(out)
            return out
        elif lane == "parent" and self.tree is not None and self.tree.summarises:
            # the parent refused summaries: children that summarise towards us reconnect
            # and are answered plain now (summary.py, ``_passes_covers``)
            for child in self._lanes["child"]:
                if child.summarised:
                    out.append(Close(child.conn))
        elif lane == "parent" and self._held_up is not None:
            held, self._held_up = self._held_up, None
            offer = remote_hello.options.get(RESYNC) if isinstance(
                remote_hello.options, dict) else None
            if offer == DELTA and held.link == settings.name:
                self._delta_up(bridge, held, out)
                return out
        if advertises:  # replay every current interest this link may hear of
            down = bridge.down if lane == DOWN else None
            for it in list(self._active.values()):
                src = it.source
                if src is not bridge and lane in _ROUTES[src.lane if src else "local"] \
                        and (down is None or it.dst.startswith(down)):
                    bridge.offer(it, out)
        return out

    def _refuse(self, conn: str, settings: LinkSettings, peer: str, why: str,
                hello: Hello) -> list:
        code = "tree_refused" if settings.kind == "tree" else "link_refused"
        return [Out(conn, Error(code=code, message=why)), Close(conn),
                Log("link.refused", {"link": settings.name, "peer": peer,
                                     "connector": settings.kind,
                                     "role": hello.node_type or "mesh", "reason": why})]

    def link_down(self, conn: str, now: float) -> list:
        """Forget the link: its demand, what it taught us (cascading removals), and its
        subtree.  Unknown conns (a refused link) are ignored."""
        bridge = self._bridges.pop(conn, None)
        if bridge is None:
            return []
        bridge.up = False
        self._lanes[bridge.lane].remove(bridge)
        # the core drops every consumer of the conn at once (in-flight messages requeue)
        out = self.broker.disconnect(conn, now)
        grace = bridge.settings.resync_grace if bridge.settings.kind == "tree" else 0
        if self._summary is not None and self._summary.bridge is bridge:
            self._summary = None   # a summarising link resyncs in full (summary.py)
        elif grace and bridge.lane == "parent":   # what we told it, for a delta resync
            self._held_up = Held(bridge.name, now + grace, {
                it.key: it.frame("add") for it in self._active.values()
                if bridge in it.sent_to})
        learned = list(bridge.remote.values())
        bridge.remote.clear()
        bridge.clients.clear()
        if grace and bridge.lane == "child":    # remembered for a delta resync (resync.py)
            self._suspended[(bridge.peer, bridge.name)] = (
                now + grace, learned, digest((c, p[:-1]) for c, p in
                                             (it.key for it in learned)))
        for it in learned:  # first, so no fail-over picks an instance of this dead link
            if not it.active:
                self._unrival(it)
        for it in learned:
            if it.active:
                self.forget(it, out, now, gone=True)
        for it in self._active.values():  # so flapping links leave nothing behind
            if bridge in it.sent_to:
                it.sent_to.remove(bridge)
        for broker_id in bridge.owned:
            if self._owner.get(broker_id) is bridge:
                del self._owner[broker_id]
                self._members_dirty = True
        if bridge.covers and self._summary is not None:   # summary.py
            for pattern in bridge.covers:
                self._summary.child_cover(pattern, -1, out, now)
        self._sync_summary(out)
        if bridge.lane == "parent":
            self._ancestry = []
            self.ancestry_set = frozenset()
        out.append(Log("link.down", {"link": bridge.name, "peer": bridge.peer,
                                     "connector": bridge.settings.kind,
                                     "role": bridge.peer_role}))
        return out

    def _passes_covers(self) -> bool:
        """May a child summarise towards us?  The root: yes.  A branch: when its own
        uplink is configured to summarise and is not up refusing it (covers it cannot
        pass on would leave the root without a route).  Configuration first, so the
        answer does not depend on which link came up first."""
        if self.node_type == "root":
            return True
        if self.tree is None or not self.tree.summarises:
            return False
        return not self._lanes["parent"] or self._summary is not None

    def _sync_summary(self, out: list) -> None:
        """Our subtree changed: a summarising link tells its parent (summary.py)."""
        if self._members_dirty:
            self._members_dirty = False
            if self._summary is not None and self._summary.sent:
                self._summary.sync_members(out)

    def links(self) -> list[Bridge]:
        return list(self._bridges.values())

    def bridge(self, conn: str) -> Bridge | None:
        return self._bridges.get(conn)

    # -- timers & stats ------------------------------------------------------------
    def next_deadline(self) -> float | None:
        deadline = self.broker.next_deadline()
        for held, *_ in self._suspended.values():
            if deadline is None or held < deadline:
                deadline = held
        if self._held_up is not None and (deadline is None
                                          or self._held_up.deadline < deadline):
            deadline = self._held_up.deadline
        return deadline

    def handle_timer(self, now: float) -> list:
        out = self.broker.handle_timer(now)
        if self._held_up is not None and self._held_up.deadline <= now:
            self._held_up = None
        for key in [k for k, v in self._suspended.items() if v[0] <= now]:
            self._drop_suspended(key, out, now)
        return out

    # -- resync (resync.py) ----------------------------------------------------------
    def _drop_suspended(self, key: tuple[str, str], out: list, now: float) -> None:
        """The grace is over (or the child resyncs in full): nothing to remember."""
        self._suspended.pop(key, None)

    def _resume_child(self, bridge: Bridge, hello: Hello, out: list, now: float) -> None:
        """A child link came up: re-admit the interest it had taught us (the verdict was
        DELTA: it still holds exactly that) without a frame from it, or forget what we
        remembered (anything else).  Re-admitting re-creates demand and advertises up
        again, as a fresh add would: the link's interest was forgotten (and retracted
        upward) when it dropped, so routing during the outage was the usual one."""
        key = (bridge.peer, bridge.name)
        if key not in self._suspended:
            return
        if self._resync_verdict(hello) != DELTA:
            self._drop_suspended(key, out, now)
            return
        _, learned, _ = self._suspended.pop(key)
        for it in learned:
            if it.active or it.key in bridge.remote:
                continue
            it.source = bridge
            bridge.remote[it.key] = it
            client = it.consumer.rpartition("/")[0]   # its client's share (bridge.py)
            bridge.clients[client] = bridge.clients.get(client, 0) + 1
            self.claim_subtree(bridge, it.path[:-1])
            self.admit(it, out, now)

    def _delta_up(self, bridge: Bridge, held: Held, out: list) -> None:
        """The parent still holds what we had advertised: send only the difference."""
        frames = held.frames
        for it in list(self._active.values()):
            src = it.source
            if src is bridge or bridge.lane not in _ROUTES[src.lane if src else "local"]:
                continue
            if frames.pop(it.key, None) is not None:
                if it.sent_to:          # it is still there: no frame
                    it.sent_to.append(bridge)
                else:
                    it.sent_to = [bridge]
            else:
                bridge.offer(it, out)   # appeared during the outage
        for frame in frames.values():   # left during the outage
            bridge.retract_frame(frame, out)

    def statistics(self) -> dict:
        stats = dict(self.broker.statistics())
        stats["links"] = [{"conn": b.conn, "link": b.name, "peer": b.peer,
                           "connector": b.settings.kind, "lane": b.lane,
                           "remote_interest": len(b.remote), "demand": b.demand_count()}
                          for b in self._bridges.values()]
        stats["demand"] = sum(link["demand"] for link in stats["links"])
        stats["interest"] = len(self._active)
        stats["advisories"] = dict(self.counters)
        stats["advisories_dropped"] = {k: v for k, v in self.dropped.items() if v}
        if self.tree is not None or self._lanes["child"]:
            stats["tree"] = {"node_type": self.node_type, "ancestry": self.ancestry()}
        s = self._summary
        if s is not None or any(b.covers for b in self._bridges.values()):   # summary.py
            stats["summary"] = {
                "active": bool(s and s.active), "up_interest": s.count if s else 0,
                "entries": len(s.entries) if s else 0,
                "covers_sent": sorted(s.sent) if s else [],
                "covers_held": sum(len(b.covers) for b in self._bridges.values())}
        if self._suspended or self._held_up is not None:   # resync.py
            stats["resync"] = {
                "children": sorted(f"{peer}/{link}" for peer, link in self._suspended),
                "held_up": len(self._held_up.frames) if self._held_up else 0}
        return stats

    # -- tree subtree ownership (read by TreePolicy) -------------------------------
    def subtree_owner(self, broker_id: str, claimant: Bridge | None = None) -> Bridge | None:
        """The child link whose subtree holds ``broker_id``, or None.

        A claim lapses once its link no longer carries any interest naming that broker (a
        store moved to another region): only then may another child claim it.  The scan
        runs only when someone other than the owner asks, i.e. on a move or a spoof."""
        owner = self._owner.get(broker_id)
        if owner is None or owner is claimant or owner.peer == broker_id \
                or broker_id in owner.members:
            return owner
        for it in owner.remote.values():
            if broker_id in it.path:
                return owner
        del self._owner[broker_id]
        owner.owned.discard(broker_id)
        self._members_dirty = True
        return None

    def claim_subtree(self, bridge: Bridge, brokers: Sequence[str]) -> None:
        owner = self._owner
        for broker_id in brokers:
            if broker_id not in owner:
                owner[broker_id] = bridge
                bridge.owned.add(broker_id)
                self._members_dirty = True

    # -- interest life cycle (called by Bridge, not part of the shell API) ---------
    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def admit(self, it: Interest, out: list, now: float) -> None:
        """A newly accepted instance: activate it unless a better duplicate holds."""
        if it.source.policy.suppresses(it.dst):
            # most consumers reach us by one route: the lone instance is held bare, a
            # list only from the second route on
            held = self._rivals.get(it.consumer)
            if held is None:   # the usual case: nothing to compare with
                self._rivals[it.consumer] = it
                kept = None
            else:
                if type(held) is list:
                    rivals = held
                    rivals.append(it)
                else:
                    rivals = self._rivals[it.consumer] = [held, it]
                kept = next((r for r in rivals if r.active), None)
            if kept is not None:
                if it.demand_priority <= kept.demand_priority:
                    it.source.drop(it, "duplicate", out)
                    return
                kept.source.drop(kept, "duplicate", out)
                self._deactivate(kept, out, now)
        self._activate(it, out, now)

    def _activate(self, it: Interest, out: list, now: float) -> None:
        if it.source is not None and not it.source.join_demand(it, out, now):
            if it.source.remote.pop(it.key, None) is not None:
                it.source.unclient(it.consumer)
            self._unrival(it)
            it.source.drop(it, "malformed", out)  # the core refused its selector/dst
            return
        it.active = True
        self._active[it.key] = it
        if it.dst.startswith("temp-"):
            held = self.temp_owners.get(it.dst)
            if held is None:
                self.temp_owners[it.dst] = [it.consumer.rpartition("/")[0], 1]
            else:
                held[1] += 1
        self._advertise(it, out)

    def _deactivate(self, it: Interest, out: list, now: float, *, gone: bool = False) -> None:
        it.active = False
        del self._active[it.key]
        if it.dst.startswith("temp-"):
            held = self.temp_owners.get(it.dst)
            if held is not None:
                held[1] -= 1
                if held[1] <= 0:
                    del self.temp_owners[it.dst]
        if it.source is not None:
            it.source.leave_demand(it, out, now, gone=gone)
        for bridge in it.sent_to:
            if bridge.up:
                bridge.retract(it, out)
        it.sent_to = ()
        if self._summary is not None:   # summary.py: what goes up may shrink
            self._summary.remove(it, out, now)

    def forget(self, it: Interest, out: list, now: float, *, gone: bool = False) -> None:
        """The instance is gone (removal, link loss, consumer closed)."""
        was_active = it.active
        if was_active:
            self._deactivate(it, out, now, gone=gone)
        rivals = self._unrival(it)
        if was_active and rivals:
            best = max(rivals, key=lambda r: (r.demand_priority, -r.seq))
            self._activate(best, out, now)

    def _unrival(self, it: Interest) -> list[Interest] | None:
        """Take ``it`` out of its consumer's instances; the ones left (None: none)."""
        rivals = self._rivals
        held = rivals.get(it.consumer)
        if held is None:
            return None
        if type(held) is not list:
            if held is it:
                del rivals[it.consumer]
                return None
            return [held]
        if it in held:
            held.remove(it)
        if not held:
            del rivals[it.consumer]
            return None
        if len(held) == 1:
            rivals[it.consumer] = held[0]
        return held

    def _advertise(self, it: Interest, out: list) -> None:
        src = it.source
        lanes = self._lanes
        for lane in _ROUTES[src.lane if src is not None else "local"]:
            if lane == DOWN:   # each child chose the kinds it hears of from above
                dst = it.dst
                for bridge in lanes[lane]:
                    if bridge is not src and bridge.advertises and (
                            dst.startswith(bridge.down)
                            or bridge.covers and owns(bridge, dst)):   # summary.py
                        bridge.offer(it, out)
                continue
            if lane == "parent" and self._summary is not None:   # summary.py
                if self._summary.bridge is not src:
                    self._summary.add(it, out)
                continue
            for bridge in lanes[lane]:
                if bridge is not src and bridge.advertises:
                    bridge.offer(it, out)
