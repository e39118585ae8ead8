"""The replay engine: every site a pure federation.Site stepped on one virtual clock.

Theory of operation
-------------------
No tasks, no sockets, no real time.  Each site is a ``federation.Site`` over a real
``core.Broker``; a frame a site emits for a link is queued FIFO and handed to the other
end ``latency`` virtual seconds later.  Because every frame is queued at ``now +
latency`` and ``now`` never goes back, the single FIFO is also in delivery-time order:
no heap is needed.  Timeline steps run when the clock reaches their ``at``, after every
frame due at or before that time.

Links carry an *epoch*: cutting a link, killing a broker or re-parenting a child bumps
it, and a queued frame whose epoch is stale is discarded -- frames in flight on a link
that went down are lost, exactly as on a dropped TCP connection (the core requeues what
it had in flight).  Link up performs the hello exchange and ``link_up`` on both ends at
once (acceptor first); link down calls ``link_down`` on every living end.

Applications are simulated: one client connection ``app`` per site holds the workload's
consumers (auto-acknowledging every delivery at once, iteratively, never recursively)
and sends its messages.  A killed site loses everything but its MemoryStore; a restarted
one gets a new Broker and Site, its persistent messages restored, its consumers
re-attached and its links re-dialed.

Every ``Log`` action goes to the Recorder with ``ts`` = virtual time.  The hot path
(one frame) is: epoch check, ``handle_frame``, then one pass over the actions with the
per-kind work inlined; the Log actions of that pass reach the Recorder in one call.  A
queue entry is ``(time, frame, [node, conn, link, epoch, ...])``: a fan-out of one frame
object to many links at one time is one entry (millions fewer tuples in a mesh flood).

Entries due at the same virtual time are handed over site by site, ``_BATCH`` entries at
a time: a mesh flood is thousands of fan-outs of one time, and a site that takes its
frames in a row finds its tables still in the CPU cache instead of touching 4,000 sites'
tables for every frame (at 4 x 1,000 stores this alone took the run from 150 s to
112 s).  Each site still gets its frames in queue order, so every link stays FIFO; only
the interleaving of different sites within one instant changes, which no site can
observe.  Site timers (expiry, rested-message replays) sit in one heap of
``(deadline, site)``, re-armed after every entry point into a site and fired in time
order with the frames (one due now goes before the rest of its instant's frames).  The
run ends ``QUIET_S`` virtual seconds after the last step; frames still queued then are
counted, not delivered (a routing loop cannot hang it).

Garbage collection: a mesh estate is millions of long-lived objects (interest, demand,
consumers), and a generational collection that walks them costs several times the
advisory work itself.  So the run raises the collection threshold, and moves everything
alive into the permanent generation (``gc.freeze``, O(1)) once the estate is built and
every ``_PROGRESS_EVERY`` frames, so collections -- if the caller left gc enabled -- see only
what is new.  At the end ``gc.unfreeze`` hands it all to the oldest generation (O(1)), so
the caller's collection can free the estate, and young collections afterwards stay cheap.
"""

from __future__ import annotations

import gc
import heapq
from collections import deque
from itertools import count
from typing import Any, Callable

from treefed.core.actions import Close, DeleteMessage, Drop, Log, Out, StoreMessage
from treefed.core.broker import Broker
from treefed.federation.sharing import Sharing
from treefed.federation.site import Site
from treefed.persistence.memory import MemoryStore
from treefed.scenario.engines.common import (
    APP_CONN, LINK_NAME, RUNNER, accept_settings, broker_info, dial_settings, run_fields,
    run_params, site_position,
)
from treefed.scenario.results import Recorder
from treefed.scenario.spec import Mode
from treefed.scenario.topology import BrokerSpec, Topology
from treefed.scenario.workload import Plan, PlannedConsumer, Step
from treefed.wire.frames import Ack, Deliver, Error, Send, Subscribe, Unsubscribe

__all__ = ["ReplayEngine", "DEFAULT_LATENCY", "QUIET_S"]

