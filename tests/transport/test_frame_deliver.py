"""FrameEnd.deliver_to: a receiver that takes frames in the sender's call (issue #14)."""

from __future__ import annotations

import trio

from treefed.transport.memory import frame_link
from treefed.wire.frames import Ack, Send


async def test_frames_go_to_the_receiver_in_the_senders_call_as_copies() -> None:
    a, b = frame_link()
    got: list = []
    await a.send_frames([Send("queue://q", "m1", {"k": 1}, b"x", False)])
    b.deliver_to(got.extend)          # the frame already waiting goes first, now
    assert [f.id for f in got] == ["m1"]
    headers = {"k": 2}
    assert a.send_now([Send("queue://q", "m2", headers, b"y", False), Ack("s", "m1")])
    assert [type(f).__name__ for f in got] == ["Send", "Send", "Ack"]
    assert got[1].headers == headers and got[1].headers is not headers   # a copy
    with trio.move_on_after(0.01) as waited:   # nothing is left for receive_frames
        await b.receive_frames()
    assert waited.cancelled_caught


async def test_a_closed_receiver_still_breaks_the_sender() -> None:
    a, b = frame_link()
    got: list = []
    b.deliver_to(got.extend)
    b.close()
    assert not a.send_now([Ack("s", "m1")])
    assert got == []
