"""Who connects to whom: an estate's links from its brokers' addresses, and the tree in it.

Theory of operation
-------------------
An estate is known only through its brokers' configurations: each broker *listens* on some
addresses and each connector *dials* some addresses.  ``resolve_links`` matches every
dialed address to the broker listening there and returns the directed links (dialer ->
acceptor, with the connector's name and kind); what it cannot match is returned as an
``Unresolved`` with the reason, never dropped.

Matching, first rule that gives exactly one broker wins:

1. the same host and port (host names compared case-insensitively);
2. a broker listening on a wildcard or loopback host (``0.0.0.0``, ``::``, ``localhost``,
   ``127.0.0.1``) on that port whose id is the dialed host's first label
   (``tcp://region-uk.example.com:61616`` -> broker ``region-uk``): how estates where every
   broker listens on ``0.0.0.0:61616`` on its own machine are written;
3. the only broker listening on that port.

``infer_tree`` reads a rooted tree out of the undirected link graph: it refuses, with one
reason per problem, a graph that is disconnected or has a cycle (naming the broker linked
to two parents, e.g. a store linked to two regions).  The root is ``root`` if given, else
the one broker every link points towards (in ActiveMQ estates children dial their parent),
else the graph's centre (ties broken by id).  Pure: no I/O.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable

__all__ = ["Address", "Dial", "Link", "Unresolved", "Tree", "NotATree", "resolve_links",
           "infer_tree", "spanning_tree", "WILDCARD_HOSTS"]

WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "localhost", "127.0.0.1", "::1", "*", ""})


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Dial:
    """One address a broker's connector dials."""

    broker: str         # the dialing broker
    connector: str      # the connector's name
    kind: str           # "mesh" | "tree"
    address: Address


@dataclass(frozen=True, slots=True)
class Link:
    dialer: str
    acceptor: str
    connector: str
    kind: str
    address: Address | None = None    # what the dialer dials (the acceptor's address)


@dataclass(frozen=True, slots=True)
class Unresolved:
    dial: Dial
    reason: str


def resolve_links(listeners: dict[str, Iterable[Address]],
                  dials: Iterable[Dial]) -> tuple[list[Link], list[Unresolved]]:
    """Match every dial to the broker listening there (see the module docstring)."""
    exact: dict[tuple[str, int], set[str]] = {}
    wild: dict[int, set[str]] = {}
    by_port: dict[int, set[str]] = {}
    for broker, addresses in listeners.items():
        for a in addresses:
            exact.setdefault((a.host.lower(), a.port), set()).add(broker)
            by_port.setdefault(a.port, set()).add(broker)
            if a.host.lower() in WILDCARD_HOSTS:
                wild.setdefault(a.port, set()).add(broker)
    links: list[Link] = []
    unresolved: list[Unresolved] = []
    for d in dials:
        host, port = d.address.host.lower(), d.address.port
        label = host.split(".")[0]
        candidates = [
            exact.get((host, port), set()),
            {b for b in wild.get(port, ()) if b.lower() == label or b.lower() == host},
            by_port.get(port, set()),
        ]
        found = next((c for c in candidates if len(c) == 1), None)
        if found is None:
            everyone = by_port.get(port, set())
            if not everyone:
                reason = f"no imported broker listens on port {port}"
            else:
                shown = ", ".join(sorted(everyone)[:4]) + (", ..." if len(everyone) > 4 else "")
                reason = (f"{len(everyone)} brokers listen on port {port} ({shown}) and "
                          f"none is named {label!r} or listens on {d.address.host}")
            unresolved.append(Unresolved(d, reason))
            continue
        (acceptor,) = found
        if acceptor == d.broker:
            unresolved.append(Unresolved(d, "the connector dials its own broker"))
            continue
        links.append(Link(d.broker, acceptor, d.connector, d.kind, d.address))
    return links, unresolved


# --------------------------------------------------------------------------- trees


class NotATree(ValueError):
    """The link graph is not a tree; ``reasons`` says why, one line per problem."""

    def __init__(self, reasons: list[str]) -> None:
        super().__init__("; ".join(reasons))
        self.reasons = reasons


@dataclass(frozen=True, slots=True)
class Tree:
    root: str
    parent: dict[str, str | None]      # broker -> parent (None for the root)
    order: tuple[str, ...]             # breadth first, parents before children
    has_children: frozenset[str] = frozenset()   # filled in by __post_init__

    def __post_init__(self) -> None:
        # role() is asked for every broker: a set, not a scan of the tree per question
        object.__setattr__(self, "has_children",
                           frozenset(p for p in self.parent.values() if p is not None))

    def children(self, broker: str) -> list[str]:
        return [b for b in self.order if self.parent[b] == broker]

    def depth(self, broker: str) -> int:
        d, p = 0, self.parent[broker]
        while p is not None:
            d, p = d + 1, self.parent[p]
        return d

    def role(self, broker: str) -> str:
        """``root`` | ``branch`` | ``leaf`` (the tree connector's node types)."""
        if self.parent[broker] is None:
            return "root"
        return "branch" if broker in self.has_children else "leaf"


