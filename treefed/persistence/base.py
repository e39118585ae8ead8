"""The message-store contract shared by the SQLite and in-memory stores.

Theory of operation
-------------------
A store holds one row per (message id, destination): the same message fanned out to two
destinations is two rows, and each is deleted on its own when acked.  The shell hands the
store everything one batch of input produced in a single ``apply`` call, which is ONE
atomic unit (group commit): either every insert, redelivery update and delete of the batch
is kept or none is.  Inside a batch the order is fixed — inserts, then redelivery counts,
then deletes — so a message stored and acked within one batch ends up absent.

The store also remembers the ids of queue messages a local consumer acknowledged
(``apply(..., consumed=)``, committed with the batch's deletes), the newest
``dedup_window`` of them; ``load_consumed`` hands them back after a restart so the broker
still knows a late re-forwarded copy for a duplicate (core/broker.py, "Faults").

Invariants both implementations keep, and the shared tests check:

* inserting a (msg id, dst) that is already stored is ignored (the first copy, with its
  redelivery count, wins), so a duplicate forwarded again after a reconnect never fails
  the batch; deleting or updating an absent row is a no-op;
* ``load`` returns fresh ``Message`` objects in arrival (first insert) order, with every
  field as it was when stored and ``redelivered`` as last updated;
* every failure is a ``StoreError`` whose ``code`` says what the broker should do
  (``store_full``: refuse producers and keep running; ``store_corrupt``; ``store_closed``...).

A store is not thread-safe: the node calls it from one worker thread at a time.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from typing import Any

from treefed.core.message import Message

__all__ = ["MessageStore"]


class MessageStore(abc.ABC):
    """Where persistent messages wait until they are acked (see module docstring)."""

    __slots__ = ()

    @abc.abstractmethod
    def load(self) -> list[Message]:
        """Every stored message, oldest insert first."""

    @abc.abstractmethod
    def apply(
        self,
        stores: Sequence[Message],
        deletes: Sequence[tuple[str, str]],
        redelivered: Iterable[tuple[str, str, int]] = (),
        consumed: Sequence[str] = (),
    ) -> None:
        """Insert ``stores``, set ``(msg_id, dst, count)`` redelivery counts, delete
        ``(msg_id, dst)`` rows, remember the ``consumed`` ids (oldest first) — all in one
        atomic transaction."""

    @abc.abstractmethod
    def load_consumed(self) -> list[str]:
        """The newest ``dedup_window`` consumed ids, oldest first."""

    @abc.abstractmethod
    def stats(self) -> dict[str, Any]:
        """JSON-able figures; at least ``rows`` and ``disk_bytes``."""

    def room(self) -> bool:
        """May inserts be tried again after a ``store_full``?  (A store with no limit
        of its own always says yes.)"""
        return True

    @abc.abstractmethod
    def close(self) -> None:
        """Release the store; idempotent. Later calls raise StoreError(code="store_closed")."""

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
