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

Memory (a mesh estate holds millions of demand subscriptions, nearly all on literal
names): with ``flat_literals=True`` a literal pattern is one entry of a plain dict --
its single item stored bare, a dict only from the second item on -- and only wildcard
patterns live in the trie; a lookup then costs one dict probe plus the (usually empty)
trie walk, and needs no cache while no wildcard pattern exists.  ``select`` on such an
index scans the literal names (use the trie layout, the default, for a reverse index).
Trie nodes share one empty dict until they get a child or an item.

Invariants: an item appears at most once per pattern and at most once in any result;
nodes with neither items nor children are pruned, so memory follows the live patterns.
Never: parses or validates names (callers pass canonical destinations), does I/O.
"""

from __future__ import annotations

from typing import Any, Hashable

from treefed.core.destinations import matches

__all__ = ["SubscriptionIndex"]


#: Shared by every node until it gets a child or an item (an empty dict is 64 bytes and
#: most nodes of a literal-heavy trie have one of the two only).  Never mutated: every
#: insertion site swaps in a fresh dict first.
_EMPTY: dict = {}


class _Node:
    __slots__ = ("children", "items")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = _EMPTY   # segment (or '*' / '>') -> child
        self.items: dict[Any, None] = _EMPTY       # ordered set of items whose pattern ends here


_MISSING = object()


def _split(pattern: str) -> tuple[str, list[str]]:
    scheme, _, name = pattern.partition("://")
    return scheme, name.split(".")


def _is_literal(pattern: str) -> bool:
    return "*" not in pattern and ">" not in pattern


class SubscriptionIndex:
    """Patterns -> items, answering ``match(dst)`` from a trie with a result cache."""

    __slots__ = ("_roots", "_cache", "_cache_size", "_count", "_nodes",
                 "_inserts", "_removes", "_matches", "_hits", "_flat")

    def __init__(self, *, cache_size: int = 4096, flat_literals: bool = False) -> None:
        self._roots: dict[str, _Node] = {}          # kind ("queue", "topic"...) -> root
        # flat_literals: literal pattern -> its item, or a dict (ordered set) of items
        self._flat: dict[str, Any] | None = {} if flat_literals else None
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
        flat = self._flat
        if flat is not None and _is_literal(pattern):
            held = flat.get(pattern, _MISSING)
            if held is _MISSING:
                flat[pattern] = item
            elif type(held) is dict:   # items are hashable, so never a dict themselves
                if item in held:
                    return False
                held[item] = None
            elif held == item:
                return False
            else:
                flat[pattern] = {held: None, item: None}
            self._count += 1
            self._inserts += 1
            if self._roots:
                self._cache.pop(pattern, None)
            return True
        scheme, segs = _split(pattern)
        node = self._roots.get(scheme)
        if node is None:
            node = self._roots[scheme] = _Node()
        for seg in segs:
            child = node.children.get(seg)
            if child is None:
                if node.children is _EMPTY:
                    node.children = {}
                child = node.children[seg] = _Node()
                self._nodes += 1
            node = child
        if item in node.items:
            return False
        if node.items is _EMPTY:
            node.items = {}
        node.items[item] = None
        self._count += 1
        self._inserts += 1
        self._invalidate(pattern)
        return True

    def remove(self, pattern: str, item: Hashable) -> bool:
        """Remove ``item`` from ``pattern``; False if it was not there."""
        flat = self._flat
        if flat is not None and _is_literal(pattern):
            held = flat.get(pattern, _MISSING)
            if type(held) is dict:
                if item not in held:
                    return False
                del held[item]
                if len(held) == 1:
                    flat[pattern] = next(iter(held))
            elif held is _MISSING or held != item:
                return False
            else:
                del flat[pattern]
            self._count -= 1
            self._removes += 1
            if self._roots:
                self._cache.pop(pattern, None)
            return True
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
        if not node.items:
            node.items = _EMPTY
        self._count -= 1
        self._removes += 1
        # Prune the now-empty tail so dead patterns cost no memory.
        for parent, seg in reversed(trail):
            child = parent.children[seg]
            if child.items or child.children:
                break
            del parent.children[seg]
            if not parent.children:
                parent.children = _EMPTY
            self._nodes -= 1
        if not self._roots[scheme].children:
            del self._roots[scheme]
        self._invalidate(pattern)
        return True

    def match(self, dst: str) -> tuple:
        """Items whose pattern matches concrete ``dst``, each once, deterministic order."""
        self._matches += 1
        flat = self._flat
        if flat is not None and not self._roots:   # no wildcard anywhere: no cache needed
            held = flat.get(dst, _MISSING)
            if held is _MISSING:
                return ()
            return tuple(held) if type(held) is dict else (held,)
        hit = self._cache.get(dst)
        if hit is not None:
            self._hits += 1
            return hit
        scheme, segs = _split(dst)
        root = self._roots.get(scheme)
        out: list = []
        if flat is not None:
            held = flat.get(dst, _MISSING)
            if held is not _MISSING:
                if type(held) is dict:
                    out.extend(held)
                else:
                    out.append(held)
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
        flat = self._flat
        if flat:
            if _is_literal(pattern):
                names = (pattern,) if pattern in flat else ()
            else:
                names = [n for n in flat if matches(pattern, n)]
            for name in names:
                held = flat[name]
                if type(held) is dict:
                    out.extend(held)
                else:
                    out.append(held)
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
