"""A lone message must not wait for a batch (issue #14, session 8): the crowding rules that
keep concurrent synchronous senders' group commit ("Inline batches" in node.py) must not
send a lone non-persistent message to the site task.

At 1,000 msgs/s with a consumer, the consumer's Ack of message i arrives right after the
batch that delivered it; on the base that counted as "chunks arrive together" (within
``INLINE_GAP_S`` of a batch's end) and sent every chunk of the next ``CROWDED_S`` to the
site task — one task hand-off, a cancel scope and a timer write more per message, for a
commit that does not exist.  Likewise two chunks in one poll while the site task was
merely runnable renewed the crowded hold forever.  Now only a batch that committed opens
the gap, and only a batch waiting on the store (the batch lock held) renews the hold.

The node's ``perf_counter`` is a clock the test sets, so "within the gap" and "the hold
has passed" do not depend on the machine's load."""

from __future__ import annotations

import time

import trio

from treefed.client import connect
from treefed.node import node as node_mod

from tests.node.helpers import make_config, start_node, wait_for

N = 30


class _SetClock:
    """``time`` for node.py whose ``perf_counter`` stands where the test puts it."""

    def __init__(self, now: float) -> None:
        self.now = now

    def perf_counter(self) -> float:
        return self.now

    def __getattr__(self, name: str):
        return getattr(time, name)


def _spy_inline(node, monkeypatch) -> list:
    calls: list = []
    inline = node._inline_batch

    async def spy(c, frames):
        calls.append(len(frames))
        await inline(c, frames)

    monkeypatch.setattr(node, "_inline_batch", spy)
    return calls


async def test_a_consumers_ack_does_not_send_the_next_message_to_the_site_task(
        nursery, tmp_path, monkeypatch):
    """The clock stands still: every chunk arrives "within the gap" of the batch before.
    Non-persistent sends with a consumer acking each commit nothing, so each send is its
    reader's own inline batch (base: from the first batch on, all went to the site task:
    0 inline batches of N)."""
    clock = _SetClock(1000.0)
    monkeypatch.setattr(node_mod, "time", clock)
    node, uri = await start_node(nursery, make_config(tmp_path / "d"))
    calls = _spy_inline(node, monkeypatch)
    async with connect(uri) as cons, connect(uri) as prod:
        sub = await cons.subscribe("queue://lone")
        await prod.send("queue://lone", b"warm")
        (await sub.receive()).ack_nowait()
        await trio.sleep(0.02)
        calls.clear()
        batches = node.batches
        for i in range(N):
            await prod.send("queue://lone", f"m{i}".encode())
            msg = await sub.receive()
            assert msg.body == f"m{i}".encode()
            msg.ack_nowait()
            await trio.sleep(0.002)   # the ack reaches the broker; the next send is lone
        site = node.batches - batches - len(calls)
    # every send and every ack: its reader's own batch
    assert len(calls) >= 2 * N - 2, (len(calls), site)
    assert site <= 2, (len(calls), site)


async def test_after_a_commit_chunks_within_the_gap_still_share_the_site_task(
        nursery, tmp_path, monkeypatch):
    """The other side (kept): after a batch that committed, a chunk within the gap goes to
    the site task, which groups it with what else arrives (group commit)."""
    clock = _SetClock(1000.0)
    monkeypatch.setattr(node_mod, "time", clock)
    node, uri = await start_node(nursery, make_config(tmp_path / "d"))
    calls = _spy_inline(node, monkeypatch)
    async with connect(uri) as prod:
        await prod.send("queue://p", b"warm", persistent=True)
        calls.clear()
        for i in range(N):
            await prod.send("queue://p", f"m{i}".encode(), persistent=True)
    assert calls == [], calls   # the clock says "together": every send to the site task


def _send_at_once(conn, dst: str, count: int = 1) -> None:
    """Queue ``count`` sends on a client connection and write them now, from this task
    (one chunk; two connections written this way reach the broker in the same poll)."""
    for i in range(count):
        conn.send_nowait(dst, f"x{i}".encode())
    assert conn._write_now()


async def test_chunks_meeting_a_runnable_site_task_do_not_renew_the_hold(
        nursery, tmp_path, monkeypatch):
    """A pipelining burst (a chunk of more than ``INLINE_MAX_FRAMES``) crowds the broker for
    ``CROWDED_S``.  Two chunks reaching it in one poll meanwhile both go to the site task,
    the second finding it runnable but not in a batch; that must not renew the hold (base:
    it did, and at 1,000 msgs/s such pairs kept a chain's brokers crowded), so once the
    hold has passed a lone send is its reader's batch again."""
    clock = _SetClock(1000.0)
    monkeypatch.setattr(node_mod, "time", clock)
    node, uri = await start_node(nursery, make_config(tmp_path / "d"))
    calls = _spy_inline(node, monkeypatch)
    async with connect(uri) as a, connect(uri) as b, connect(uri) as c, \
            connect(uri) as cons:
        sub = await cons.subscribe("queue://h", prefetch=1000)
        await a.send("queue://h", b"warm")
        (await sub.receive()).ack_nowait()
        await trio.sleep(0.02)
        _send_at_once(a, "queue://h", node_mod.INLINE_MAX_FRAMES + 4)   # a burst
        await wait_for(lambda: sub.queued >= node_mod.INLINE_MAX_FRAMES + 4)
        assert node._crowded == 1000.0 + node_mod.CROWDED_S
        clock.now = 1000.0 + node_mod.CROWDED_S / 2
        calls.clear()
        _send_at_once(b, "queue://h")
        _send_at_once(c, "queue://h")   # both in the broker's next poll
        await wait_for(lambda: sub.queued >= node_mod.INLINE_MAX_FRAMES + 6)
        assert calls == []   # crowded: both went to the site task
        assert node._crowded == 1000.0 + node_mod.CROWDED_S   # not renewed
        clock.now = 1000.0 + 1.5 * node_mod.CROWDED_S   # the hold has passed
        await a.send("queue://h", b"lone")
        await wait_for(lambda: sub.queued >= node_mod.INLINE_MAX_FRAMES + 7)
        assert calls == [1]