#: Virtual seconds a frame spends on a link.
DEFAULT_LATENCY = 0.001
#: Virtual seconds the run goes on after the last step (as the live engines do).
QUIET_S = 5.0
_PROGRESS_EVERY = 50_000   # frames between progress callbacks (and gc.freeze calls)
#: Same-time queue entries regrouped by receiving site at once (see ``_deliver``).
_BATCH = 256
#: gc thresholds during a run: young collections rarely, old ones almost never.
_GC_THRESHOLD = (100_000, 50, 1000)


class _Node:
    __slots__ = ("id", "spec", "site", "store", "alive", "ends", "armed")

    def __init__(self, spec: BrokerSpec) -> None:
        self.id = spec.id
        self.spec = spec
        self.site: Site | None = None
        self.store = MemoryStore()      # survives kill_broker: the "disk"
        self.alive = False
        self.ends: dict[str, tuple[_Link, _Node, str]] = {}  # conn -> (link, peer, its conn)
        self.armed: float | None = None  # the deadline queued for it in the timer heap


class _Link:
    __slots__ = ("child", "parent", "child_conn", "parent_conn", "epoch", "up", "cut")

    def __init__(self, child: _Node, parent: _Node, name: str) -> None:
        self.child = child
        self.parent = parent
        self.child_conn = f"L:{name}:{parent.id}"
        self.parent_conn = f"L:{name}:{child.id}"
        self.epoch = 0          # bumped on every up/down: stale queued frames are dropped
        self.up = False
        self.cut = False        # held down by the timeline


