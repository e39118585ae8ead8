"""A relaying broker writes a forwarded message on before it acks it upstream, and holds
its ForwardAcks a moment to send many in one frame (issue #14).

A hop of the chain HQ -> region -> store is "read the Forward, write it on"; the
ForwardAck to the upstream link is written after the batch's message-carrying
connections, so the ack's loopback write (which wakes the upstream broker) is not in
front of the message; and acks are held up to ``ACK_HOLD_S`` so that at 1,000 msgs/s a
hop is not woken twice per message.  Checked on the batch's flush
(``BrokerNode._perform``) with connections whose streams record their writes, and on a
real link (a raw peer)."""

from __future__ import annotations

import time

import trio

from tests.node.helpers import RawPeer, make_config, start_node
from treefed.core.actions import Out
from treefed.node import node as node_mod
from treefed.node.node import BrokerNode, _Conn
from treefed.wire.codec import encode
from treefed.wire.frames import PROTOCOL_VERSION, Advisory, Deliver, Forward, ForwardAck, \
    Hello


class _Recorder:
    """Stands in for a FramedStream: ``send_now`` takes the frames and records them."""

    pending = b""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def send_now(self, frames: list) -> bool:
        self.log.append((self.name, [type(f).__name__ for f in frames]))
        return True


def _conns(node: BrokerNode, log: list, *names: str) -> list:
    conns = []
    for name in names:
        c = _Conn(name, _Recorder(name, log), "127.0.0.1:1", None)
        node._conns[name] = c
        conns.append(c)
    return conns


async def test_the_forward_leaves_before_the_upstream_ack(tmp_path, monkeypatch):
    monkeypatch.setattr(node_mod, "ACK_HOLD_S", 0.0)   # acks leave with their batch
    node = BrokerNode(make_config(tmp_path, "region"))
    log: list = []
    _conns(node, log, "L:up:hq", "L:down:store")
    # the core's order for a forwarded message: ForwardAck upstream, then the Forward
    actions = [Out("L:up:hq", ForwardAck(["m1"])),
               Out("L:down:store", Forward("queue://Q", "m1", ["hq", "region"],
                                           {}, b"x"))]
    await node._perform(actions, 0.0)
    assert log == [("L:down:store", ["Forward"]), ("L:up:hq", ["ForwardAck"])]


async def test_a_batch_delivers_before_it_acks_and_keeps_each_connections_order(
        tmp_path, monkeypatch):
    monkeypatch.setattr(node_mod, "ACK_HOLD_S", 0.0)
    node = BrokerNode(make_config(tmp_path, "store"))
    log: list = []
    _conns(node, log, "L:up:region", "c1", "L:up:other")
    actions = []
    for i in range(3):
        actions.append(Out("L:up:region", ForwardAck([f"m{i}"])))
        actions.append(Out("c1", Deliver("s1", f"m{i}", "queue://Q", {}, b"x")))
    actions.append(Out("L:up:other", ForwardAck(["o1"])))
    actions.append(Out("L:up:other", Forward("queue://Q", "o2", ["x"], {}, b"x")))
    await node._perform(actions, 0.0)
    # the three acks merged into one frame, written after the deliveries; a connection
    # with a message and an ack keeps its own order and is not held back
    assert log == [("c1", ["Deliver"] * 3), ("L:up:other", ["ForwardAck", "Forward"]),
                   ("L:up:region", ["ForwardAck"])]


async def test_acks_of_several_batches_leave_in_one_frame_when_due(tmp_path):
    node = BrokerNode(make_config(tmp_path, "store"))
    log: list = []
    (up,) = _conns(node, log, "L:up:region")
    now = time.time()
    await node._perform([Out("L:up:region", ForwardAck(["m1"]))], now)
    await node._perform([Out("L:up:region", ForwardAck(["m2", "m3"]))], now + 0.001)
    assert log == [] and up.acks == ["m1", "m2", "m3"]
    # the site task's timer is the held acks' due time
    assert node._next_deadline() == now + node_mod.ACK_HOLD_S
    node._acks_due(now + 0.001)                   # not due yet (nor half-way)
    assert log == []
    node._acks_due(now + node_mod.ACK_HOLD_S)
    assert log == [("L:up:region", ["ForwardAck"])]
    assert up.out == [] and up.acks == [] and node._next_deadline() is None
    # a batch that finds them half-way due sends them itself (the timer then never fires
    # under steady traffic)
    await node._perform([Out("L:up:region", ForwardAck(["m4"]))], now + 1.0)
    await node._perform([Out("L:up:region", ForwardAck(["m5"]))],
                        now + 1.0 + node_mod.ACK_HOLD_S / 2)
    assert log[1:] == [("L:up:region", ["ForwardAck"])]
    assert node._next_deadline() is None


