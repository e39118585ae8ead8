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
worker thread (``in_thread``, node/threads.py).  So an acked message can come back after
a power loss only if the loss falls within ~``interval`` plus one fsync of the ack — and
never after kill -9.

It never touches the receipt path: the site task does not wait for it, and it holds no
lock the site task takes (``sync`` only fdatasyncs the file, no SQLite call).  An idle
broker sleeps on an event (no periodic wake-up); under steady acking it syncs at most once
per ``interval``, and not at all while storing commits keep syncing the WAL anyway.

Forwards synced in groups (issue #14).  A broker that received forwarded persistent
messages commits them without an fsync and holds their ForwardAcks (node.py); it then
``poke(urgent=True)``s this task, which waits only ``FORWARD_SYNC_S`` (so the forwards of
the next moments share the fsync; not at all once ``HELD_SYNC_NOW`` acks wait, so a
pipelining upstream's window of unacked forwards is not held up), syncs the WAL, and
calls ``on_synced`` — the node sends the ForwardAcks the fsync covered.  A failed sync
is retried ``interval`` later;
the acks stay held meanwhile (the upstream keeps its copies).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from treefed.errors import StoreError
from treefed.node.threads import in_thread

__all__ = ["AckSyncer", "ACK_SYNC_S", "FORWARD_SYNC_S", "HELD_SYNC_NOW"]

#: Seconds an ack-only commit may stay un-fsynced (when no storing commit comes first).
ACK_SYNC_S = 0.1
#: Seconds held ForwardAcks wait before their fsync, so that the forwards arriving
#: meanwhile share it (a group commit off the sender's receipt path).  Long enough for
#: a one-at-a-time persistent sender's forwards (one every 1-2 ms) to share it: at 2 ms
#: each relaying broker of HQ -> region -> store fsynced once per message (issue #14,
#: session 10: 10 ms makes ~5 forwards share an fsync; the chain's one-at-a-time rate,
#: alternated, +22 % from 2 to 5 ms and +8 % more at 10).  Only the upstream waits
#: longer to drop its copy.
FORWARD_SYNC_S = 0.01
#: Held ForwardAcks (message ids) from which the sync runs at once, without the wait.
HELD_SYNC_NOW = 256


class AckSyncer:
    """Runs ``store.sync()`` at most ``interval`` seconds after a ``poke()`` (see module
    doc).  ``syncs`` counts the fsyncs it ran (stat, tests)."""

    __slots__ = ("store", "log", "interval", "syncs", "_wanted", "_urgent", "_now",
                 "on_synced", "urgent_interval")

    def __init__(self, store: Any, log: Any, interval: float = ACK_SYNC_S, *,
                 urgent_interval: float = FORWARD_SYNC_S,
                 on_synced: Callable[[], None] | None = None) -> None:
        self.store = store
        self.log = log
        self.interval = interval
        self.urgent_interval = urgent_interval
        self.on_synced = on_synced
        self.syncs = 0
        self._wanted = trio.Event()
        self._urgent = trio.Event()
        self._now = trio.Event()

    def poke(self, urgent: bool = False, now: bool = False) -> None:
        """An ack-only commit happened (cheap: a set event is left as it is);
        ``urgent``: frames wait for the sync (held ForwardAcks); ``now``: many do."""
        self._wanted.set()
        if urgent or now:
            self._urgent.set()
        if now:
            self._now.set()

    async def run(self) -> None:
        store = self.store
        if store.sync_pending():   # e.g. restore()'s deletes, before serving
            self._wanted.set()
        while True:
            await self._wanted.wait()
            with trio.move_on_after(self.interval):
                await self._urgent.wait()
            if self._urgent.is_set():
                with trio.move_on_after(self.urgent_interval):   # let forwards join
                    await self._now.wait()
            # a poke from now on asks for another round; what was committed before this
            # point is covered by the sync below (it starts after)
            self._wanted = trio.Event()
            self._urgent = trio.Event()
            self._now = trio.Event()
            if store.sync_pending():   # else a storing commit synced them meanwhile
                try:
                    await in_thread(store.sync)
                except StoreError as exc:
                    # nothing is lost by kill -9 either way; retried an interval later
                    # (held ForwardAcks stay held), and the next storing commit fsyncs
                    # the WAL anyway
                    self.log.error("store.sync_failed", code=exc.code, error=exc.message)
                    self._wanted.set()
                    continue
                self.syncs += 1
            if self.on_synced is not None:
                self.on_synced()
