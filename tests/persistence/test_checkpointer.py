"""Checkpoints off the commit path (issue #14): the committing connection never
checkpoints; a background thread does, and the WAL stays bounded."""

from __future__ import annotations

import os
import threading

from treefed.core.message import Message
from treefed.persistence import SqliteStore
from treefed.persistence.sqlite import CHECKPOINT_BYTES, RESERVE_BYTES


def _msgs(prefix: str, n: int, size: int) -> list[Message]:
    return [Message(id=f"{prefix}{i}", dst="queue://q", body=b"x" * size, persistent=True)
            for i in range(n)]


def _checkpointers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("checkpoint ")]


def test_wal_stays_bounded_and_the_database_receives_the_pages(tmp_path):
    before = len(_checkpointers())
    store = SqliteStore(tmp_path, synchronous="NORMAL")
    size = 4096
    total = 8 * CHECKPOINT_BYTES // size
    for m in _msgs("a", total, size):          # one commit per message, as a lone sender
        store.apply([m], [])
    wal = os.stat(f"{store.path}-wal").st_size
    db = os.stat(store.path).st_size
    # without checkpoints the WAL would hold every commit (~20 MiB: each 4 KiB row costs
    # about five WAL pages) and the database nothing; the bound is what the reserve covers
    assert wal < RESERVE_BYTES, (wal, db)
    assert db > 2 * CHECKPOINT_BYTES, (wal, db)
    assert len(_checkpointers()) == before + 1
    assert [m.id for m in store.load()][-1] == f"a{total - 1}"
    store.close()
    assert len(_checkpointers()) == before      # close joins it
    with SqliteStore(tmp_path) as again:
        assert len(again.load()) == total


def test_a_closed_store_never_started_a_checkpointer(tmp_path):
    before = len(_checkpointers())
    with SqliteStore(tmp_path) as store:
        store.apply(_msgs("b", 3, 10), [])
    assert len(_checkpointers()) == before