async def test_held_acks_go_with_the_next_frame_in_their_place(tmp_path):
    node = BrokerNode(make_config(tmp_path, "region"))
    sent: list = []

    class Frames(_Recorder):
        def send_now(self, frames: list) -> bool:
            sent.extend(frames)
            return True

    c = _Conn("L:m:p", Frames("L:m:p", []), "127.0.0.1:1", None)
    node._conns[c.id] = c
    adv = Advisory("add", "c1", "queue://Q", "p")
    await node._perform([Out(c.id, ForwardAck(["a"]))], 0.0)
    await node._perform([Out(c.id, ForwardAck(["b"])), Out(c.id, adv),
                         Out(c.id, ForwardAck(["c"]))], 0.001)
    assert [(type(f).__name__, getattr(f, "ids", None)) for f in sent] == [
        ("ForwardAck", ["a", "b"]), ("Advisory", None), ("ForwardAck", ["c"])]
    assert not node._held


async def test_lone_forwards_on_a_link_are_acked_in_fewer_frames_and_all_in_time(
        nursery, tmp_path):
    """20 forwards 1 ms apart (each alone, handled by the reader): every id is acked, in
    order; every forward the broker handled within half of ``ACK_HOLD_S`` of a held ack
    shares that ack's frame (fewer frames than forwards); the last ones go by the site
    task's timer.

    Judged on the broker's own clock (the ``now`` each forward's batch was handled
    with), not on the 1 ms the peer meant: on a loaded machine that sleep stretches past
    the hold and each forward is then rightly acked alone."""
    node, uri = await start_node(nursery, make_config(tmp_path))
    handled: dict = {}        # forward id -> the ``now`` of the batch that acked it
    perform = node._perform

    async def recording_perform(actions: list, now: float) -> None:
        for a in actions:
            if type(a) is Out and type(a.frame) is ForwardAck:
                for i in a.frame.ids:
                    handled[i] = now
        await perform(actions, now)

    node._perform = recording_perform
    peer = await RawPeer.open(uri, hello=False)
    await peer.send_raw(encode(Hello(PROTOCOL_VERSION, "broker", broker_id="p",
                                     connector="mesh", link_name="m")))
    assert type((await peer.framed.receive_frames())[0]) is Hello
    ids: list = []
    frames: list = []         # the ids of each ForwardAck frame, as received

    async def read_acks() -> None:
        while len(ids) < 20:
            for f in await peer.framed.receive_frames():
                if type(f) is ForwardAck:
                    frames.append(list(f.ids))
                    ids.extend(f.ids)

    with trio.fail_after(10):
        async with trio.open_nursery() as inner:
            inner.start_soon(read_acks)
            for i in range(20):
                await peer.send_raw(encode(Forward("queue://in", f"p:{i}", ["p"],
                                                   body=b"x")))
                await trio.sleep(0.001)
    assert ids == [f"p:{i}" for i in range(20)]
    assert sorted(handled) == sorted(ids)
    half = node_mod.ACK_HOLD_S / 2
    # a frame is sent only once its first ack was held half the hold (or by the timer,
    # later still): so the next frame's first forward was handled at least half the hold
    # after this frame's first — every forward handled within it shared the frame.
    # Before: 20 frames, one per forward, whatever the timing.
    for frame, after in zip(frames, frames[1:]):
        assert handled[after[0]] - handled[frame[0]] >= half, (frame, after, handled)
    # (which the 1 ms gaps give on a quiet machine: a handful of frames for 20 forwards)
    assert not node._held
    await peer.aclose()
