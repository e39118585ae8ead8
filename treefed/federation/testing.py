"""Estate: many Sites with real core Brokers, wired together in one process, no I/O.

Theory of operation
-------------------
The federation twin of h11's ``ConnectionPair``: ``link(a, b, settings)`` performs the
hello exchange and ``link_up`` on both ends (``a`` dials), and every ``Out`` frame a Site
returns is queued FIFO to the other end of its wire.  ``run_until_quiet`` delivers queued
frames round by round (a round is everything queued when it starts) until nothing is
left, so a test observes exactly the frames the protocol sends, in order.

Client connections are simulated too: ``subscribe`` / ``send`` / ``ack`` feed client
frames to a Site, ``Deliver`` frames land in ``inbox`` and are acknowledged at once for
consumers subscribed with ``auto_ack=True``.  Wires carry a serial number so frames
queued before a link was cut are never delivered to a later link of the same name.
``Log`` actions are collected in ``logs`` as ``(broker, Log)``.  Message stores are not
simulated: Store/Delete actions are only counted.

Used by tests and reusable by the scenario runner's replay engine; it is deliberately
plain and synchronous, with ``now`` advanced only by ``advance``.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterable

from treefed.core.actions import Close, DeleteMessage, Drop, Log, Out, StoreMessage
from treefed.core.broker import Broker
from treefed.federation.settings import LinkSettings, TreeSettings
from treefed.federation.sharing import Sharing
from treefed.federation.site import Site
from treefed.wire.frames import Ack, Advisory, Deliver, Error, Forward, Nack, Send, \
    Subscribe, Unsubscribe

__all__ = ["Estate", "NotQuiet", "tree_estate"]


class NotQuiet(AssertionError):
    """Frames were still moving after ``max_rounds`` rounds (a routing loop?)."""


class Estate:
    """A set of Sites and the wires between them (see the module docstring)."""

    def __init__(self, *, now: float = 1_000.0, log_advisories: bool = True,
                 log_messages: bool = False) -> None:
        self.now = now
        self.log_advisories = log_advisories
        self.log_messages = log_messages
        self.sites: dict[str, Site] = {}
        self.logs: list[tuple[str, Log]] = []
        self.inbox: dict[tuple[str, str], list[Deliver]] = {}
        self.client_frames: dict[tuple[str, str], list[Any]] = {}
        self.forwards: list[tuple[str, str, Forward]] = []     # (from, to, frame)
        self.advisories: list[tuple[str, str, Advisory]] = []  # (from, to, frame)
        self.errors: list[tuple[str, str, Error]] = []         # (from, to, frame)
        self.stored = 0
        self.deleted = 0
        self._queue: deque = deque()
        self._wires: dict[tuple[str, str], tuple[str, str, int]] = {}
        self._serial = 0
        self._clients: set[tuple[str, str]] = set()
        self._auto_ack: dict[tuple[str, str, str], bool] = {}
        self._msg = 0
        self.sharing = Sharing()   # one set of shared tables for all its Sites
        #: ``advertise_down`` of the tree links ``tree_link`` makes (None: the default)
        self.advertise_down: tuple[str, ...] | None = None

    # -- building ------------------------------------------------------------------
    def add(self, name: str, *, tree: TreeSettings | None = None,
            accept_tree_children: bool = True, **broker_kwargs: Any) -> Site:
        broker_kwargs.setdefault("log_messages", self.log_messages)
        site = Site(name, broker=Broker(name, **broker_kwargs), tree=tree,
                    accept_tree_children=accept_tree_children,
                    log_advisories=self.log_advisories, sharing=self.sharing)
        self.sites[name] = site
        return site

    def link(self, dialer: str, acceptor: str, settings: LinkSettings = LinkSettings(), *,
             accept: LinkSettings | None = None) -> bool:
        """``dialer`` opens a link to ``acceptor``; True when both ends brought it up.
        ``accept`` is the acceptor's listener settings (default: same kind)."""
        a, b = self.sites[dialer], self.sites[acceptor]
        conn_a = f"L:{settings.name}:{acceptor}"
        conn_b = f"L:{settings.name}:{dialer}"
        self._serial += 1
        self._wires[(dialer, conn_a)] = (acceptor, conn_b, self._serial)
        self._wires[(acceptor, conn_b)] = (dialer, conn_a, self._serial)
        hello_a = a.hello(settings)
        hello_b = b.hello(reply_to=hello_a)
        if accept is None:
            accept = LinkSettings(kind=settings.kind, name=settings.name)
        acts_b = b.link_up(conn_b, accept, hello_a, self.now, dialed=False)
        acts_a = a.link_up(conn_a, settings, hello_b, self.now, dialed=True)
        self._perform(acceptor, acts_b)
        self._perform(dialer, acts_a)
        return (dialer, conn_a) in self._wires and a.bridge(conn_a) is not None \
            and b.bridge(conn_b) is not None

    def tree_link(self, child: str, parent: str, *, name: str = "tree") -> bool:
        """The child's tree connector to its parent (node_type from the child's site)."""
        tree = self.sites[child].tree
        node_type = tree.node_type if tree is not None and tree.node_type != "root" \
            else "leaf"
        return self.link(child, parent, LinkSettings(kind="tree", name=name,
                                                     node_type=node_type,
                                                     advertise_down=self.advertise_down))

    def unlink(self, a: str, b: str, name: str | None = None) -> None:
        """Cut the link(s) between ``a`` and ``b`` (all names, or just ``name``)."""
        for (site, conn), (peer, _pconn, _serial) in list(self._wires.items()):
            if site == a and peer == b and (name is None or conn == f"L:{name}:{b}"):
                self._close_wire(site, conn)

    def wires(self) -> list[tuple[str, str]]:
        return sorted({tuple(sorted((s, p))) for (s, _), (p, _, _) in self._wires.items()})

    # -- clients -------------------------------------------------------------------
    def subscribe(self, site: str, sub: str, dst: str, *, conn: str = "c",
                  selector: str | None = None, prefetch: int = 1000, priority: int = 0,
                  auto_ack: bool = True) -> None:
        self._auto_ack[(site, conn, sub)] = auto_ack
        self._client(site, conn, Subscribe(sub, dst, selector, prefetch, priority))

    def unsubscribe(self, site: str, sub: str, *, conn: str = "c") -> None:
        self._client(site, conn, Unsubscribe(sub))

    def close_client(self, site: str, conn: str = "c") -> None:
        if (site, conn) in self._clients:
            self._clients.discard((site, conn))
            self._perform(site, self.sites[site].client_closed(conn, self.now))

    def send(self, site: str, dst: str, msg_id: str | None = None, *, conn: str = "p",
             headers: dict | None = None, persistent: bool = False, ttl: int = 0,
             reply_to: str | None = None, count: int = 1) -> list[str]:
        """Produce ``count`` messages at ``site``; returns their ids."""
        ids = []
        for _ in range(count):
            if msg_id is None or count > 1:
                self._msg += 1
                mid = f"{site}-m{self._msg}"
            else:
                mid = msg_id
            self._client(site, conn, Send(dst, mid, dict(headers or {}), b"", persistent,
                                          4, ttl, reply_to))
            ids.append(mid)
        return ids

    def ack(self, site: str, sub: str, msg: str, *, conn: str = "c") -> None:
        self._client(site, conn, Ack(sub, msg))

    def ack_all(self, site: str, *, conn: str = "c") -> int:
        """Acknowledge everything delivered to ``conn`` so far; returns how many."""
        box = self.inbox.get((site, conn), [])
        for frame in box:
            self._queue.append((site, conn, Ack(frame.sub, frame.msg), 0))
        return len(box)

    def nack(self, site: str, sub: str, msg: str, *, conn: str = "c") -> None:
        self._client(site, conn, Nack(sub, msg))

    def inject(self, site: str, conn: str, frame: Any) -> None:
        """Hand ``frame`` to ``site`` as if it arrived on ``conn`` (hostile peers)."""
        self._perform(site, self.sites[site].handle_frame(conn, frame, self.now))

    def conn_to(self, site: str, peer: str, name: str | None = None) -> str:
        for (s, conn), (p, _, _) in self._wires.items():
            if s == site and p == peer and (name is None or conn == f"L:{name}:{peer}"):
                return conn
        raise KeyError(f"no link {site} -> {peer}")

    # -- running -------------------------------------------------------------------
    def run_until_quiet(self, max_rounds: int = 10_000) -> int:
        """Deliver queued frames until none is left; returns how many were delivered."""
        moved = rounds = 0
        while self._queue:
            rounds += 1
            if rounds > max_rounds:
                raise NotQuiet(f"{len(self._queue)} frames still queued after {max_rounds}")
            batch, self._queue = self._queue, deque()
            for site, conn, frame, serial in batch:
                if serial and self._wires.get((site, conn), (None, None, -1))[2] != serial:
                    continue  # the wire it was sent on is gone
                moved += 1
                self._perform(site, self.sites[site].handle_frame(conn, frame, self.now))
        return moved

    def advance(self, seconds: float) -> None:
        """Move the clock and fire due timers on every site."""
        self.now += seconds
        for name, site in self.sites.items():
            deadline = site.next_deadline()
            if deadline is not None and deadline <= self.now:
                self._perform(name, site.handle_timer(self.now))

    # -- observing -----------------------------------------------------------------
    def delivered(self, site: str, conn: str = "c", sub: str | None = None) -> list[str]:
        return [f.msg for f in self.inbox.get((site, conn), []) if sub is None or f.sub == sub]

    def events(self, event: str, *, broker: str | None = None, **match: Any) -> list[dict]:
        out = []
        for name, log in self.logs:
            if log.event != event or (broker is not None and name != broker):
                continue
            if all(log.fields.get(k) == v for k, v in match.items()):
                out.append({"broker": name, **log.fields})
        return out

    def count(self, event: str, **match: Any) -> int:
        return len(self.events(event, **match))

    def held(self, site: str, dst: str) -> int:
        """Messages of ``dst`` held at ``site`` (pending plus in flight)."""
        stats = self.sites[site].broker.statistics()
        info = stats.get("destinations", {}).get(dst)
        return int(info.get("depth", 0)) if info else 0

    def forwarded(self, src: str | None = None, dst: str | None = None) -> list[Forward]:
        return [f for s, d, f in self.forwards
                if (src is None or s == src) and (dst is None or d == dst)]

    def sent_advisories(self, src: str | None = None, dst: str | None = None,
                        kind: str = "add") -> list[Advisory]:
        return [f for s, d, f in self.advisories
                if f.kind == kind and (src is None or s == src) and (dst is None or d == dst)]

    # -- plumbing ------------------------------------------------------------------
    def _client(self, site: str, conn: str, frame: Any) -> None:
        if (site, conn) not in self._clients:
            self._clients.add((site, conn))
            self._perform(site, self.sites[site].client_connected(conn, self.now))
        self._perform(site, self.sites[site].handle_frame(conn, frame, self.now))

    def _perform(self, site: str, actions: Iterable[Any]) -> None:
        for action in actions:
            kind = type(action)
            if kind is Out:
                self._out(site, action.conn, action.frame)
            elif kind is Log:
                self.logs.append((site, action))
            elif kind is Close:
                if (site, action.conn) in self._wires:
                    self._close_wire(site, action.conn)
                elif (site, action.conn) in self._clients:
                    self.close_client(site, action.conn)
            elif kind is StoreMessage:
                self.stored += 1
            elif kind is DeleteMessage:
                self.deleted += 1
            elif kind is Drop:
                self.logs.append((site, action.log()))

    def _out(self, site: str, conn: str, frame: Any) -> None:
        wire = self._wires.get((site, conn))
        if wire is not None:
            peer, pconn, serial = wire
            kind = type(frame)
            if kind is Forward:
                self.forwards.append((site, peer, frame))
            elif kind is Advisory:
                self.advisories.append((site, peer, frame))
            elif kind is Error:
                self.errors.append((site, peer, frame))
            self._queue.append((peer, pconn, frame, serial))
            return
        if conn.startswith("L:"):
            return  # a link that is already gone
        if type(frame) is Deliver:
            self.inbox.setdefault((site, conn), []).append(frame)
            if self._auto_ack.get((site, conn, frame.sub), True):
                self._queue.append((site, conn, Ack(frame.sub, frame.msg), 0))
        else:
            self.client_frames.setdefault((site, conn), []).append(frame)

    def _close_wire(self, site: str, conn: str) -> None:
        wire = self._wires.pop((site, conn), None)
        if wire is None:
            return
        peer, pconn, _ = wire
        self._wires.pop((peer, pconn), None)
        self._perform(site, self.sites[site].link_down(conn, self.now))
        self._perform(peer, self.sites[peer].link_down(pconn, self.now))


