"""What a frame crossing an in-process frame link costs (transport/memory.py, issue #14
in-process estate): its copy is one call per frame kind, written out once (``_copier``:
no loop over the kind's fields, no ``getattr`` per field), and waking the receiver
is one ``reschedule`` of the task a direction keeps (no ParkingLot)."""

from __future__ import annotations

import sys

import pytest
import trio
import trio.testing

from treefed.transport.memory import copy_frame, frame_link
from treefed.wire.frames import Ack, Deliver, Forward, Subscribe

from tests.transport.test_frame_link import through_codec


def _calls(fn, *args) -> list[str]:
    seen: list[str] = []

    def profile(frame, event, arg) -> None:
        if event == "call":
            seen.append(frame.f_code.co_name)
        elif event == "c_call":
            seen.append(getattr(arg, "__name__", "?"))

    sys.setprofile(profile)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize("frame", [
    Forward("queue://q", "m1", ("hq",), {"h": 1}, bytearray(b"ba"), timestamp=5, expires=0),
    Deliver("s1", "m1", "queue://q", {"a": "b"}, b"body", True, 4, 1, None, 3, 7),
    Ack("s1", "m1"), Subscribe("s1", "topic://t", "k = 1", 10, 1),
], ids=lambda f: type(f).__name__)
def test_one_written_out_call_per_frame(frame) -> None:
    calls = _calls(copy_frame, frame)
    assert "getattr" not in calls and "<listcomp>" not in calls, calls
    assert copy_frame(frame) == through_codec(frame)


def test_a_wake_up_is_one_reschedule() -> None:
    """Sending to a waiting receiver reschedules it directly; a cancelled wait leaves
    the end usable; a second receiver at once is refused."""
    async def main() -> None:
        near, far = frame_link()
        got: list = []

        async def receive() -> None:
            got.extend(await far.receive_frames())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            await trio.testing.wait_all_tasks_blocked()
            calls = _calls(near.send_now, [Ack("s1", "m1")])
        assert got == [Ack("s1", "m1")]
        assert not any(c in ("unpark_all", "unpark", "_pop_several") for c in calls), calls
        assert "reschedule" in calls

        with trio.move_on_after(1):   # cancelled while waiting
            await far.receive_frames()
        near.send_now([Ack("s1", "m2")])
        assert await far.receive_frames() == [Ack("s1", "m2")]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(far.receive_frames)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trio.BusyResourceError):
                await far.receive_frames()
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_hellos_options_are_copied_without_a_call_per_value() -> None:
    """A hello's options (a link's ~20 settings, 16,000 hellos in a 4 x 1,000 estate) are
    copied with one ``_deep`` call for the map and one per nested list, none per scalar;
    the copy is the codec's (lists new, tuples lists, bytearrays bytes)."""
    from treefed.federation.settings import LinkSettings
    from treefed.wire.frames import Hello

    options = {**LinkSettings(kind="tree", name="tree").to_options(),
               "nested": {"a": (1, "x"), "b": bytearray(b"z")}}
    nested = sum(type(v) in (list, tuple, dict) for v in options.values())
    hello = Hello(1, "broker", "b1", connector="tree", options=options)
    calls = _calls(copy_frame, hello)
    assert calls.count("_deep") <= 1 + nested + 2, calls   # + the nested map's two
    copy = copy_frame(hello)
    assert copy == through_codec(hello)
    assert copy.options is not options
    assert all(copy.options[k] is not v for k, v in options.items() if type(v) is list)
    assert copy.options["nested"] == {"a": [1, "x"], "b": b"z"}
