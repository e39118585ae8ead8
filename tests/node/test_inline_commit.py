"""Commits on the site task while the disk is fast, in a worker thread once it is slow
(issue #14): a lone persistent sender must not pay a thread hand-off per message when the
commit itself is cheaper, and a disk stall must not keep the broker's one task blocked."""

from __future__ import annotations

import threading
import time

import trio

from treefed.client import connect
from treefed.node.node import INLINE_COMMIT_S
from treefed.persistence import SqliteStore

from tests.node.helpers import make_config, start_node


class _Store(SqliteStore):
    """A real SqliteStore whose commits can be made slow, and which records the thread
    each commit ran on."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.delay = 0.0
        self.threads: list[int] = []

    def apply(self, *args, **kwargs) -> None:
        if self.delay:
            time.sleep(self.delay)
        self.threads.append(threading.get_ident())
        super().apply(*args, **kwargs)


async def _send(uri: str, n: int, start: int = 0) -> None:
    async with connect(uri) as conn:
        for i in range(start, start + n):
            await conn.send("queue://inline", f"m{i}", persistent=True)


async def test_fast_commits_run_inline_and_a_stall_goes_back_to_the_thread(nursery,
                                                                          tmp_path):
    store = _Store(tmp_path / "d", synchronous="NORMAL")
    node, uri = await start_node(nursery, make_config(tmp_path / "d"), store=store)
    main = threading.get_ident()
    with trio.fail_after(60):
        # the first commits are timed in the thread; once they are fast, inline (a busy
        # machine may preempt a commit now and then: keep sending until it happened)
        sent = 0
        while node.inline_commits < 10 and sent < 2000:
            await _send(uri, 40, sent)
            sent += 40
        assert node.inline_commits >= 10, node.commit_seconds
        assert store.threads[0] != main and main in store.threads
        store.delay = 0.02                  # the disk stalls
        inline_before = node.inline_commits
        await _send(uri, 5, sent)
        assert node.commit_seconds > INLINE_COMMIT_S
        sent += 5
        # at most the first slow commit ran inline; the rest went to the thread
        assert node.inline_commits - inline_before <= 1
        assert store.threads[-1] != main
        async with connect(uri) as conn:    # every confirmed message is there, in order
            sub = await conn.subscribe("queue://inline", prefetch=sent)
            got = [(await sub.receive()).body for _ in range(sent)]
        assert got == [f"m{i}".encode() for i in range(sent)]
