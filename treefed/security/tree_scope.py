"""Tree scope: what a child link may advertise and send, derived from its place in the tree.

Theory of operation
-------------------
A tree link's child is identified by its (authenticated) broker id.  Its *scope* is

* ``child_patterns`` with ``{child}`` bound to that id and ``{subtree}`` bound to every
  broker id the child has announced below itself (the child included) — a store gets
  ``queue://Store.{child}.>``, a region ``queue://Store.{subtree}.>``, i.e. its stores';
* plus ``broadcast`` destinations, which any child may both advertise and send on;
* plus ``upward`` destinations, which any child may *send* (store -> HQ traffic) but not
  advertise: interest in them would pull other sites' messages down;
* plus temporary destinations unless ``temp_destinations=False``: a reply crossing the
  tree travels on the requester's temp queue, whose name is unguessable and owned by
  one connection (the core enforces that).  Named ones only: a wildcard over temp names
  is never in scope, and the Site refuses a named one not created in the child's
  subtree (``federation/temps.py``, issue #12 defect 3).

An advisory (interest) from the child must be covered by its scope, so a compromised
store cannot register demand for — and so receive — another store's queue, not even with
a wildcard subscription that would include it.  A forwarded message must name a
destination in the scope or in ``upward``.

A leaf's subtree is itself and nothing else: ids it names in advisory paths are spoofs,
so ``ChildScope.add_subtree`` ignores them for leaves.  A branch's subtree grows as it
announces brokers below it (the Site's subtree-ownership bookkeeping decides which ids a
branch may claim); cached refusals are dropped when it grows, cached grants stay valid.

Never: does I/O or logs; it answers, the caller refuses and logs the reason.
"""

from __future__ import annotations

from collections.abc import Iterable

from treefed.core.destinations import is_wildcard
from treefed.security.patterns import Pattern, compile_pattern

__all__ = ["TreeScope", "ChildScope", "PLACEHOLDERS"]

PLACEHOLDERS = ("child", "subtree")
#: answers cached per child and kind; a peer naming endless destinations cannot grow it
_CACHE_LIMIT = 10_000


def _named_temp(dst: str) -> bool:
    """One temp destination by name (a wildcard over temp names is never in scope: the
    Site also checks that a named one was created in the child's subtree)."""
    return dst.startswith("temp-") and not is_wildcard(dst)


class TreeScope:
    """The configured confinement of tree children (``[security.tree]``)."""

    __slots__ = ("confine", "child_patterns", "broadcast", "upward", "temp")

    def __init__(self, child_patterns: Iterable[str] = (), broadcast: Iterable[str] = (),
                 upward: Iterable[str] = (), *, confine: bool = True,
                 temp_destinations: bool = True) -> None:
        self.confine = confine
        self.temp = temp_destinations   # request/reply across the tree needs temp queues
        self.child_patterns = tuple(compile_pattern(p, PLACEHOLDERS) for p in child_patterns)
        self.broadcast = tuple(compile_pattern(p) for p in broadcast)
        self.upward = tuple(compile_pattern(p) for p in upward)

    def for_child(self, child: str, *, leaf: bool = False) -> ChildScope:
        """A scope for one child link, to keep for the life of the link."""
        return ChildScope(self, child, leaf=leaf)


class ChildScope:
    """One child link's scope; answers are cached per destination."""

    __slots__ = ("scope", "child", "leaf", "subtree", "_bindings", "_advertise", "_send")

    def __init__(self, scope: TreeScope, child: str, *, leaf: bool = False) -> None:
        self.scope = scope
        self.child = child
        self.leaf = leaf
        self.subtree: set[str] = {child}
        self._bindings = {"child": (child,), "subtree": self.subtree}
        self._advertise: dict[str, bool] = {}
        self._send: dict[str, bool] = {}

    def add_subtree(self, broker_ids: Iterable[str]) -> None:
        """The child announced these brokers below it (ignored for a leaf)."""
        if self.leaf:
            return
        before = len(self.subtree)
        self.subtree.update(broker_ids)
        if len(self.subtree) != before:
            # a refusal may now be a grant; grants cannot become refusals by growing
            self._advertise = {d: a for d, a in self._advertise.items() if a}
            self._send = {d: a for d, a in self._send.items() if a}

    def _covered(self, patterns: tuple[Pattern, ...], dst: str) -> bool:
        bindings = self._bindings
        for pattern in patterns:
            if pattern.covers(dst, bindings):
                return True
        return False

    def may_advertise(self, dst: str) -> bool:
        """May the child register interest in ``dst`` (canonical, wildcards allowed)?"""
        answer = self._advertise.get(dst)
        if answer is None:
            scope = self.scope
            answer = (not scope.confine or (scope.temp and _named_temp(dst))
                      or self._covered(scope.child_patterns, dst)
                      or self._covered(scope.broadcast, dst))
            if len(self._advertise) >= _CACHE_LIMIT:
                self._advertise.clear()
            self._advertise[dst] = answer
        return answer

    def may_send(self, dst: str) -> bool:
        """May the child forward a message to ``dst`` (canonical)?"""
        answer = self._send.get(dst)
        if answer is None:
            scope = self.scope
            answer = (not scope.confine or (scope.temp and _named_temp(dst))
                      or self._covered(scope.child_patterns, dst)
                      or self._covered(scope.broadcast, dst)
                      or self._covered(scope.upward, dst))
            if len(self._send) >= _CACHE_LIMIT:
                self._send.clear()
            self._send[dst] = answer
        return answer

    def describe(self) -> str:
        """The scope as text for log lines and error messages."""
        scope = self.scope
        parts = [p.text for p in scope.child_patterns + scope.broadcast]
        return (f"{self.child} may advertise {', '.join(parts) or 'nothing'}"
                f" ({{child}}={self.child}, {{subtree}}={len(self.subtree)} brokers)")
