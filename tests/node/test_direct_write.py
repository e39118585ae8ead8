"""Frames written by the task that produced them (issue #14): a synchronous persistent
send's frame leaves from the client's sending task and its receipt from the broker's site
task (``FramedStream.send_now``), not through the connections' writer tasks — a task hop
less on each side of every lone round trip.  And whatever mix of direct writes and writer
writes a slow consumer causes, its frames arrive whole, once, in order."""

from __future__ import annotations

import trio

from treefed.client import connect
from treefed.persistence import SqliteStore
from treefed.transport.framed import FramedStream
from treefed.wire.codec import encode
from treefed.wire.frames import Ack, Deliver, Receipt, Subscribe

from tests.node.helpers import RawPeer, make_config, start_node


async def test_lone_sync_sends_bypass_both_writer_tasks(nursery, tmp_path, monkeypatch):
    store = SqliteStore(tmp_path / "d", synchronous="NORMAL", reserve_bytes=0)
    _node, uri = await start_node(nursery, make_config(tmp_path / "d"), store=store)
    writers: list[str] = []   # the tasks that wrote through send_frames
    real = FramedStream.send_frames

    async def send_frames(self, frames):
        writers.append(trio.lowlevel.current_task().name)
        await real(self, frames)

    monkeypatch.setattr(FramedStream, "send_frames", send_frames)
    async with connect(uri) as conn:
        await conn.send("queue://direct", b"warm", persistent=True)
        writers.clear()
        for i in range(20):
            await conn.send("queue://direct", f"m{i}".encode(), persistent=True)
        assert len(conn.unconfirmed()) == 0
    hops = [w for w in writers if w.endswith(("._writer", "._write_loop"))]
    # the close (bye) may still go through the client's writer: not a send
    assert len(hops) <= 1, hops


async def test_slow_consumer_gets_every_frame_once_in_order(nursery, tmp_path):
    """The consumer does not read while 300 x 8 KiB messages are delivered to it: the
    site task's direct writes fill its socket, the rest waits as ``pending`` and in the
    writer's queue; then it reads everything."""
    _node, uri = await start_node(nursery, make_config(tmp_path / "d"))
    peer = await RawPeer.open(uri)
    await peer.send_raw(encode(Subscribe("s1", "queue://slow", prefetch=1000)))
    with trio.fail_after(10):
        frames = await peer.framed.receive_frames()
    assert any(type(f) is Receipt for f in frames)
    n, size = 300, 8192
    async with connect(uri) as producer:
        for i in range(n):
            await producer.send("queue://slow", bytes([i % 251]) * size, headers={"i": i})
        await producer.flush()
        await trio.sleep(0.2)   # the broker has written what the socket takes
        got: list = []
        with trio.fail_after(30):
            while len(got) < n:
                for f in await peer.framed.receive_frames():
                    if type(f) is Deliver:
                        got.append(f)
                        await peer.send_raw(encode(Ack("s1", f.msg)))
    assert [f.headers["i"] for f in got] == list(range(n))
    assert all(f.body == bytes([f.headers["i"] % 251]) * size for f in got)
    await peer.aclose()