def tree_estate(levels: list[int], *, mode: str = "tree",
                mesh: LinkSettings | None = None, route_unknown_up: bool = True,
                max_demand_per_link: int = 100_000, log_advisories: bool = True,
                advertise_down: tuple[str, ...] | None = None,
                ) -> tuple[Estate, list[list[str]]]:
    """A tree-shaped estate: root ``HQ``, ``levels[0]`` regions ``R1``..., each holding
    ``levels[1]`` children ``R1.1``... and so on.  ``mode="tree"`` links it with tree
    connectors, ``mode="mesh"`` with ``mesh`` settings dialed from child to parent.
    ``advertise_down``: the kinds interest from above is sent down for (None: the
    LinkSettings default; ``("queue", "topic")``: the plain AMQ-2875 rule).
    Returns the estate and the broker names per level (root first)."""
    estate = Estate(log_advisories=log_advisories)
    estate.advertise_down = advertise_down
    names: list[list[str]] = [["HQ"]]
    for depth, fanout in enumerate(levels, 1):
        names.append([f"R{i}" if depth == 1 else f"{parent}.{i}"
                      for parent in names[-1] for i in range(1, fanout + 1)])
    last = len(names) - 1
    for depth, level in enumerate(names):
        for name in level:
            tree = None
            if mode == "tree":
                node_type = "root" if depth == 0 else "leaf" if depth == last else "branch"
                tree = TreeSettings(node_type, route_unknown_up)
            estate.add(name, tree=tree)
    for depth, level in enumerate(names[1:], 1):
        for name in level:
            parent = name.rpartition(".")[0] if depth > 1 else "HQ"
            if mode == "tree":
                tree = estate.sites[name].tree
                estate.link(name, parent, LinkSettings(
                    kind="tree", name="tree", node_type=tree.node_type,
                    route_unknown_up=route_unknown_up,
                    max_demand_per_link=max_demand_per_link,
                    advertise_down=advertise_down))
            else:
                estate.link(name, parent, mesh or LinkSettings(duplex=True))
    estate.run_until_quiet()
    return estate, names
