"""MemoryStore: the message-store contract without a disk.

Theory of operation
-------------------
Used by the scenario engines (thousands of emulated brokers in one process) and as the
same-run baseline of bench/store_commit.py, so it must cost next to nothing: it keeps the
``Message`` objects by reference in an insertion-ordered dict keyed by (msg id, dst), plus
the redelivery count as it was stored or last updated.  The core treats a Message as
immutable apart from ``redelivered``, which is exactly the field snapshotted here; ``load``
returns shallow copies carrying that count, so later in-memory redeliveries do not leak
into what a "restart" sees — the same answer SqliteStore gives.

Consumed ids (``apply(..., consumed=)``) go into a deque bounded by ``dedup_window``, so
the newest ones are kept exactly as SqliteStore keeps them.

Nothing survives the process; ``apply`` cannot fail part-way, so it is trivially atomic.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from treefed.core.message import Message
from treefed.errors import ConfigError, StoreError
from treefed.persistence.base import MessageStore

__all__ = ["MemoryStore"]


class MemoryStore(MessageStore):
    """An in-process MessageStore with SqliteStore's semantics (see module docstring)."""

    __slots__ = ("_rows", "_consumed", "_closed", "dedup_window")

    def __init__(self, *, dedup_window: int = 100_000) -> None:
        if dedup_window < 0:
            raise ConfigError("dedup_window", f"must be >= 0, got {dedup_window}")
        self.dedup_window = dedup_window
        # (msg id, dst) -> [message, redelivered count]; dict order is arrival order.
        self._rows: dict[tuple[str, str], list[Any]] = {}
        # consumed ids, oldest first; made on first use (an empty deque is ~600 bytes and
        # the replay engine keeps thousands of stores that never see one)
        self._consumed: deque[str] | None = None
        self._closed = False

    def _check_open(self) -> dict[tuple[str, str], list[Any]]:
        if self._closed:
            raise StoreError("memory message store is closed", code="store_closed")
        return self._rows

    def load(self) -> list[Message]:
        rows = self._check_open()
        return [replace(msg, redelivered=count) for msg, count in rows.values()]

    def apply(
        self,
        stores: Sequence[Message],
        deletes: Sequence[tuple[str, str]],
        redelivered: Iterable[tuple[str, str, int]] = (),
        consumed: Sequence[str] = (),
    ) -> None:
        rows = self._check_open()
        for msg in stores:
            key = (msg.id, msg.dst)
            if key not in rows:  # INSERT OR IGNORE: the first copy wins
                rows[key] = [msg, msg.redelivered]
        for msg_id, dst, count in redelivered:
            row = rows.get((msg_id, dst))
            if row is not None:
                row[1] = count
        for msg_id, dst in deletes:
            rows.pop((msg_id, dst), None)
        if consumed:
            kept = self._consumed
            if kept is None:
                kept = self._consumed = deque(maxlen=self.dedup_window)
            kept.extend(consumed)   # maxlen: the oldest fall out

    def load_consumed(self) -> list[str]:
        self._check_open()
        return list(self._consumed) if self._consumed is not None else []

    def stats(self) -> dict[str, Any]:
        return {"rows": len(self._check_open()), "disk_bytes": 0}

    def close(self) -> None:
        self._closed = True
        self._rows = {}
        self._consumed = None

    def __repr__(self) -> str:
        return f"MemoryStore(rows={len(self._rows)}{', closed' if self._closed else ''})"
