"""Tests for the codec's fast paths: the cumulative Ack field, batch encoding with one
encoder, and validation by type signature (which must refuse exactly what the
field-by-field path refuses)."""

from __future__ import annotations

import struct

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treefed.errors import FrameError, LocalError
from treefed.wire.codec import FrameDecoder, encode, encode_many
from treefed.wire.frames import SPECS, Ack, Deliver, Forward, Send, StatReply


def frame_bytes(*items: object) -> bytes:
    body = cbor2.dumps(list(items))
    return struct.pack(">I", len(body)) + body


def decode_all(data: bytes) -> list:
    decoder = FrameDecoder()
    decoder.receive_data(data)
    return list(decoder.frames())


def refusal(data: bytes) -> FrameError:
    with pytest.raises(FrameError) as info:
        decode_all(data)
    return info.value


class TestAckUpto:
    def test_upto_round_trips(self):
        """A cumulative Ack keeps its upto flag across the wire."""
        assert decode_all(encode(Ack("s1", "m9", upto=True))) == [Ack("s1", "m9", True)]

    def test_plain_ack_is_unchanged_on_the_wire(self):
        """upto=False is a trailing default: a plain Ack is still [5, sub, msg]."""
        assert cbor2.loads(encode(Ack("s1", "m1"))[4:]) == [5, "s1", "m1"]

    def test_upto_must_be_a_bool(self):
        """An int where the upto flag belongs is refused, naming the field."""
        err = refusal(frame_bytes(5, "s1", "m1", 1))
        assert err.code == "bad_field" and "Ack.upto" in err.message


class TestEncodeMany:
    def test_batch_is_the_concatenation_of_single_frames(self):
        """One encoder for the batch yields exactly each frame's own encoding in turn,
        lengths included, also for a body past 64 KiB."""
        frames = [Send("queue://A", "m1", {"k": 1}, b"x" * 70_000), Ack("s", "m1", True),
                  Deliver("s", "m2", "queue://A", {}, b"y", False, 4, 0, None, 1.5, 0.0),
                  Deliver("s", "m4", "queue://A", {}, b"z" * 70_000, True, 9, 2, "r", 1.5, 9.0),
                  Forward("queue://A", "m3", ["b1", "b2"])]
        data = encode_many(frames)
        assert data == b"".join(encode(f) for f in frames)
        assert decode_all(data) == frames

    def test_unencodable_frame_in_a_batch_is_a_local_error(self):
        """A value cbor2 cannot encode, mid-batch, raises LocalError naming the frame."""
        with pytest.raises(LocalError) as info:
            encode_many([Ack("s", "m"), StatReply({"x": object()}), Ack("s", "n")])
        assert info.value.code == "unencodable" and "StatReply" in info.value.message


class TestSignatureValidation:
    def test_non_empty_headers_are_still_checked(self):
        """A header value that is a list is refused even though the frame's field
        types all match the fast path."""
        err = refusal(frame_bytes(2, "queue://A", "m1", {"ok": 1, "bad": [1]}, b""))
        assert err.code == "bad_field" and "Send.headers" in err.message

    def test_string_list_items_are_still_checked(self):
        """A Forward whose path holds a number is refused on the fast path too."""
        err = refusal(frame_bytes(21, "queue://A", "m1", ["b1", 7]))
        assert err.code == "bad_field" and "Forward.path" in err.message

    def test_bool_is_not_an_int(self):
        """true in the priority field is refused (bool is an int subclass in Python)."""
        err = refusal(frame_bytes(2, "queue://A", "m1", {}, b"", False, True))
        assert err.code == "bad_field" and "Send.priority" in err.message

    def test_int_in_a_float_field_takes_the_slow_path_and_converts(self):
        """A timestamp sent as an int decodes to a float of the same value."""
        [frame] = decode_all(frame_bytes(7, "s", "m", "queue://A", {}, b"", False, 4, 0,
                                         None, 3))
        assert frame.timestamp == 3.0 and type(frame.timestamp) is float

    def test_field_counts_are_enforced(self):
        """Too few and too many fields are refused with their own codes."""
        assert refusal(frame_bytes(5, "s1")).code == "missing_field"
        assert refusal(frame_bytes(5, "s1", "m1", True, "extra")).code == "too_many_fields"


def generic_encoding(frame) -> bytes:
    """What the generic encoder writes: [code, *fields], trailing defaults cut."""
    specs = SPECS[type(frame)]
    values = [getattr(frame, spec.name) for spec in specs]
    n = len(values)
    while n and not specs[n - 1].required:
        spec = specs[n - 1]
        default = spec.default_factory() if spec.default_factory else spec.default
        value = values[n - 1]
        if type(value) is not type(default) or value != default:
            break
        n -= 1
    body = cbor2.dumps([7, *values[:n]])
    return struct.pack(">I", len(body)) + body


deliveries = st.builds(
    Deliver,
    sub=st.text(max_size=30), msg=st.text(max_size=300), dst=st.text(min_size=1, max_size=40),
    headers=st.dictionaries(st.text(max_size=5), st.one_of(
        st.none(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=5)), max_size=3),
    body=st.binary(max_size=300),
    persistent=st.booleans(), priority=st.integers(0, 9), redelivered=st.integers(0, 30),
    reply_to=st.one_of(st.none(), st.text(max_size=30)),
    timestamp=st.one_of(st.just(0.0), st.floats(0.0, 1e11)),
    expires=st.one_of(st.just(0.0), st.floats(0.0, 1e11)),
)


class TestHandBuiltDeliver:
    @settings(max_examples=200, deadline=None)
    @given(deliveries)
    def test_same_bytes_as_the_generic_encoder(self, frame):
        """Whatever its shape, a Deliver encodes to the generic encoder's exact bytes,
        alone and in a batch, and decodes back to itself."""
        expected = generic_encoding(frame)
        assert encode(frame) == expected
        assert encode_many([Ack("s", "m"), frame]) == encode(Ack("s", "m")) + expected
        assert decode_all(expected) == [frame]

    def test_wrongly_typed_field_falls_back_and_is_refused_as_before(self):
        """A Deliver holding a value cbor2 cannot encode raises LocalError as before."""
        frame = Deliver("s", "m", "queue://A", {"h": object()}, b"", False, 4, 0, None, 1.0)
        with pytest.raises(LocalError):
            encode_many([frame])
