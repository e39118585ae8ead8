"""A frame link's copy of a frame is one call per frame kind, written out once
(transport/memory.py ``_copier``, issue #14 in-process estate): no loop over the
kind's fields and no ``getattr`` per field for each frame that crosses."""

from __future__ import annotations

import sys

import pytest

from treefed.transport.memory import copy_frame
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
