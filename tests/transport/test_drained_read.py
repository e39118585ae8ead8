"""FramedStream.receive_frames after a drained read (issue #14): on plain TCP, once a read
took less than ``receive_size``, the next one waits for the socket first instead of
trying a read that fails with EAGAIN (trio's ``receive_some`` tries first, then waits).
Real loopback TCP sockets; closing, a peer's reset, end of stream and a frame split over
reads behave as before."""

from __future__ import annotations

import socket
import struct

import trio

from tests.transport.test_transport_send_now import frames, read_ids, tcp_pair
from treefed.transport import framed as framed_mod
from treefed.wire.codec import encode


async def _outcome(fn) -> BaseException | None:
    try:
        await fn()
    except BaseException as exc:   # noqa: BLE001 (the test looks at what it was)
        return exc
    return None


async def test_a_lone_frame_after_a_drained_read_costs_one_read(monkeypatch):
    left, right = await tcp_pair()
    counts = {"receive_some": 0, "read": 0}
    receive_some, read = right.stream.receive_some, framed_mod.os.read

    async def counted_receive_some(n):
        counts["receive_some"] += 1   # each tries a read first: EAGAIN when nothing came
        return await receive_some(n)

    def counted_read(fd, n):
        counts["read"] += 1
        return read(fd, n)

    monkeypatch.setattr(right.stream, "receive_some", counted_receive_some)
    monkeypatch.setattr(framed_mod.os, "read", counted_read)
    for i in range(20):   # each frame alone: every read drains the socket
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_ids, right, 1)
            await trio.sleep(0.002)   # the reader waits before the frame comes
            assert left.send_now(frames(i, 1))
    # only the first read goes through receive_some; before: all 20 (40 read syscalls)
    assert counts == {"receive_some": 1, "read": 19}, counts
    await left.aclose()
    await right.aclose()


async def test_a_full_read_goes_back_to_receive_some_and_big_batches_arrive_whole():
    left, right = await tcp_pair()
    right.receive_size = 4096
    sent = frames(0, 500)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(left.send_frames, sent)
        assert await read_ids(right, 500) == [f.id for f in sent]
    await left.aclose()
    await right.aclose()


async def test_closing_while_waiting_and_end_of_stream():
    left, right = await tcp_pair()
    assert left.send_now(frames(0, 1))
    await read_ids(right, 1)                 # drained: the next read waits first
    got: list = []
    async with trio.open_nursery() as nursery:
        async def reader():
            got.append(await _outcome(right.receive_frames))
        nursery.start_soon(reader)
        await trio.sleep(0.01)
        await right.aclose()                 # closed under the waiting reader
    assert type(got[0]) is trio.ClosedResourceError, got
    # and a read after the close, as trio's receive_some reports it
    assert type(await _outcome(right.receive_frames)) is trio.ClosedResourceError
    await left.aclose()
    a, b = await tcp_pair()
    assert a.send_now(frames(0, 1))
    await read_ids(b, 1)
    await a.aclose()
    assert type(await _outcome(b.receive_frames)) is trio.EndOfChannel
    await b.aclose()


async def test_a_split_frame_is_reassembled_and_a_reset_is_broken():
    left, right = await tcp_pair()
    data = encode(frames(7, 1)[0])
    assert left.send_now(frames(0, 1))
    await read_ids(right, 1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_ids, right, 1)
        await left.stream.send_all(data[:10])   # half a frame, then the rest
        await trio.sleep(0.01)
        await left.stream.send_all(data[10:])
    # a reset (SO_LINGER 0) under a waiting reader: broken, as trio reports it
    left.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                  struct.pack("ii", 1, 0))
    got: list = []
    async with trio.open_nursery() as nursery:
        async def reader():
            got.append(await _outcome(right.receive_frames))
        nursery.start_soon(reader)
        await trio.sleep(0.01)
        left.stream.socket.close()
    assert type(got[0]) is trio.BrokenResourceError, got
    await right.aclose()
