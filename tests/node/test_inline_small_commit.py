"""A synchronous sender's small commit runs on the site task even on a disk whose fsync
takes longer than ``INLINE_COMMIT_S`` (issue #14, session 10): batches are serial (the
batch lock), so the thread hand-off only cost CPU.  Bigger batches still commit in the
worker thread on such a disk, and a stall past ``INLINE_SMALL_COMMIT_S`` sends the small
ones back to it too.  "Slower than ``INLINE_COMMIT_S``" is made by setting it to 0, not by
slowing the commits: a loaded machine's sleeps overshoot, and a made-slow commit close to
``INLINE_SMALL_COMMIT_S`` crossed it (a fresh-clone CI run)."""

from __future__ import annotations

import threading
import time

import trio

from treefed.client import connect
from treefed.node import node as node_module
from treefed.node.node import INLINE_SMALL_COMMIT_S, INLINE_SMALL_ROWS
from treefed.persistence import SqliteStore

from tests.node.helpers import make_config, start_node


class _Store(SqliteStore):
    """A real SqliteStore whose commits take at least ``delay`` seconds, recording the
    thread and the number of rows of each commit."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.delay = 0.0
        self.commits: list[tuple[int, int]] = []   # (thread id, stores + deletes)

    def apply(self, stores, deletes, *args, **kwargs) -> None:
        if self.delay:
            time.sleep(self.delay)
        self.commits.append((threading.get_ident(), len(stores) + len(deletes)))
        super().apply(stores, deletes, *args, **kwargs)


async def test_small_commits_run_inline_on_a_slow_disk_and_big_ones_in_the_thread(
        nursery, tmp_path, monkeypatch):
    monkeypatch.setattr(node_module, "INLINE_COMMIT_S", 0.0)   # every commit is "slow"
    store = _Store(tmp_path / "d", synchronous="NORMAL")
    node, uri = await start_node(nursery, make_config(tmp_path / "d"), store=store)
    main = threading.get_ident()
    with trio.fail_after(60):
        async with connect(uri) as conn:
            for i in range(60):   # one at a time (the average starts "slow": 1 s)
                await conn.send("queue://small", f"s{i}", persistent=True)
            small = [t for t, rows in store.commits[-20:]]
            assert all(rows <= INLINE_SMALL_ROWS for _, rows in store.commits[-20:])
            assert small.count(main) >= 19, store.commits[-20:]   # inline, not the thread
            # a pipelined burst: batches of more rows go to the worker thread
            before = len(store.commits)
            for i in range(400):
                await conn.send("queue://small", f"p{i}", persistent=True, confirm=False)
            await conn.wait_confirmed()
            big = [t for t, rows in store.commits[before:] if rows > INLINE_SMALL_ROWS]
            assert big and main not in big
            # a stall: small commits go back to the thread
            store.delay = 2 * INLINE_SMALL_COMMIT_S
            for i in range(10):
                await conn.send("queue://small", f"t{i}", persistent=True)
            assert node.commit_seconds > INLINE_SMALL_COMMIT_S
            assert store.commits[-1][0] != main
        async with connect(uri) as conn:    # every confirmed message is there, in order
            sub = await conn.subscribe("queue://small", prefetch=500)
            got = [(await sub.receive()).body for _ in range(470)]
    assert got == ([f"s{i}".encode() for i in range(60)] + [f"p{i}".encode() for i in range(400)]
                   + [f"t{i}".encode() for i in range(10)])
