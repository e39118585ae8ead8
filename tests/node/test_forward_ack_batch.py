"""Issue #14: a broker answers a read batch of forwards with one ForwardAck frame
carrying every id (the frame always took a list), not one frame per forward; a lone
forward still gets its ack at once, and acks keep their place among the other frames."""

from __future__ import annotations

import trio

from tests.node.helpers import RawPeer, make_config, start_node
from treefed.wire.codec import encode
from treefed.wire.frames import PROTOCOL_VERSION, Error, Forward, ForwardAck, Hello

N = 300


async def _link(uri: str, name: str) -> RawPeer:
    peer = await RawPeer.open(uri, hello=False)
    await peer.send_raw(encode(Hello(PROTOCOL_VERSION, "broker", broker_id=name,
                                     connector="mesh", link_name="m")))
    assert type((await peer.framed.receive_frames())[0]) is Hello
    return peer


async def _acks_until(peer: RawPeer, n: int) -> tuple[list[str], int]:
    ids: list[str] = []
    frames = 0
    with trio.fail_after(10):
        while len(ids) < n:
            for f in await peer.framed.receive_frames():
                if type(f) is ForwardAck:
                    frames += 1
                    ids += f.ids
    return ids, frames


async def test_one_ack_frame_for_a_batch_of_forwards(nursery, tmp_path):
    node, uri = await start_node(nursery, make_config(tmp_path))
    peer = await _link(uri, "p")
    # one write: the broker reads them in one or a few chunks
    await peer.send_raw(b"".join(encode(Forward("queue://in", f"p:{i}", ["p"], body=b"x"))
                                 for i in range(N)))
    ids, frames = await _acks_until(peer, N)
    assert ids == [f"p:{i}" for i in range(N)]          # every id, once, in order
    assert frames <= N // 10, frames                     # before: N frames
    # a lone forward is acked at once, in its own frame
    await peer.send_raw(encode(Forward("queue://in", "p:lone", ["p"], body=b"x")))
    assert await _acks_until(peer, 1) == (["p:lone"], 1)
    await peer.aclose()


async def test_acks_keep_their_place_around_an_error(nursery, tmp_path):
    """A refused forward's Error comes before its own ack and after the acks of the
    forwards before it: merging only joins acks that are next to each other."""
    node, uri = await start_node(nursery, make_config(tmp_path))
    peer = await _link(uri, "p")
    frames = [Forward("queue://in", f"p:{i}", ["p"], body=b"x") for i in range(5)]
    frames.insert(3, Forward("nope://in", "p:bad", ["p"], body=b"x"))
    await peer.send_raw(b"".join(encode(f) for f in frames))
    got: list = []
    with trio.fail_after(10):
        while sum(len(f.ids) for f in got if type(f) is ForwardAck) < 6:
            got += await peer.framed.receive_frames()
    flat = [x for f in got for x in (
        [("ack", i) for i in f.ids] if type(f) is ForwardAck
        else [("error", f.ref)] if type(f) is Error else [])]
    assert flat == [("ack", "p:0"), ("ack", "p:1"), ("ack", "p:2"), ("error", "p:bad"),
                    ("ack", "p:bad"), ("ack", "p:3"), ("ack", "p:4")], flat
    await peer.aclose()
