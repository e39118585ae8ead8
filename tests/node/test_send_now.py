"""The site task writes a connection's frames itself while the writer is idle
(``BrokerNode._send_now``, issue #14 latency): no writer wake-up for a lone message, and
nothing reordered or lost when the socket takes only part of a batch."""

from __future__ import annotations

import socket

import trio

from treefed.node import node as node_mod
from treefed.node.node import BrokerNode, _Conn
from treefed.transport.framed import FramedStream
from treefed.wire.frames import Deliver


def _pair(small: bool = False) -> tuple[FramedStream, FramedStream]:
    a, b = socket.socketpair()
    if small:
        for s in (a, b):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return (FramedStream(trio.SocketStream(trio.socket.from_stdlib_socket(a))),
            FramedStream(trio.SocketStream(trio.socket.from_stdlib_socket(b))))


def _deliver(i: int, size: int = 100) -> Deliver:
    return Deliver("s1", f"m{i}", "queue://Q", {"i": i}, b"x" * size)


async def _read(framed: FramedStream, n: int) -> list:
    got: list = []
    while len(got) < n:
        got += await framed.receive_frames()
    return got


async def test_a_lone_frame_is_written_without_waking_the_writer():
    ours, peer = _pair()
    c = _Conn("c1", ours, "test", None)
    assert c.sock is not None            # a plain TCP-like treefed stream qualifies
    c.out.append(_deliver(1))
    BrokerNode._send_now(c)
    assert c.out == [] and c.raw == b"" and not c.wake.is_set()
    with trio.fail_after(5):
        (frame,) = await _read(peer, 1)
    assert frame.msg == "m1"


async def test_a_busy_writer_is_woken_instead():
    ours, _peer = _pair()
    c = _Conn("c1", ours, "test", None)
    c.busy = True
    c.out.append(_deliver(1))
    BrokerNode._send_now(c)
    assert len(c.out) == 1 and c.wake.is_set()


async def test_what_the_socket_does_not_take_goes_first_through_the_writer(monkeypatch):
    monkeypatch.setattr(node_mod, "LINGER", 0.0)
    ours, peer = _pair(small=True)
    c = _Conn("c1", ours, "test", None)
    # a batch far larger than the socket buffers: only part of it is written at once
    c.out.extend(_deliver(i, 2000) for i in range(200))
    n = 200
    BrokerNode._send_now(c)
    assert c.raw and c.out == [] and c.wake.is_set()
    # later batches while bytes are pending go to the writer too, behind them
    c.out.append(_deliver(n))
    BrokerNode._send_now(c)
    assert len(c.out) == 1
    n += 1
    async with trio.open_nursery() as nursery:
        nursery.start_soon(BrokerNode._writer, None, c, nursery)
        with trio.fail_after(10):
            got = await _read(peer, n)
        # and once the writer is idle again, the site task writes directly once more
        while c.busy or c.raw or c.out:
            await trio.sleep(0.01)
        c.out.append(_deliver(n))
        BrokerNode._send_now(c)
        assert c.out == []
        with trio.fail_after(10):
            got += await _read(peer, 1)
        c.closing = True
        c.wake.set()
    assert [f.msg for f in got] == [f"m{i}" for i in range(n + 1)]
