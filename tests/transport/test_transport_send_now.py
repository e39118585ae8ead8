"""FramedStream.send_now: writing frames without the writer task (issue #14).

Real loopback TCP sockets.  What must hold: bytes never interleave or reorder whatever
mix of ``send_now`` and ``send_frames`` writes them, a partial write's rest goes first,
and ``send_now`` consumes nothing where it cannot write at once.
"""

from __future__ import annotations

import socket

import trio
import trio.testing

from treefed.transport.framed import FramedStream
from treefed.wire import Send


def frames(start: int, n: int, size: int = 100) -> list:
    return [Send(dst="queue://Q", id=f"m{i}", headers={"i": i}, body=bytes([i % 251]) * size)
            for i in range(start, start + n)]


async def tcp_pair() -> tuple[FramedStream, FramedStream]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    server = await listeners[0].accept()
    await listeners[0].aclose()
    return FramedStream(client), FramedStream(server)


async def read_ids(framed: FramedStream, count: int) -> list[str]:
    got: list[str] = []
    while len(got) < count:
        for f in await framed.receive_frames():
            assert f.body == bytes([int(f.id[1:]) % 251]) * len(f.body)   # intact
            got.append(f.id)
    return got


async def test_writes_at_once_on_tcp():
    left, right = await tcp_pair()
    assert left.send_now(frames(0, 3)) is True
    assert left.pending == b""
    assert await read_ids(right, 3) == ["m0", "m1", "m2"]


async def test_nothing_consumed_on_a_memory_stream():
    from trio.testing import memory_stream_pair as testing_pair   # no synchronous write

    a, _ = testing_pair()
    assert FramedStream(a).send_now(frames(0, 1)) is False


async def test_full_socket_keeps_order_through_pending():
    """The peer does not read: send_now fills the socket, leaves the rest pending, then
    refuses (nothing consumed) until send_frames has sent the pending bytes first."""
    left, right = await tcp_pair()
    left.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    right.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sent = 0
    while not left.pending:   # big frames until the kernel takes only part of one
        assert left.send_now(frames(sent, 1, size=32_768)) is True
        sent += 1
    assert left.send_now(frames(sent, 1)) is False    # pending first: refused
    later = frames(sent, 5)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(left.send_frames, later)   # pending, then these
        ids = await read_ids(right, sent + 5)
    assert left.pending == b""
    assert ids == [f"m{i}" for i in range(sent + 5)]


async def test_refused_while_a_send_is_in_progress():
    left, right = await tcp_pair()
    left.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    big = frames(0, 20, size=65_536)   # blocks in send_all: the peer reads later
    async with trio.open_nursery() as nursery:
        nursery.start_soon(left.send_frames, big)
        await trio.testing.wait_all_tasks_blocked()
        assert left.send_now(frames(20, 1)) is False   # would interleave bytes
        ids = await read_ids(right, 20)
    assert ids == [f"m{i}" for i in range(20)]
    assert left.send_now(frames(20, 1)) is True
    assert await read_ids(right, 1) == ["m20"]


async def test_refused_after_eof_and_close():
    left, _right = await tcp_pair()
    await left.stream.send_eof()
    assert left.send_now(frames(0, 1)) is False
    await left.aclose()
    assert left.send_now(frames(0, 1)) is False
