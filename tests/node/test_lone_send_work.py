"""What a lone synchronous persistent send costs the broker's reader beyond its own work
(issue #14, session 7): an inline batch enters no shield cancel scope and leaves the site
task's timer alone when there is no timer — and a reader cancelled while its batch's
commit runs in the worker thread still completes the batch (the reason the shield was
there: every await inside a batch is ``in_thread``, which cannot be cancelled)."""

from __future__ import annotations

import sys
import threading

import trio

from treefed.client import connect
from treefed.node.node import BrokerNode
from treefed.persistence import SqliteStore

from tests.node.helpers import make_config, start_node, wait_for

N = 40


def _count_from_inline_batch(monkeypatch) -> dict:
    """Count CancelScope entries and deadline writes made by ``_inline_batch`` itself."""
    code = BrokerNode._inline_batch.__code__
    counts = {"scopes": 0, "deadlines": 0}
    enter = trio.CancelScope.__enter__
    prop = trio.CancelScope.deadline

    def counted_enter(self):
        if sys._getframe(1).f_code is code:
            counts["scopes"] += 1
        return enter(self)

    def counted_set(self, value):
        if sys._getframe(1).f_code is code:
            counts["deadlines"] += 1
        prop.fset(self, value)

    monkeypatch.setattr(trio.CancelScope, "__enter__", counted_enter)
    monkeypatch.setattr(trio.CancelScope, "deadline", property(prop.fget, counted_set))
    return counts


async def test_a_lone_send_costs_the_reader_no_scope_and_no_timer_write(nursery, tmp_path,
                                                                       monkeypatch):
    store = SqliteStore(tmp_path / "d", synchronous="NORMAL", reserve_bytes=0)
    node, uri = await start_node(nursery, make_config(tmp_path / "d"), store=store)
    calls = []
    inline = node._inline_batch

    async def spy(c, frames):
        calls.append(len(frames))
        await inline(c, frames)

    monkeypatch.setattr(node, "_inline_batch", spy)
    async with connect(uri) as producer:
        await producer.send("queue://lone", b"warm", persistent=True)
        await trio.sleep(0.05)
        counts = _count_from_inline_batch(monkeypatch)
        for i in range(N):
            await producer.send("queue://lone", f"m{i}".encode(), persistent=True)
            await trio.sleep(0.001)   # lone: the last batch ended long ago
        monkeypatch.undo()
    assert len(calls) >= N // 2, calls   # the sends were inline batches
    # before: one shield scope and one write of the site task's (infinite) deadline each
    assert counts == {"scopes": 0, "deadlines": 0}, counts


class _GatedStore(SqliteStore):
    """Commits wait for ``gate`` in the worker thread (the first commits of a node always
    run there: its commit-time average starts slow)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def apply(self, *args, **kwargs) -> None:
        self.entered.set()
        self.gate.wait(10)
        super().apply(*args, **kwargs)


async def test_a_reader_cancelled_mid_commit_completes_its_batch(nursery, tmp_path):
    store = _GatedStore(tmp_path / "d", synchronous="NORMAL", reserve_bytes=0)
    node, uri = await start_node(nursery, make_config(tmp_path / "d"), store=store)
    with trio.fail_after(20):
        async with connect(uri) as producer:
            await producer.send("queue://cut", b"m0", persistent=True)
            await trio.sleep(0.05)
            store.gate.clear()
            store.entered.clear()
            batches = node.batches

            async def send_m1() -> None:
                try:   # its connection is being cut: a receipt or an error, either is fine
                    await producer.send("queue://cut", b"m1", persistent=True)
                except Exception:
                    pass

            async with trio.open_nursery() as inner:
                inner.start_soon(send_m1)
                await trio.to_thread.run_sync(store.entered.wait, 10)
                conn = next(c for c in node._conns.values() if c.kind == "client")
                conn.scope.cancel()       # as the heartbeat task does to a dead peer
                await trio.sleep(0.05)
                store.gate.set()
                inner.cancel_scope.deadline = trio.current_time() + 5
        # the batch ran to its end: counted, lock released, the message committed
        await wait_for(lambda: node.batches > batches)
        assert not node._batch_lock.locked()
        assert [m.body for m in store.load()] == [b"m0", b"m1"]
        async with connect(uri) as other:   # the broker serves on
            await other.send("queue://cut", b"m2", persistent=True)
            sub = await other.subscribe("queue://cut", prefetch=3)
            got = [(await sub.receive()).body for _ in range(3)]
        assert got == [b"m0", b"m1", b"m2"]
