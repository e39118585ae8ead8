"""AckSyncer: the bounded, off-path fsync of ack-only commits (issue #14).

Theory of operation
-------------------
A ``SqliteStore`` with ``deferred_sync`` commits a transaction that stores no message
(acks, forward acks, expiry deletes, redelivery counts) without fsyncing the WAL; such a
commit becomes durable against power loss at the next commit that stores a message (its
fsync covers every earlier WAL frame) or at ``store.sync()`` (see persistence/sqlite.py,
"Ack-only commits").  This task bounds the second case: the site task ``poke()``s it after
an ack-only commit; it sleeps ``interval`` seconds (``ACK_SYNC_S``), then, if the store
still has unsynced frames, runs ``store.sync()`` (one fdatasync of the WAL file) in a
worker thread.  So an acked message can come back after a power loss only if the loss
falls within ~``interval`` plus one fsync of the ack — and never after kill -9.

It never touches the receipt path: the site task does not wait for it, and it holds no
lock the site task takes (``sync`` only fdatasyncs the file, no SQLite call).  An idle
broker sleeps on an event (no periodic wake-up); under steady acking it syncs at most once
per ``interval``, and not at all while storing commits keep syncing the WAL anyway.
"""

from __future__ import annotations

from typing import Any

import trio

from treefed.errors import StoreError

__all__ = ["AckSyncer", "ACK_SYNC_S"]

#: Seconds an ack-only commit may stay un-fsynced (when no storing commit comes first).
ACK_SYNC_S = 0.1


class AckSyncer:
    """Runs ``store.sync()`` at most ``interval`` seconds after a ``poke()`` (see module
    doc).  ``syncs`` counts the fsyncs it ran (stat, tests)."""

    __slots__ = ("store", "log", "interval", "syncs", "_wanted")

    def __init__(self, store: Any, log: Any, interval: float = ACK_SYNC_S) -> None:
        self.store = store
        self.log = log
        self.interval = interval
        self.syncs = 0
        self._wanted = trio.Event()

    def poke(self) -> None:
        """An ack-only commit happened (cheap: a set event is left as it is)."""
        self._wanted.set()

    async def run(self) -> None:
        store = self.store
        if store.sync_pending():   # e.g. restore()'s deletes, before serving
            self._wanted.set()
        while True:
            await self._wanted.wait()
            await trio.sleep(self.interval)
            # a poke from now on asks for another round; what was committed before this
            # point is covered by the sync below (it starts after)
            self._wanted = trio.Event()
            if not store.sync_pending():   # a storing commit synced them meanwhile
                continue
            try:
                await trio.to_thread.run_sync(store.sync)
            except StoreError as exc:
                # nothing is lost by kill -9 either way; retried at the next poke, and
                # the next storing commit fsyncs the WAL anyway
                self.log.error("store.sync_failed", code=exc.code, error=exc.message)
                continue
            self.syncs += 1
