"""Duplicate tracking: which message ids a broker must not take twice.

Theory of operation
-------------------
A queue message is *held* by a broker from acceptance until it is acked, forward-acked or
dropped; a copy of a held message, or of one a local consumer acked (*consumed*), is a
duplicate whatever route it took -- a producer re-sending after a failover, a peer
re-forwarding after a reconnect or a restart, a copy that toured the tree.  Besides,
forwarded ids are *seen*: on a mesh link the id alone is remembered too (ActiveMQ's
audit); on a tree link a queue message may legitimately come back after it left (a replay
with any path), so there only "held or consumed" tells a duplicate, and topic copies
(which never rest) are keyed by id and path length.

``Duplicates`` keeps the three books:

* ``held``: id -> copies held here (a DLQ copy shares the id of the message it came from);
* ``consumed``: the newest ``window`` ids local consumers acked that can come again -- a
  persistent message (its producer re-sends it if the receipt was lost) or one that came
  over a link (its peer re-forwards it if the ForwardAck was lost); a non-persistent
  message a local producer sent is never re-sent, so the broker does not call ``consume``
  for it (issue #14: those ids filled the window for nothing).  They go to the store
  with ``DeleteMessage(consumed=True)`` and come back after a restart (``restore``), so a
  copy the upstream re-forwards because our ForwardAck was lost is still a duplicate;
* ``seen``: the newest ``window`` forwarded keys accepted (never stored: ids that were
  only forwarded on may come back after a restart, on a tree link as a replay).

``window`` <= 0 turns the consumed and seen books off (held always counts).  Both windows
are ``core/idwindow.IdWindow``: exact membership, one bit per id for ``<producer>:<seq>``
ids, no Python object per id (so a busy spell's heap is not pinned by survivors).

Public surface: ``Duplicates`` -- ``known``, ``check_forward``, ``hold``, ``release``,
``remember``, ``forget``, ``consume``, ``restore``, and the read-only views ``held``,
``consumed``, ``seen``.  Pure: no I/O, no clock; the owner (core/broker.py) calls it.
"""

from __future__ import annotations

from typing import Iterable

from treefed.core.idwindow import IdWindow

__all__ = ["Duplicates", "TOPIC_PREFIXES"]

#: Destinations whose forwarded copies are keyed by id and path length on a tree link.
TOPIC_PREFIXES = ("topic://", "temp-topic://")


class Duplicates:
    """The held / consumed / seen books of one broker (see the module docstring)."""

    __slots__ = ("window", "held", "consumed", "seen")

    def __init__(self, window: int = 100_000) -> None:
        self.window = window
        self.held: dict[str, int] = {}           # queue message id -> copies held here
        self.consumed = IdWindow(window)         # ids a local consumer acked (window)
        self.seen = IdWindow(window)             # forwarded keys accepted (window)

    def known(self, msg_id: str) -> bool:
        """A copy of ``msg_id`` is held here or a local consumer already took it."""
        return msg_id in self.held or msg_id in self.consumed

    def check_forward(self, msg_id: str, dst: str, hops: int,
                      revisit: bool) -> tuple[bool, str | None]:
        """``(duplicate, key)`` for a forward of ``msg_id`` to ``dst`` that crossed
        ``hops`` links, arriving on a link that may (``revisit``: tree) or may not bring
        a message back to a broker it left.  ``key``: what ``remember`` takes once the
        forward is accepted (None: nothing to remember)."""
        if not revisit:
            return (msg_id in self.held or msg_id in self.consumed
                    or msg_id in self.seen), msg_id
        if dst.startswith(TOPIC_PREFIXES):
            key = f"{msg_id}#{hops}"
            return key in self.seen, key
        return msg_id in self.held or msg_id in self.consumed, None

    def hold(self, msg_id: str) -> None:
        """One more copy of ``msg_id`` is held here."""
        held = self.held
        held[msg_id] = held.get(msg_id, 0) + 1

    def release(self, msg_id: str) -> None:
        """One copy of ``msg_id`` left (acked, dropped, expired, withdrawn)."""
        held = self.held
        n = held.get(msg_id, 0)
        if n > 1:
            held[msg_id] = n - 1
        else:
            held.pop(msg_id, None)
            if not held:
                # a dict never shrinks on deletion: after a backlog of 100,000 its
                # table (~4 MiB) would stay until as many inserts again (issue #14)
                self.held = {}

    def remember(self, key: str) -> None:
        """An accepted forward's key (``check_forward``) joins the seen window."""
        self.seen.add(key)

    def forget(self, msg_id: str, hops: int) -> None:
        """Forget that ``msg_id`` (with ``hops``: its tree key) was seen: the message
        was withdrawn, so a retry or re-forward must be accepted."""
        self.seen.discard(msg_id)
        self.seen.discard(f"{msg_id}#{hops}")

    def consume(self, msg_id: str) -> None:
        """A local consumer acked ``msg_id`` (only called with a window > 0)."""
        self.consumed.add(msg_id)

    def consume_many(self, ids: list[str]) -> None:
        """``consume`` of each id in turn (a run of messages one Ack settled)."""
        self.consumed.add_many(ids)

    def restore(self, consumed: Iterable[str]) -> None:
        """Ids local consumers acked before a restart, oldest first (the store's
        ``load_consumed``): the newest ``window`` of them are remembered."""
        window = self.window
        if window <= 0:
            return
        ids = consumed if isinstance(consumed, list) else list(consumed)
        add = self.consumed.add
        for msg_id in ids[-window:]:
            add(msg_id)