def _neighbours(brokers: Iterable[str], links: Iterable[Link]) -> dict[str, set[str]]:
    adj: dict[str, set[str]] = {b: set() for b in brokers}
    for link in links:
        adj[link.dialer].add(link.acceptor)
        adj[link.acceptor].add(link.dialer)
    return adj


def _components(adj: dict[str, set[str]]) -> list[list[str]]:
    seen: set[str] = set()
    out = []
    for start in sorted(adj):
        if start in seen:
            continue
        comp, todo = [], [start]
        seen.add(start)
        while todo:
            b = todo.pop()
            comp.append(b)
            for n in adj[b]:
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        out.append(sorted(comp))
    return out


def _bfs(adj: dict[str, set[str]], root: str) -> tuple[dict[str, str | None], list[str],
                                                         list[tuple[str, str]]]:
    """Parents, order, and the non-tree edges met (each once)."""
    parent: dict[str, str | None] = {root: None}
    order = [root]
    extra: list[tuple[str, str]] = []
    queue = deque([root])
    while queue:
        b = queue.popleft()
        for n in sorted(adj[b]):
            if n not in parent:
                parent[n] = b
                order.append(n)
                queue.append(n)
            elif parent[b] != n and (n, b) not in extra:
                extra.append((b, n))
    return parent, order, extra


def _path(parent: dict[str, str | None], b: str) -> list[str]:
    out = [b]
    while parent[out[-1]] is not None:
        out.append(parent[out[-1]])  # type: ignore[arg-type]
    return out


def infer_tree(brokers: Iterable[str], links: Iterable[Link], *,
               root: str | None = None) -> Tree:
    """The rooted tree the links form, or NotATree with the reasons."""
    brokers = sorted(set(brokers))
    links = list(links)
    adj = _neighbours(brokers, links)
    reasons: list[str] = []
    if not brokers:
        raise NotATree(["the estate has no brokers"])
    comps = _components(adj)
    if len(comps) > 1:
        shown = "; ".join(", ".join(c[:3]) + (", ..." if len(c) > 3 else "") for c in comps[:4])
        reasons.append(f"the estate is {len(comps)} separate networks, not one tree ({shown})")
    if root is not None and root not in adj:
        raise NotATree([f"--root {root!r} is not a broker of the estate"])
    if root is None:
        root = _choose_root(brokers, links, adj, comps[0])
    parent, order, extra = _bfs(adj, root)
    for a, b in extra:
        # a is linked to b although b is not a's parent: a cycle through a and b
        up_a, up_b = _path(parent, a), _path(parent, b)
        common = next(x for x in up_a if x in set(up_b))
        cycle = up_a[:up_a.index(common) + 1] + list(reversed(up_b[:up_b.index(common)]))
        below, other = (a, b) if len(up_a) >= len(up_b) else (b, a)
        reasons.append(f"{below} is linked to {parent[below]} and to {other}: a cycle "
                       f"{' - '.join(cycle + [cycle[0]])} (a tree gives every broker one "
                       "parent)")
    if reasons:
        raise NotATree(reasons)
    return Tree(root, parent, tuple(order))


def _choose_root(brokers: list[str], links: list[Link], adj: dict[str, set[str]],
                 component: list[str]) -> str:
    dialed_out = {link.dialer for link in links}
    sinks = [b for b in component if b not in dialed_out and adj[b]]
    if len(sinks) == 1 and all(link.dialer != sinks[0] for link in links):
        return sinks[0]
    if len(component) == 1:
        return component[0]
    # the centre: smallest eccentricity, ties by id
    best, best_ecc = component[0], None
    for b in component:
        dist = {b: 0}
        queue = deque([b])
        while queue:
            x = queue.popleft()
            for n in adj[x]:
                if n not in dist:
                    dist[n] = dist[x] + 1
                    queue.append(n)
        ecc = max(dist.values())
        if best_ecc is None or ecc < best_ecc:
            best, best_ecc = b, ecc
    return best


def spanning_tree(brokers: Iterable[str], links: Iterable[Link], *,
                  root: str | None = None) -> Tree:
    """A breadth-first spanning tree from ``root`` (chosen as ``infer_tree`` chooses it):
    the tiers of an estate that is not a tree.  Brokers it cannot reach are left out."""
    brokers = sorted(set(brokers))
    links = list(links)
    adj = _neighbours(brokers, links)
    if root not in adj:
        root = _choose_root(brokers, links, adj, _components(adj)[0])
    parent, order, _ = _bfs(adj, root)
    return Tree(root, parent, tuple(order))
