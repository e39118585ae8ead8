"""Issue #14: a Forward's CBOR is built by hand (``codec._forward_cbor``), as a Deliver's
is -- every broker of HQ -> region -> store but the last writes one per message, and
cbor2's encoder called its output's ``write`` once per item.  The bytes are exactly the
generic encoder's, whatever the frame's shape; shapes it does not cover take the generic
path (which refuses what it refused)."""

from __future__ import annotations

import struct

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treefed.errors import LocalError
from treefed.wire import codec
from treefed.wire.codec import FrameDecoder, encode, encode_many
from treefed.wire.frames import CODES, SPECS, Ack, Forward


def generic_encoding(frame: Forward) -> bytes:
    """What the generic encoder writes: [code, *fields], trailing defaults cut."""
    specs = SPECS[Forward]
    values = [getattr(frame, spec.name) for spec in specs]
    n = len(values)
    while n and not specs[n - 1].required:
        spec = specs[n - 1]
        default = spec.default_factory() if spec.default_factory else spec.default
        value = values[n - 1]
        if type(value) is not type(default) or value != default:
            break
        n -= 1
    body = cbor2.dumps([CODES[Forward], *values[:n]])
    return struct.pack(">I", len(body)) + body


def decode_all(data: bytes) -> list:
    decoder = FrameDecoder()
    decoder.receive_data(data)
    return decoder.take()


names = st.text(min_size=1, max_size=30)
forwards = st.builds(
    Forward,
    dst=st.text(min_size=1, max_size=40), id=st.text(max_size=300),
    path=st.lists(st.one_of(names, st.text(max_size=300)), min_size=0, max_size=30),
    headers=st.dictionaries(st.text(max_size=5), st.one_of(
        st.none(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=5),
        st.floats(allow_nan=False),   # NaN != NaN: the round trip could not compare
        st.booleans()), max_size=3),
    body=st.binary(max_size=300),
    persistent=st.booleans(), priority=st.integers(0, 9),
    expires=st.one_of(st.just(0.0), st.floats(0.0, 1e11)),
    reply_to=st.one_of(st.none(), st.text(max_size=300)),
    timestamp=st.one_of(st.just(0.0), st.floats(0.0, 1e11)),
    redelivered=st.integers(0, 40),
)


@settings(max_examples=300, deadline=None)
@given(forwards)
def test_same_bytes_as_the_generic_encoder(frame):
    """Whatever its shape, a Forward encodes to the generic encoder's exact bytes, alone
    and in a batch, and decodes back to itself."""
    expected = generic_encoding(frame)
    assert encode(frame) == expected
    assert encode_many([Ack("s", "m"), frame, frame]) == \
        encode(Ack("s", "m")) + expected + expected
    if len(frame.path) <= 256 and all(len(p) <= 4096 for p in frame.path):
        assert decode_all(expected) == [frame]


def test_usual_forwards_need_no_cbor_encoder(monkeypatch):
    """A run of the chain's Forwards is written without cbor2's encoder (before: one
    ``CBOREncoder.encode`` per Forward); the headers map alone is ``dumps``ed."""
    calls = []
    real = cbor2.CBOREncoder

    class Counting:   # what encode_many uses of an encoder: its ``encode``
        def __init__(self, out):
            self._encode = real(out).encode

        def encode(self, obj):
            calls.append(obj)
            return self._encode(obj)

    monkeypatch.setattr(codec.cbor2, "CBOREncoder", Counting)
    frames = [Forward("queue://Store1.Incoming", f"p:{i}\x1fscope", ["hq", "region"],
                      {"ph": "np", "t": 1.5}, b"x" * 100, False, 4, 0.0, None, 1.7e9 + i)
              for i in range(200)]
    data = encode_many(frames)
    assert calls == []
    assert data == b"".join(generic_encoding(f) for f in frames)
    encode_many([Ack("s", "m")])   # the counter counts: a generic frame still uses it
    assert len(calls) == 1


@pytest.mark.parametrize("frame", [
    Forward("queue://Q", "p:1", ["a", b"b"], {}, b"", timestamp=1.0),   # non-text path item
    Forward("queue://Q", "p:1", ["a", ["b"]], {}, b"", timestamp=1.0),  # unhashable item
    Forward("queue://Q", "p:1", ["a"], {}, b"", timestamp=0.0),         # fields cut
    Forward("queue://Q", "p:1", ["a"] * 24, {}, b"", timestamp=1.0),    # a long path
    Forward("queue://Q", "p:1", ["a"], {}, b"", priority=True, timestamp=1.0),   # not an int
    Forward("queue://Q", "p:1", ["a"], {}, b"", redelivered=30, timestamp=1.0),
    Forward("queue://Q", "p:1", ["a"], {}, b"", expires=float("inf"), timestamp=1.0),
    Forward("queue://Q", "p:1", ("a",), {}, b"", timestamp=1.0),        # a tuple path
])
def test_other_shapes_take_the_generic_path(frame):
    assert codec._forward_cbor(frame) is None
    assert encode(frame) == generic_encoding(frame)


def test_an_unencodable_header_is_refused_as_before():
    frame = Forward("queue://Q", "p:1", ["a"], {"h": object()}, b"", timestamp=1.0)
    with pytest.raises(LocalError):
        encode_many([frame])
    with pytest.raises(LocalError):
        encode(frame)
