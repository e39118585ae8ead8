"""The subscription index: a trie of destination patterns, like nats-server's sublist.

Theory of operation
-------------------
A pattern ``kind://A.*.C`` is stored as a path of segment nodes under a root per kind;
``*`` and ``>`` are ordinary child keys, so a lookup for a concrete destination walks at
most three branches per level (the literal segment, ``*`` and ``>``) instead of testing
every pattern.  ``>`` at a node matches one or more remaining segments.  Items are kept
per node in insertion order (a dict used as an ordered set), so results are
deterministic.

``match(dst)`` answers "which items' patterns match this concrete destination" and
caches its answer per destination.  A change to a literal pattern invalidates only that
destination's cache entry; a change to a wildcard pattern may affect any destination, so
it clears the cache.  The cache is bounded and simply cleared when full: a broker with
thousands of demand subscriptions sees far fewer distinct destinations than messages.

``select(pattern)`` answers the reverse question for an index whose keys are concrete
names: "which stored names does this pattern match" -- the broker keeps its live
destinations in a second index so a new wildcard subscription finds them without a scan.

Invariants: an item appears at most once per pattern and at most once in any result;
nodes with neither items nor children are pruned, so memory follows the live patterns.
Never: parses or validates names (callers pass canonical destinations), does I/O.
"""

from __future__ import annotations

from typing import Any, Hashable

__all__ = ["SubscriptionIndex"]


class _Node:
    __slots__ = ("children", "items")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}   # segment (or '*' / '>') -> child
        self.items: dict[Any, None] = {}       # ordered set of items whose pattern ends here


def _split(pattern: str) -> tuple[str, list[str]]:
    scheme, _, name = pattern.partition("://")
    return scheme, name.split(".")


def _is_literal(pattern: str) -> bool:
    return "*" not in pattern and ">" not in pattern


class SubscriptionIndex:
    """Patterns -> items, answering ``match(dst)`` from a trie with a result cache."""

    __slots__ = ("_roots", "_cache", "_cache_size", "_count", "_nodes",
                 "_inserts", "_removes", "_matches", "_hits")

    def __init__(self, *, cache_size: int = 4096) -> None:
        self._roots: dict[str, _Node] = {}          # kind ("queue", "topic"...) -> root
        self._cache: dict[str, tuple] = {}          # dst -> match result
        self._cache_size = cache_size               # entries kept before clearing
        self._count = 0                             # (pattern, item) pairs stored
        self._nodes = 0                             # trie nodes below the roots
        self._inserts = 0
        self._removes = 0
        self._matches = 0
        self._hits = 0

    def __len__(self) -> int:
        return self._count

    def insert(self, pattern: str, item: Hashable) -> bool:
        """Store ``item`` under ``pattern``; False if it was already there."""
        scheme, segs = _split(pattern)
        node = self._roots.get(scheme)
        if node is None:
            node = self._roots[scheme] = _Node()
        for seg in segs:
            child = node.children.get(seg)
            if child is None:
                child = node.children[seg] = _Node()
                self._nodes += 1
            node = child
        if item in node.items:
            return False
        node.items[item] = None
        self._count += 1
        self._inserts += 1
        self._invalidate(pattern)
        return True

    def remove(self, pattern: str, item: Hashable) -> bool:
        """Remove ``item`` from ``pattern``; False if it was not there."""
        scheme, segs = _split(pattern)
        node = self._roots.get(scheme)
        if node is None:
            return False
        trail: list[tuple[_Node, str]] = []
        for seg in segs:
            child = node.children.get(seg)
            if child is None:
                return False
            trail.append((node, seg))
            node = child
        if item not in node.items:
            return False
        del node.items[item]
        self._count -= 1
        self._removes += 1
        # Prune the now-empty tail so dead patterns cost no memory.
        for parent, seg in reversed(trail):
            child = parent.children[seg]
            if child.items or child.children:
                break
            del parent.children[seg]
            self._nodes -= 1
        if not self._roots[scheme].children:
            del self._roots[scheme]
        self._invalidate(pattern)
        return True

    def match(self, dst: str) -> tuple:
        """Items whose pattern matches concrete ``dst``, each once, deterministic order."""
        self._matches += 1
        hit = self._cache.get(dst)
        if hit is not None:
            self._hits += 1
            return hit
        scheme, segs = _split(dst)
        root = self._roots.get(scheme)
        out: list = []
        if root is not None:
            _collect(root, segs, 0, out)
        result = tuple(dict.fromkeys(out)) if len(out) > 1 else tuple(out)
        if len(self._cache) >= self._cache_size:
            self._cache.clear()
        self._cache[dst] = result
        return result

    def select(self, pattern: str) -> list:
        """Items stored under concrete names that ``pattern`` matches (the reverse query)."""
        scheme, segs = _split(pattern)
        root = self._roots.get(scheme)
        out: list = []
        if root is not None:
            _select(root, segs, 0, out)
        return list(dict.fromkeys(out)) if len(out) > 1 else out

    def statistics(self) -> dict:
        """JSON-able counters: stored subscriptions, trie nodes, lookups, cache hits."""
        return {
            "subscriptions": self._count,
            "nodes": self._nodes,
            "inserts": self._inserts,
            "removes": self._removes,
            "matches": self._matches,
            "cache_hits": self._hits,
            "cache_hit_rate": round(self._hits / self._matches, 4) if self._matches else 0.0,
            "cache_size": len(self._cache),
        }

    def _invalidate(self, pattern: str) -> None:
        if _is_literal(pattern):
            self._cache.pop(pattern, None)
        else:
            self._cache.clear()


def _collect(node: _Node, segs: list[str], i: int, out: list) -> None:
    children = node.children
    if i == len(segs):
        out.extend(node.items)
        return
    if children:
        gt = children.get(">")
        if gt is not None:
            out.extend(gt.items)
        child = children.get(segs[i])
        if child is not None:
            _collect(child, segs, i + 1, out)
        star = children.get("*")
        if star is not None:
            _collect(star, segs, i + 1, out)


def _select(node: _Node, segs: list[str], i: int, out: list) -> None:
    if i == len(segs):
        out.extend(node.items)
        return
    seg = segs[i]
    if seg == ">":
        for child in node.children.values():
            _descendants(child, out)
    elif seg == "*":
        for child in node.children.values():
            _select(child, segs, i + 1, out)
    else:
        child = node.children.get(seg)
        if child is not None:
            _select(child, segs, i + 1, out)


def _descendants(node: _Node, out: list) -> None:
    out.extend(node.items)
    for child in node.children.values():
        _descendants(child, out)