class ReplayEngine:
    """Runs one mode of a plan on a virtual clock (see the module docstring)."""

    name = "replay"

    def __init__(self, plan: Plan, mode: Mode, recorder: Recorder, *,
                 latency: float = DEFAULT_LATENCY,
                 progress: Callable[[dict], None] | None = None) -> None:
        self.plan = plan
        self.mode = mode
        self.rec = recorder
        self.latency = latency
        self.progress = progress
        self.now = 0.0
        self.topology: Topology = plan.topology
        self.nodes: dict[str, _Node] = {}
        self.links: dict[str, _Link] = {}     # child id -> its link to the parent
        self.consumers: dict[str, dict[str, PlannedConsumer]] = {}  # broker -> sub -> c
        self.frames = 0
        self.client_errors = 0
        self._q: deque = deque()
        self._acks: deque = deque()
        self._timers: list[tuple[float, int, _Node]] = []   # heap of sites' deadlines
        self.sharing = Sharing()   # memory-saving tables shared by all its Sites
        self._seq = count()
        self._next_report = _PROGRESS_EVERY
        self._accept = accept_settings(mode)
        self._link_name = LINK_NAME[mode.connector]

    # ------------------------------------------------------------------ the run
    def run(self) -> dict[str, Any]:
        """Execute the plan; returns engine figures (virtual end time, frames...)."""
        threshold = gc.get_threshold()
        gc.set_threshold(*_GC_THRESHOLD)
        try:
            return self._run()
        finally:
            gc.unfreeze()
            gc.set_threshold(*threshold)

    def _run(self) -> dict[str, Any]:
        plan, rec = self.plan, self.rec
        params = run_params(plan, self.mode, latency=self.latency)
        rec.emit(0.0, RUNNER, "run.started",
                 run_fields(plan, self.mode, self.name, self.topology, params))
        for spec in self.topology.brokers:
            self.nodes[spec.id] = _Node(spec)
        for spec in self.topology.brokers:
            if spec.parent is not None:
                self.links[spec.id] = _Link(self.nodes[spec.id], self.nodes[spec.parent],
                                            self._link_name)
        for c in plan.consumers:
            self.consumers.setdefault(c.broker, {})[c.sub] = c
        for spec in self.topology.brokers:   # parents first: each dials an up parent
            self._start(self.nodes[spec.id], 0.0, info=True)
        gc.freeze()
        for step in plan.steps:
            self._deliver(step.at)
            self.now = max(self.now, step.at)
            self._step(step)
        self._deliver(max(self.now, plan.end) + QUIET_S)
        outcome = rec.finish(self.now)
        rec.emit(self.now, RUNNER, "run.finished",
                 run_fields(plan, self.mode, self.name, self.topology, params))
        return {"virtual_s": self.now, "frames": self.frames,
                "frames_unfinished": self._queued(), "client_errors": self.client_errors,
                "outcome": outcome}

    # ------------------------------------------------------------------ frames
    def _deliver(self, until: float) -> None:
        """Hand over every queued frame, and fire every site timer, due at or before
        ``until``, in time order (a timer before a frame of the same time).

        Entries due at the same time are taken ``_BATCH`` at a time and handed over site
        by site (each site's frames in queue order, so every link stays FIFO): a mesh
        flood is thousands of fan-outs of one time, and a site that takes its frames in a
        row finds its tables still in the CPU cache (see the module docstring)."""
        q = self._q
        popleft = q.popleft
        timers = self._timers
        handle = self._handle
        while q or timers:
            t = q[0][0] if q else until + 1.0
            if timers and timers[0][0] <= t:
                if timers[0][0] > until:
                    break
                self._fire(heapq.heappop(timers))
                continue
            if t > until:
                break
            if len(q) == 1 or q[1][0] != t:
                _, frame, targets = popleft()
                for i in range(0, len(targets), 4):
                    handle(targets[i], targets[i + 1], frame, targets[i + 2],
                           targets[i + 3], t)
                continue
            by_site: dict[_Node, list] = {}
            get = by_site.get
            n = 0
            while q and n < _BATCH and q[0][0] == t:
                _, frame, targets = popleft()
                n += 1
                for i in range(0, len(targets), 4):
                    node = targets[i]
                    mine = get(node)
                    if mine is None:
                        by_site[node] = [frame, targets[i + 1], targets[i + 2],
                                         targets[i + 3]]
                    else:
                        mine += (frame, targets[i + 1], targets[i + 2], targets[i + 3])
            for node, mine in by_site.items():
                for i in range(0, len(mine), 4):
                    handle(node, mine[i + 1], mine[i], mine[i + 2], mine[i + 3], t)

    def _handle(self, node: _Node, conn: str, frame: Any, link: _Link, epoch: int,
                t: float) -> None:
        """One frame to one site: the engine's hot path."""
        if link.epoch != epoch:
            return       # sent on a link that has gone down since
        self.now = t
        self.frames += 1
        site = node.site
        self._perform(node, site.handle_frame(conn, frame, t), t)
        if self._acks:
            self._run_acks(t)
        deadline = site.next_deadline()
        if deadline is not None and deadline != node.armed:
            self._arm(node, deadline)
        timers = self._timers
        while timers and timers[0][0] <= t:
            # a timer due now goes before the rest of this time's frames
            self._fire(heapq.heappop(timers))
        if self.frames >= self._next_report:
            self._next_report = self.frames + _PROGRESS_EVERY
            gc.freeze()
            if self.progress is not None:
                self.progress({"t": t, "frames": self.frames, "queued": len(self._q)})

    def _queued(self) -> int:
        """Frames still queued (an entry holds 4 slots per receiving end)."""
        return sum(len(targets) for _, _, targets in self._q) // 4

    def _arm(self, node: _Node, deadline: float) -> None:
        node.armed = deadline
        heapq.heappush(self._timers, (deadline, next(self._seq), node))

    def _fire(self, entry: tuple[float, int, _Node]) -> None:
        deadline, _, node = entry
        if not node.alive or node.armed != deadline:
            return     # a stale entry: the site died, or re-armed for another time
        node.armed = None
        self.now = max(self.now, deadline)
        self._act(node, node.site.handle_timer(self.now))

    def _perform(self, node: _Node, actions: list, now: float) -> None:
        ends = node.ends
        when = now + self.latency
        q = self._q
        # Log lines are handed to the recorder in one batch per step (order kept);
        # a Close flushes them first, as it performs other nodes' steps
        logs: list | None = None
        for a in actions:
            kind = type(a)
            if kind is Log:
                if logs is None:
                    logs = [a]
                else:
                    logs.append(a)
            elif kind is Out:
                end = ends.get(a.conn)
                if end is not None:
                    link, peer, pconn = end
                    frame = a.frame
                    # a fan-out (one frame object to many links) shares one entry; only
                    # the last entry is joined, so the delivery order is unchanged
                    if q and (last := q[-1])[1] is frame and last[0] == when:
                        last[2].extend((peer, pconn, link, link.epoch))
                    else:
                        q.append((when, frame, [peer, pconn, link, link.epoch]))
                elif a.conn == APP_CONN:
                    frame = a.frame
                    if type(frame) is Deliver:
                        self._acks.append((node, Ack(frame.sub, frame.msg)))
                    elif type(frame) is Error:
                        self.client_errors += 1
            elif kind is StoreMessage:
                node.store.apply((a.msg,), ())
            elif kind is DeleteMessage:
                node.store.apply((), ((a.msg_id, a.dst),), (),
                                 (a.msg_id,) if a.consumed else ())
            elif kind is Drop:   # rendered in order with the other lines
                if logs is None:
                    logs = [a.log()]
                else:
                    logs.append(a.log())
            elif kind is Close:
                end = ends.get(a.conn)
                if end is not None:
                    if logs:
                        self.rec.emit_logs(now, node.id, logs)
                        logs = None
                    self._disconnect(end[0], now)
            # Pause / Resume: flow control needs limits, which scenarios do not set
        if logs:
            self.rec.emit_logs(now, node.id, logs)

    def _run_acks(self, now: float) -> None:
        acks = self._acks
        while acks:
            node, ack = acks.popleft()
            if node.alive:
                site = node.site
                self._perform(node, site.handle_frame(APP_CONN, ack, now), now)
                deadline = site.next_deadline()
                if deadline is not None and deadline != node.armed:
                    self._arm(node, deadline)

    def _act(self, node: _Node, actions: list) -> None:
        """Perform what a site entry point returned, then re-arm its timer."""
        self._perform(node, actions, self.now)
        if self._acks:
            self._run_acks(self.now)
        if node.alive:
            deadline = node.site.next_deadline()
            if deadline is not None and deadline != node.armed:
                self._arm(node, deadline)

    # ------------------------------------------------------------------ sites and links
    def _start(self, node: _Node, now: float, *, info: bool) -> None:
        """Create the node's Site, attach its consumers, dial its parent and accept its
        children (those that are running and not cut)."""
        spec = self.topology.broker(node.id)
        node.spec = spec
        tree, accept_children = site_position(self.mode, spec)
        node.site = Site(node.id, broker=Broker(node.id, log_messages=True), tree=tree,
                         accept_tree_children=accept_children, log_advisories=True,
                         sharing=self.sharing)
        node.alive = True
        if info:
            self.rec.emit(now, node.id, "broker.info", broker_info(self.mode, spec))
        self._act(node, node.site.client_connected(APP_CONN, now))
        stored = node.store.load()
        consumed = node.store.load_consumed()   # ids its consumers took before a restart
        if stored or consumed:
            self._act(node, node.site.broker.restore(stored, now, consumed))
        for c in self.consumers.get(node.id, {}).values():
            self._subscribe(node, c)
        if spec.parent is not None:
            self._connect(self.links[node.id])
        for child in self.topology.children(node.id):
            link = self.links.get(child)
            if link is not None and link.child.alive:
                self._connect(link)

    def _connect(self, link: _Link) -> None:
        child, parent = link.child, link.parent
        if link.up or link.cut or not child.alive or not parent.alive:
            return
        now = self.now
        settings = dial_settings(self.mode, child.spec)
        hello_child = child.site.hello(settings)
        hello_parent = parent.site.hello(reply_to=hello_child)
        link.epoch += 1
        link.up = True
        child.ends[link.child_conn] = (link, parent, link.parent_conn)
        parent.ends[link.parent_conn] = (link, child, link.child_conn)
        self._act(parent, parent.site.link_up(link.parent_conn, self._accept, hello_child,
                                              now, dialed=False))
        if link.up:  # the parent may have refused it
            self._act(child, child.site.link_up(link.child_conn, settings, hello_parent,
                                                now, dialed=True))

    def _disconnect(self, link: _Link, now: float) -> None:
        if not link.up:
            return
        link.up = False
        link.epoch += 1
        for node, conn in ((link.child, link.child_conn), (link.parent, link.parent_conn)):
            node.ends.pop(conn, None)
        for node, conn in ((link.child, link.child_conn), (link.parent, link.parent_conn)):
            if node.alive:
                self._act(node, node.site.link_down(conn, now))

    def _subscribe(self, node: _Node, c: PlannedConsumer) -> None:
        self._act(node, node.site.handle_frame(
            APP_CONN, Subscribe(c.sub, c.dst, c.selector), self.now))

    # ------------------------------------------------------------------ timeline
    def _step(self, step: Step) -> None:
        action = step.action
        nodes = self.nodes
        if action == "send":
            now = self.now
            body = b"x" * self.plan.scenario.workload.body_bytes
            for m in step.messages:
                node = nodes[m.broker]
                if node.alive:
                    self._act(node, node.site.handle_frame(
                        APP_CONN, Send(m.dst, m.id, dict(m.headers), body, m.persistent), now))
        elif action == "add_consumer":
            for c in step.consumers:
                self.consumers.setdefault(c.broker, {})[c.sub] = c
                node = nodes[c.broker]
                if node.alive:
                    self._subscribe(node, c)
        elif action == "remove_consumer":
            for c in step.consumers:
                self.consumers.get(c.broker, {}).pop(c.sub, None)
                node = nodes[c.broker]
                if node.alive:
                    self._act(node, node.site.handle_frame(APP_CONN, Unsubscribe(c.sub),
                                                           self.now))
        elif action == "cut_link":
            for t in step.targets:
                link = self.links[t]
                link.cut = True
                self._disconnect(link, self.now)
        elif action == "restore_link":
            for t in step.targets:
                link = self.links[t]
                link.cut = False
                self._connect(link)
        elif action == "kill_broker":
            for t in step.targets:
                self._kill(nodes[t])
        elif action == "restart_broker":
            for t in step.targets:
                node = nodes[t]
                if node.alive:
                    self._kill(node)
                self._start(node, self.now, info=False)
        elif action == "insert_layer":
            self._insert_layer(step)
        else:  # pragma: no cover - spec.py validates actions
            raise ValueError(f"unknown step {action!r}")

    def _kill(self, node: _Node) -> None:
        """Abrupt stop: peers see their links drop; nothing of the site survives but
        its store."""
        node.alive = False
        self.rec.killed(node.id)
        for conn, (link, _peer, _pconn) in list(node.ends.items()):
            self._disconnect(link, self.now)
        node.site = None
        node.ends.clear()
        node.armed = None

    def _insert_layer(self, step: Step) -> None:
        old, new = self.topology, step.topology
        self.topology = new
        for spec in new.brokers:
            if spec.id not in self.nodes:    # the new layer, parents before children
                node = self.nodes[spec.id] = _Node(spec)
                self.links[spec.id] = _Link(node, self.nodes[spec.parent], self._link_name)
                self._start(node, self.now, info=True)
        for spec in new.brokers:
            node = self.nodes[spec.id]
            node.spec = spec
            if spec.id not in old or spec.parent is None \
                    or old.broker(spec.id).parent == spec.parent:
                continue
            # re-parented: drop the old link, dial the new parent
            link = self.links[spec.id]
            self._disconnect(link, self.now)
            fresh = _Link(node, self.nodes[spec.parent], self._link_name)
            fresh.cut = link.cut
            self.links[spec.id] = fresh
            self._connect(fresh)
