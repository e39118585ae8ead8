"""In-process pipes (transport/memory.py): trio.testing.memory_stream_pair's semantics,
plus the synchronous write FramedStream.send_now uses on them (issue #14, estate)."""

from __future__ import annotations

import pytest
import trio

from treefed.transport.framed import FramedStream
from treefed.transport.memory import PipeStream, pipe_pair
from treefed.transport.streams import memory_stream_pair
from treefed.wire.frames import Send


def frames(start: int, n: int) -> list:
    return [Send("queue://q", f"m{i}", {}, b"x" * 10, False) for i in range(start, start + n)]


async def read_ids(framed: FramedStream, n: int) -> list[str]:
    got: list[str] = []
    while len(got) < n:
        got += [f.id for f in await framed.receive_frames()]
    return got


def test_the_engines_pair_is_the_pipe():
    a, b = memory_stream_pair()
    assert type(a) is PipeStream and type(b) is PipeStream


async def test_bytes_arrive_in_order_both_ways():
    a, b = pipe_pair()
    await a.send_all(b"one ")
    assert a.write_nowait(b"two")
    await b.send_all(b"back")
    assert await b.receive_some() == b"one two"
    assert await a.receive_some(2) == b"ba"
    assert await a.receive_some(100) == b"ck"


async def test_a_waiting_receive_wakes_on_a_write():
    a, b = pipe_pair()
    got: list = []

    async def reader() -> None:
        got.append(await b.receive_some())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        assert a.write_nowait(b"now")
    assert got == [b"now"]


async def test_eof_and_close():
    a, b = pipe_pair()
    await a.send_all(b"last")
    await a.send_eof()
    assert await b.receive_some() == b"last"
    assert await b.receive_some() == b""          # EOF, and again
    assert await b.receive_some() == b""
    with pytest.raises(trio.ClosedResourceError):
        await a.send_all(b"more")                 # shut for writing
    assert a.write_nowait(b"more") is False
    await b.send_all(b"still open this way")      # half-closed: the other way works
    assert await a.receive_some() == b"still open this way"
    await b.aclose()
    assert await a.receive_some() == b""          # the peer closed: EOF
    c, d = pipe_pair()
    await d.aclose()
    with pytest.raises(trio.BrokenResourceError):
        await c.send_all(b"to nobody")
    assert c.write_nowait(b"to nobody") is False
    with pytest.raises(trio.ClosedResourceError):
        await d.receive_some()


async def test_closing_an_end_interrupts_its_waiting_receive():
    a, b = pipe_pair()
    raised: list = []

    async def reader() -> None:
        try:
            await b.receive_some()
        except trio.ClosedResourceError as exc:
            raised.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        b.close()
    assert len(raised) == 1


async def test_send_now_writes_a_batch_at_once_on_a_pipe():
    a, b = pipe_pair()
    left, right = FramedStream(a), FramedStream(b)
    assert left.send_now(frames(0, 3)) is True       # the trio.testing pair: False
    assert left.pending == b""
    await left.send_frames(frames(3, 2))              # then the writer's way: in order
    assert await read_ids(right, 5) == ["m0", "m1", "m2", "m3", "m4"]
    await b.aclose()
    assert left.send_now(frames(5, 1)) is False       # peer gone: the writer meets it
    with pytest.raises(trio.BrokenResourceError):
        await left.send_frames(frames(5, 1))
