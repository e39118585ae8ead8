"""Concurrent store and dispatch (issue #14, session 11; node/node.py ``EARLY_PROBE_S``).

A synchronous producer's persistent send to a queue with a local consumer is delivered
before its commit, and the commit waits for the consumer's ack while acks come sooner
than an insert commits: an ack in time takes the insert and the delete out together, so
the message never reaches the disk and the receipt follows the ack.  A consumer that does
not ack in time costs one held commit, and one whose acks keep coming late is no longer
waited for.  The receipt never precedes both the commit and the ack.

The disk is made slow (``_SlowStore``: a real SqliteStore whose inserts sleep) so that a
loopback ack beats the commit on any machine; the assertions count what reached the
store, not how long anything took."""

from __future__ import annotations

import functools
import time

import trio

from treefed.client import connect
from treefed.persistence import SqliteStore

from tests.node.helpers import make_config, start_node, wait_for

DST = "queue://early"


class _SlowStore(SqliteStore):
    """A real SqliteStore whose commits with inserts take ``delay`` seconds more, and
    that counts the rows it was given."""

    def __init__(self, *args, delay: float = 0.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.delay = delay
        self.inserted = 0
        self.deleted = 0

    def apply(self, stores, deletes, *args, **kwargs) -> None:
        if stores and self.delay:
            time.sleep(self.delay)
        self.inserted += len(stores)
        self.deleted += len(deletes)
        super().apply(stores, deletes, *args, **kwargs)


async def _consume(sub, n: int, got: list, *, ack_after: float = 0.0) -> None:
    for _ in range(n):
        msg = await sub.receive()
        got.append(msg.body)
        if ack_after:
            await trio.sleep(ack_after)
        msg.ack_nowait()


async def _one_at_a_time(nursery, tmp_path, n: int, *, delay: float,
                         ack_after: float = 0.0, mark: int = 0) -> tuple:
    """``n`` persistent sends one at a time (each waits for its receipt) to a queue whose
    consumer on the same broker acks each (``ack_after`` seconds late); every message
    arrives once, in order.  Returns the node, its store and the node's ``early_held``
    once the first ``mark`` sends were confirmed."""
    store = _SlowStore(tmp_path / "d", delay=delay)
    node, uri = await start_node(nursery, make_config(tmp_path / "d"), store=store)
    got: list = []
    with trio.fail_after(60):
        async with connect(uri) as consumer, connect(uri) as producer:
            sub = await consumer.subscribe(DST, prefetch=100)
            async with trio.open_nursery() as inner:
                inner.start_soon(functools.partial(_consume, sub, n, got,
                                                   ack_after=ack_after))
                for i in range(n):
                    if i == mark:
                        held_at_mark = node.early_held
                    await producer.send(DST, f"m{i}".encode(), persistent=True)
                    assert not producer.unconfirmed()
    assert got == [f"m{i}".encode() for i in range(n)]   # each once, in order
    return node, store, held_at_mark


async def test_a_message_acked_before_its_commit_never_reaches_the_store(
        nursery, tmp_path):
    n = 40
    node, store, _ = await _one_at_a_time(nursery, tmp_path, n, delay=0.02)
    # the base (deliver after the commit) inserted and deleted every one of them
    assert node.early_cancelled >= n // 2, (node.early_held, node.early_cancelled)
    assert store.inserted <= n - node.early_cancelled
    assert store.inserted + node.early_cancelled == n
    await wait_for(lambda: not store.load())   # nothing left behind
    # every id is remembered as consumed all the same (duplicates after a restart)
    await wait_for(lambda: len(store.load_consumed()) == n)   # (CONSUMED_LATER_S)


async def test_no_ack_in_time_the_held_commit_still_confirms_and_stores(
        nursery, tmp_path):
    store = _SlowStore(tmp_path / "d")
    node, uri = await start_node(nursery, make_config(tmp_path / "d"), store=store)
    with trio.fail_after(30):
        async with connect(uri) as consumer, connect(uri) as producer:
            sub = await consumer.subscribe(DST, prefetch=10)
            await producer.send(DST, b"kept", persistent=True)   # nobody acks it
            msg = await sub.receive()
            assert msg.body == b"kept"
            assert node.early_held == 1 and node.early_cancelled == 0
            # confirmed, hence committed: the row is there before any ack
            assert [m.body for m in store.load()] == [b"kept"]
            msg.ack_nowait()
            await wait_for(lambda: not store.load())


async def test_late_acks_are_no_longer_waited_for(nursery, tmp_path):
    """A consumer that acks later than a commit takes: after a few held batches that
    its ack missed, the broker commits at once again (one probe per EARLY_PROBE_S)."""
    n = 80
    node, store, held = await _one_at_a_time(nursery, tmp_path, n, delay=0.005,
                                             ack_after=0.05, mark=60)
    # every message was committed (no ack came within a commit's time) ...
    assert node.early_cancelled == 0 and store.inserted == n
    # ... held at first (the acks' delay starts unknown), no longer by the end: the last
    # 20 sends were held at most by a probe or two (one a second)
    assert held >= 1 and node.early_held - held <= 2, (held, node.early_held)


async def test_a_lone_sender_without_a_consumer_is_never_held(nursery, tmp_path):
    store = _SlowStore(tmp_path / "d")
    node, uri = await start_node(nursery, make_config(tmp_path / "d"), store=store)
    with trio.fail_after(30):
        async with connect(uri) as producer:
            for i in range(20):
                await producer.send(DST, f"m{i}".encode(), persistent=True)
    assert node.early_held == 0 and store.inserted == 20
