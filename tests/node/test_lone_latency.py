"""A lone message must not wait for a batch (issue #14, session 8): the crowding rules that
keep concurrent synchronous senders' group commit ("Inline batches" in node.py) must not
send a lone non-persistent message to the site task.

At 1,000 msgs/s with a consumer, the consumer's Ack of message i arrives right after the
batch that delivered it; on the base that counted as "chunks arrive together" (within
``INLINE_GAP_S`` of a batch's end) and sent every chunk of the next ``CROWDED_S`` to the
site task — one task hand-off, a cancel scope and a timer write more per message, for a
commit that does not exist.  Likewise a paced producer's backlog after a stall (one big
chunk), or a chunk meeting the site task merely runnable, started or renewed the hold.
Now only batches that commit open the gap or start and renew the hold.

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


async def test_a_backlog_and_a_chunk_meeting_the_runnable_site_task_do_not_crowd(
        nursery, tmp_path, monkeypatch):
    """A paced producer stopped by the OS sends its backlog at once: a chunk of more than
    ``INLINE_MAX_FRAMES``, which goes to the site task; another connection's chunk in the
    same poll finds the site task runnable.  With nothing to commit neither crowds the
    broker (base: each set the ``CROWDED_S`` hold, and at 1,000 msgs/s the next ten paced
    messages went through the site task too), so the next lone send is its reader's
    batch."""
    clock = _SetClock(1000.0)
    monkeypatch.setattr(node_mod, "time", clock)
    node, uri = await start_node(nursery, make_config(tmp_path / "d"))
    calls = _spy_inline(node, monkeypatch)
    burst = node_mod.INLINE_MAX_FRAMES + 4
    async with connect(uri) as a, connect(uri) as b, connect(uri) as cons:
        sub = await cons.subscribe("queue://h", prefetch=1000)
        await a.send("queue://h", b"warm")
        (await sub.receive()).ack_nowait()
        await trio.sleep(0.02)
        calls.clear()
        _send_at_once(a, "queue://h", burst)   # the backlog
        _send_at_once(b, "queue://h")          # in the broker's same poll
        await wait_for(lambda: sub.queued >= burst + 1)
        assert burst not in calls   # the backlog went to the site task
        assert node._crowded == 0.0, node._crowded   # base: 1000.01
        clock.now += node_mod.CROWDED_S / 10
        await b.send("queue://h", b"lone")
        await wait_for(lambda: sub.queued >= burst + 2)
        assert calls and calls[-1] == 1, calls
