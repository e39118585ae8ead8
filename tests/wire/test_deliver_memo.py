"""The hand-built Deliver encodes its subscription id and destination once, not per
message (issue #14): ``codec._TEXT_MEMO`` keeps their CBOR text items, bounded."""

from __future__ import annotations

import struct

import cbor2
import pytest

from treefed.errors import LocalError
from treefed.wire import codec
from treefed.wire.codec import encode_many
from treefed.wire.frames import Deliver


def generic(frame: Deliver) -> bytes:
    body = cbor2.dumps(codec._item(frame))
    return struct.pack(">I", len(body)) + body


def deliver(sub: str, i: int, dst: str = "queue://Q") -> Deliver:
    return Deliver(sub, f"p:{i}", dst, {}, b"x" * 10, False, 4, 0, None, 1.5, 0.0)


def test_repeated_and_new_names_give_the_generic_bytes():
    frames = [deliver(s, i, d) for i in range(40)
              for s, d in (("s1", "queue://Q"), ("é-sub", "topic://Ünïcode"),
                           ("x" * 300, "queue://" + "y" * 300))]
    assert encode_many(frames) == b"".join(map(generic, frames))
    # asked again (the memo now holds them): the same bytes
    assert encode_many(frames) == b"".join(map(generic, frames))


def test_the_memo_is_bounded():
    frames = [deliver(f"sub-{i}", i) for i in range(codec._TEXT_MEMO_MAX * 2 + 10)]
    assert encode_many(frames) == b"".join(map(generic, frames))
    assert len(codec._TEXT_MEMO) <= codec._TEXT_MEMO_MAX


def test_an_unencodable_name_is_refused_as_before():
    with pytest.raises((LocalError, UnicodeEncodeError)):
        encode_many([deliver("bad\ud800", 1)])
    assert "bad\ud800" not in codec._TEXT_MEMO
