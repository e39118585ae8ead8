"""MergedSelector: a tree conduit's selector kept as its members, each compiled once.

Theory of operation
-------------------
A tree conduit (one demand consumer per link and destination) must forward what *any*
of its members' consumers can take.  Merging the member selectors into one
``(a) OR (b) OR ...`` text and recompiling it at every subscribe / unsubscribe made a
change cost O(all members) on the broker's one task, and past 4,096 characters the
merged text was refused as malformed (issue 12, defect 5).

Instead the conduit holds one ``MergedSelector``: a reference-counted set of member
selectors, each compiled once (``compile_selector`` also memoises across conduits).
``matches`` is "any member matches" -- exactly the SQL-92 OR of the members, since OR is
TRUE iff one operand is TRUE -- and adding or removing a member is O(that member).  The
object is handed to the core as an already compiled selector and changed in place; the
Bridge tells the core when it widened (``Broker.selector_widened``) so waiting queue
messages are offered again.  A member without a selector matches everything: the Bridge
then installs no selector at all (the core's fast path), as before.

The length limit (``MAX_SELECTOR_LENGTH``) applies to each member, i.e. to one user's
selector, never to the merge.  ``text`` renders the OR for statistics only.
"""

from __future__ import annotations

from typing import Any

from treefed.core.selector import Selector, compile_selector

__all__ = ["MergedSelector"]


class MergedSelector:
    """Any-of over member selectors (see the module docstring)."""

    __slots__ = ("_members", "_compiled")

    def __init__(self) -> None:
        self._members: dict[str, int] = {}          # selector text -> members using it
        self._compiled: dict[str, Selector] = {}    # the same texts, compiled once

    def add(self, text: str) -> bool:
        """Count one more member with ``text``; True when the set of texts grew (it
        matches more).  Raises SelectorError for an invalid text (nothing changed)."""
        n = self._members.get(text)
        if n is not None:
            self._members[text] = n + 1
            return False
        selector = compile_selector(text)
        self._members[text] = 1
        self._compiled[text] = selector
        return True

    def discard(self, text: str) -> None:
        """One member with ``text`` left."""
        n = self._members[text] - 1
        if n:
            self._members[text] = n
            return
        del self._members[text]
        del self._compiled[text]

    def __len__(self) -> int:
        return len(self._members)

    def matches(self, headers: dict, *, message: Any = None) -> bool:
        for selector in self._compiled.values():
            if selector.matches(headers, message=message):
                return True
        return False

    @property
    def text(self) -> str | None:
        """The equivalent OR text (statistics); None when empty."""
        texts = sorted(self._members)
        if not texts:
            return None
        if len(texts) == 1:
            return texts[0]
        return " OR ".join(f"({t})" for t in texts)

    def __repr__(self) -> str:
        return f"MergedSelector({len(self._members)} members)"
