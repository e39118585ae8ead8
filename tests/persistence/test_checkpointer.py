"""Checkpoints off the receipt path (issue #14): a commit never checkpoints by itself;
``checkpoint_due`` / ``checkpoint`` let the node do it after the receipts are queued, and
a store whose caller never does still keeps its WAL bounded."""

from __future__ import annotations

import os

from treefed.core.message import Message
from treefed.persistence import SqliteStore
from treefed.persistence.sqlite import CHECKPOINT_BYTES


def _msgs(prefix: str, n: int, size: int) -> list[Message]:
    return [Message(id=f"{prefix}{i}", dst="queue://q", body=b"x" * size, persistent=True)
            for i in range(n)]


def _sizes(store: SqliteStore) -> tuple[int, int]:
    return os.stat(f"{store.path}-wal").st_size, os.stat(store.path).st_size


def test_commits_do_not_checkpoint_until_asked(tmp_path):
    with SqliteStore(tmp_path, synchronous="NORMAL") as store:
        n = 0
        while not store.checkpoint_due():
            store.apply(_msgs(f"a{n}-", 1, 4096), [])
            n += 1
        wal, db = _sizes(store)
        assert db <= 16 * 4096, "a commit checkpointed by itself"
        assert wal >= CHECKPOINT_BYTES // 8      # the estimate errs on the safe side
        store.checkpoint()
        assert not store.checkpoint_due()
        assert _sizes(store)[1] >= CHECKPOINT_BYTES // 8    # the pages reached the database
        store.apply(_msgs("b", 1, 10), [])
        assert _sizes(store)[0] <= wal                   # the WAL restarted, not grew
        assert len(store.load()) == n + 1


def test_wal_stays_bounded_when_nobody_checkpoints(tmp_path):
    with SqliteStore(tmp_path, synchronous="NORMAL") as store:
        total = 5 * CHECKPOINT_BYTES // 4096
        for m in _msgs("a", total, 4096):   # one commit per message, as a lone sender
            store.apply([m], [])
        wal, db = _sizes(store)
        # without checkpoints the WAL would hold every commit (~50 MiB: each 4 KiB row
        # costs about five WAL pages) and the database nothing
        assert wal < 4 * CHECKPOINT_BYTES, (wal, db)
        assert db > CHECKPOINT_BYTES // 2, (wal, db)
    with SqliteStore(tmp_path) as again:
        assert len(again.load()) == total
