"""In-process frame links (transport/memory.py, issue #14 in-process estate): frames cross
as copies equal to what the codec would hand the peer, share nothing mutable, keep their
order, and end / close / break like the pipes."""

from __future__ import annotations

import pytest
import trio

from treefed.transport.memory import FrameEnd, copy_frame, frame_link
from treefed.wire.codec import FrameDecoder, encode
from treefed.wire.frames import (Ack, Admin, Advisory, Deliver, Error, Forward, ForwardAck,
                                 Hello, Receipt, Send, StatReply, Subscribe, Subtree)


def through_codec(frame):
    decoder = FrameDecoder()
    decoder.receive_data(encode(frame))
    (decoded,) = decoder.frames()
    return decoded


# values as senders build them: tuples, ints in float fields, a bytearray body, nesting
SAMPLES = [
    Hello(1, "broker", broker_id="b1", connector="tree", node_type="leaf",
          ancestry=("hq", "r1"), options={"listen": ("tcp://h:1",), "n": {"x": (1, 2.5)}}),
    Send("queue://q", "m1", {"k": 1, "f": 2.5, "s": "v", "n": None}, bytearray(b"xy"), True),
    Subscribe("s1", "topic://t", "k = 1", 10, 1),
    Ack("s1", "m1"), Receipt("m1"), Error("bad", "why", "m1"),
    Deliver("s1", "m1", "queue://q", {"a": "b"}, b"body", True, 4, 1, None, 3, 7),
    Advisory("add", "c1", "queue://q", "store-1", path=("store-1", "region-1")),
    Subtree(add=("a", "b"), remove=()),
    Forward("queue://q", "m1", ("hq",), {"h": 1}, bytearray(b"ba"), timestamp=5, expires=0),
    ForwardAck(("m1", "m2")),
    StatReply({"queues": [{"name": "q", "depth": 3}], "t": (1, 2)}),
    Admin("link.add", {"uri": "tcp://x:1", "opts": ("a",)}),
]


@pytest.mark.parametrize("frame", SAMPLES, ids=lambda f: type(f).__name__)
def test_the_copy_is_what_the_codec_hands_the_peer(frame):
    copy = copy_frame(frame)
    expected = through_codec(frame)
    assert copy == expected
    assert type(copy) is type(expected)
    for name in frame.__slots__:
        got, want = getattr(copy, name), getattr(expected, name)
        assert type(got) is type(want), name   # list not tuple, float not int, bytes
        if isinstance(got, (list, dict)) and getattr(frame, name):
            assert got is not getattr(frame, name), name   # nothing mutable shared


async def test_frames_cross_in_order_both_ways_and_as_copies():
    a, b = frame_link()
    first = Send("queue://q", "m1", {"k": 1}, b"x", False)
    assert a.send_now([first])
    await a.send_frames([Send("queue://q", "m2"), Send("queue://q", "m3")])
    assert a.send_now([Send("queue://q", "m4")])
    await b.send_frame(Receipt("m1"))
    got = await b.receive_frames()
    assert [f.id for f in got] == ["m1", "m2", "m3", "m4"]
    assert got[0] == first and got[0] is not first and got[0].headers is not first.headers
    assert await a.receive_frames() == [Receipt("m1")]


async def test_a_waiting_receive_wakes_on_send_now():
    a, b = frame_link()
    got: list = []

    async def reader() -> None:
        got.append(await b.receive_frames())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        assert a.send_now([Ack("s", "m")])
    assert got == [[Ack("s", "m")]]


async def test_eof_close_and_broken():
    a, b = frame_link()
    await a.send_frames([Receipt("last")])
    await a.send_eof()
    assert await b.receive_frames() == [Receipt("last")]
    with pytest.raises(trio.EndOfChannel):
        await b.receive_frames()
    assert not a.send_now([Receipt("x")])            # shut for sending: nothing taken
    with pytest.raises(trio.ClosedResourceError):
        await a.send_frames([Receipt("x")])
    await b.send_frames([Receipt("back")])           # the other direction still works
    assert await a.receive_frames() == [Receipt("back")]

    c, d = frame_link()
    await d.aclose()
    with pytest.raises(trio.EndOfChannel):
        await c.receive_frames()                     # the peer closed: end of stream
    assert not c.send_now([Receipt("x")])
    with pytest.raises(trio.BrokenResourceError):
        await c.send_frames([Receipt("x")])
    with pytest.raises(trio.ClosedResourceError):
        await d.receive_frames()


async def test_closing_an_end_interrupts_its_own_receive_and_the_drain_ends():
    a, b = frame_link()
    raised: list = []

    async def reader() -> None:
        try:
            await b.receive_frames()
        except trio.ClosedResourceError as exc:
            raised.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        b.close()
    assert len(raised) == 1
    # the linger drain of a node (framed.stream.receive_some): discards, then b"" at EOF
    c, d = frame_link()
    assert isinstance(c, FrameEnd) and c.stream is c
    await d.send_frames([Receipt("ignored")])
    assert await c.receive_some(65536)
    await d.aclose()
    assert await c.receive_some(65536) == b""


async def test_aclose_is_a_checkpoint_unless_already_cancelled():
    """A node's teardown closes thousands of links with aclose_forcefully: a link closed
    by an already-cancelled task closes at once, without raising Cancelled inside; an
    ordinary aclose still checkpoints."""
    a, b = frame_link()
    with trio.CancelScope() as scope:
        scope.cancel()
        await a.aclose()          # no Cancelled raised here: the scope is not "caught"
        closed_without_raise = True
    assert closed_without_raise and not scope.cancelled_caught
    with pytest.raises(trio.EndOfChannel):
        await b.receive_frames()
    c, d = frame_link()
    with trio.CancelScope() as scope:
        scope.cancel()
        await trio.aclose_forcefully(c)
    with pytest.raises(trio.EndOfChannel):
        await d.receive_frames()
    e, _f = frame_link()
    with trio.testing.assert_checkpoints():
        await e.aclose()
