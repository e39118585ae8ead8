"""Issue #14: a Send's CBOR is built by hand (``codec._send_cbor``), as a Deliver's and a
Forward's are -- a producer writes one per message (the chain bench's driver shares the
two cores with the brokers).  The bytes are exactly the generic encoder's, trailing
defaults cut the same way, whatever the frame's shape; shapes it does not cover take the
generic path (which refuses what it refused)."""

from __future__ import annotations

import struct

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treefed.errors import LocalError
from treefed.wire import codec
from treefed.wire.codec import FrameDecoder, encode, encode_many
from treefed.wire.frames import CODES, SPECS, Ack, Send


def generic_encoding(frame: Send) -> bytes:
    """What the generic encoder writes: [code, *fields], trailing defaults cut."""
    specs = SPECS[Send]
    values = [getattr(frame, spec.name) for spec in specs]
    n = len(values)
    while n and not specs[n - 1].required:
        spec = specs[n - 1]
        default = spec.default_factory() if spec.default_factory else spec.default
        value = values[n - 1]
        if type(value) is not type(default) or value != default:
            break
        n -= 1
    body = cbor2.dumps([CODES[Send], *values[:n]])
    return struct.pack(">I", len(body)) + body


sends = st.builds(
    Send,
    dst=st.text(min_size=1, max_size=40), id=st.text(max_size=300),
    headers=st.dictionaries(st.text(max_size=5), st.one_of(
        st.none(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=5),
        st.floats(allow_nan=False), st.booleans()), max_size=3),
    body=st.one_of(st.just(b""), st.binary(max_size=300)),
    persistent=st.booleans(), priority=st.one_of(st.just(4), st.integers(0, 9)),
    ttl=st.one_of(st.just(0), st.integers(0, 2**40)),
    reply_to=st.one_of(st.none(), st.text(max_size=300)),
    receipt=st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(sends)
def test_same_bytes_as_the_generic_encoder(frame):
    expected = generic_encoding(frame)
    assert encode(frame) == expected
    assert encode_many([Ack("s", "m"), frame, frame]) == \
        encode(Ack("s", "m")) + expected + expected
    decoder = FrameDecoder()
    decoder.receive_data(expected)
    if frame.ttl <= 2**31 - 1:   # beyond: refused by the decoder's limit (as before)
        assert decoder.take() == [frame]


def test_a_producers_sends_need_no_cbor_encoder(monkeypatch):
    """Before: one ``CBOREncoder.encode`` per Send."""
    calls = []
    real = cbor2.CBOREncoder

    class Counting:   # what encode_many uses of an encoder: its ``encode``
        def __init__(self, out):
            self._encode = real(out).encode

        def encode(self, obj):
            calls.append(obj)
            return self._encode(obj)

    monkeypatch.setattr(codec.cbor2, "CBOREncoder", Counting)
    frames = [Send("queue://Store1.Incoming", f"p:{i}", {"ph": "np", "t": 1.5}, b"x" * 100)
              for i in range(100)]
    frames += [Send("queue://Q", f"q:{i}", {}, b"x", True, receipt=True) for i in range(100)]
    data = encode_many(frames)
    assert calls == []
    assert data == b"".join(generic_encoding(f) for f in frames)


@pytest.mark.parametrize("frame", [
    Send("queue://Q", "p:1", {}, b"", priority=True),      # a bool is not an int
    Send("queue://Q", "p:1", {}, b"", priority=30),
    Send("queue://Q", "p:1", {}, b"", ttl=2**33),
    Send("queue://Q", "p:1", {}, b"", ttl=-1),
    Send("queue://Q", "p:1", {}, bytearray(b"x")),          # not exactly bytes
    Send("queue://Q", "p:1", {}, b"", receipt=1),           # not a bool
    Send("queue://Q", "p:1", {}, b"", reply_to=b"r"),       # not text
])
def test_other_shapes_take_the_generic_path(frame):
    assert codec._send_cbor(frame) is None
    assert encode(frame) == generic_encoding(frame)


def test_an_unencodable_header_is_refused_as_before():
    frame = Send("queue://Q", "p:1", {"h": object()}, b"")
    with pytest.raises(LocalError):
        encode_many([frame])
