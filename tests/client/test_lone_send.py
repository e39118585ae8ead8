"""A lone send that does not wait for a receipt leaves at once from the sending task
(issue #14, session 8): at 1,000 msgs/s each message used to wait for the producer's next
yield and a pass of its writer task before its write.  A producer loop's sends, close
together, still share one write."""

from __future__ import annotations

import trio

from treefed.client import connect
from treefed.client import connection as conn_mod
from treefed.transport.framed import FramedStream

from tests.node.helpers import TaskSteps, make_config, start_node

N = 20


def _count_writes(monkeypatch) -> dict:
    counts = {"now": 0, "writer": 0}
    send_now, send_frames = FramedStream.send_now, FramedStream.send_frames

    def counted_now(self, frames):
        ok = send_now(self, frames)
        counts["now"] += ok
        return ok

    async def counted_frames(self, frames):
        counts["writer"] += 1
        await send_frames(self, frames)

    monkeypatch.setattr(FramedStream, "send_now", counted_now)
    monkeypatch.setattr(FramedStream, "send_frames", counted_frames)
    return counts


async def test_a_lone_send_is_written_by_the_sender_not_the_writer(nursery, tmp_path,
                                                                   monkeypatch):
    node, uri = await start_node(nursery, make_config(tmp_path / "d"))
    steps = TaskSteps()
    async with connect(uri) as cons, connect(uri) as prod:
        sub = await cons.subscribe("queue://lone")
        await prod.send("queue://lone", b"warm")
        (await sub.receive()).ack_nowait()
        await trio.sleep(0.01)
        counts = _count_writes(monkeypatch)
        trio.lowlevel.add_instrument(steps)
        steps.on = True
        try:
            for i in range(N):
                await prod.send("queue://lone", f"m{i}".encode())
                await trio.sleep(0.002)
        finally:
            steps.on = False
            trio.lowlevel.remove_instrument(steps)
        sent = dict(counts)
        for i in range(N):
            msg = await sub.receive()
            assert msg.body == f"m{i}".encode()
            msg.ack_nowait()
    # base: every send woke the producer's writer (N writer steps, N writer writes)
    writer_steps = sum(n for name, n in steps.by_name.items() if "_write_loop" in name)
    # the consumer's acks go through its writer: at most N steps of that connection
    assert writer_steps <= N + 2, steps.by_name
    assert sent["now"] >= N, sent   # the producer's frames (and the broker's deliveries)


class _TickingClock:
    """``time`` for the client whose ``perf_counter`` moves 1 µs a call: a loop's sends
    are microseconds apart whatever the machine's load (the OS may stop the process
    between two sends for longer than ``_LONE_GAP_S``; a real loop then writes one more
    frame early, which is harmless)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        self.now += 1e-6
        return self.now


async def test_a_producer_loops_sends_still_share_a_write(nursery, tmp_path, monkeypatch):
    node, uri = await start_node(nursery, make_config(tmp_path / "d"))
    monkeypatch.setattr(conn_mod, "time", _TickingClock())
    async with connect(uri) as cons, connect(uri) as prod:
        sub = await cons.subscribe("queue://loop", prefetch=1000)
        await trio.sleep(0.01)
        writes = []
        write_now = prod._write_now

        def spy():
            writes.append(len(prod._out))
            return write_now()

        monkeypatch.setattr(prod, "_write_now", spy)
        for i in range(200):
            await prod.send("queue://loop", f"m{i}".encode())
        # only the first of the loop's sends found nothing queued after a pause
        assert writes == [1], writes
        await prod.flush()
        for i in range(200):
            assert (await sub.receive()).body == f"m{i}".encode()
    assert conn_mod._LONE_GAP_S <= 0.001


async def test_a_lone_ack_is_written_by_the_acking_task_and_a_burst_still_merges(
        nursery, tmp_path, monkeypatch):
    """A lone ack (nothing else delivered and waiting, nothing queued) is written from
    the acking task (issue #14, session 11: a broker holding a commit for it waits no
    writer wake-up); a burst acked in order still leaves as one cumulative frame."""
    node, uri = await start_node(nursery, make_config(tmp_path / "d"))
    async with connect(uri) as cons, connect(uri) as prod:
        sub = await cons.subscribe("queue://acks", prefetch=100)
        written: list = []
        write_now = cons._write_now

        def spy():
            ok = write_now()
            written.append(ok)
            return ok

        monkeypatch.setattr(cons, "_write_now", spy)
        for i in range(N):
            await prod.send("queue://acks", f"m{i}".encode())
            (await sub.receive()).ack_nowait()
            await trio.sleep(0.002)
        # base: every ack went through the consumer's writer (no direct write at all)
        assert written.count(True) >= N - 2, written
        written.clear()
        for i in range(10):
            await prod.send("queue://acks", f"b{i}".encode(), persistent=True,
                            confirm=False)
        await prod.wait_confirmed()
        with trio.fail_after(10):
            while sub.queued < 10:
                await trio.sleep(0.001)
        acks = cons._out
        for i in range(10):
            msg = await sub.receive()
            assert msg.body == f"b{i}".encode()
            msg.ack_nowait()
        assert written == []   # the burst's acks: one frame, left to the writer
        assert len(acks) == 1 and acks[0].upto and acks[0].msg == msg.frame.msg
