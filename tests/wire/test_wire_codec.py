"""Tests for treefed.wire.codec: encoding, incremental decoding, validation."""

from __future__ import annotations

import struct

import cbor2
import pytest

from treefed.errors import FrameError, LocalError
from treefed.wire import (
    NEED_DATA,
    PROTOCOL_VERSION,
    SPECS,
    Ack,
    Admin,
    Advisory,
    Bye,
    Deliver,
    Error,
    Forward,
    ForwardAck,
    FrameDecoder,
    Hello,
    Nack,
    Ping,
    Pong,
    Receipt,
    Send,
    StatReply,
    Subtree,
    StatRequest,
    Subscribe,
    Unsubscribe,
    check_hello,
    encode,
    encode_many,
)

#: One instance per frame type with only the required fields set.
MINIMAL = [
    Hello(version=1, role="client"),
    Send(dst="queue://A", id="m1"),
    Subscribe(id="s1", dst="topic://PRICE.>"),
    Unsubscribe(id="s1"),
    Ack(sub="s1", msg="m1"),
    Nack(sub="s1", msg="m1"),
    Deliver(sub="s1", msg="m1", dst="queue://A"),
    Receipt(id="m1"),
    Ping(),
    Pong(),
    Error(code="bad_frame", message="nope"),
    Bye(),
    Advisory(kind="add", consumer="b1/c1/s1", dst="queue://A", origin="b1"),
    Forward(dst="queue://A", id="m1", path=[]),
    ForwardAck(ids=[]),
    Subtree(),
    StatRequest(),
    StatReply(),
    Admin("link.list"),
]

#: One instance per frame type with every field set away from its default.
FULL = [
    Hello(version=1, role="broker", broker_id="store-1", name="Store 1", connector="tree",
          node_type="leaf", ancestry=["region-1", "hq"], link_name="up", duplex=True,
          username="u", password="p", options={"network_ttl": 2, "filters": ["A.>"]}),
    Send(dst="queue://A", id="m1", headers={"k": "v", "n": 3, "f": 1.5, "b": True, "z": None},
         body=b"\x00payload", persistent=True, priority=9, ttl=5000, reply_to="temp-queue://r",
         receipt=True),
    Subscribe(id="s1", dst="queue://A", selector="price > 10", prefetch=5, priority=3),
    Unsubscribe(id="s2"),
    Ack(sub="s1", msg="m2"),
    Nack(sub="s1", msg="m3"),
    Deliver(sub="s1", msg="m1", dst="queue://A", headers={"k": "v"}, body=b"b", persistent=True,
            priority=1, redelivered=2, reply_to="queue://R", timestamp=1.7e9, expires=1.8e9),
    Receipt(id="m9"),
    Ping(token=7),
    Pong(token=-7),
    Error(code="bad_selector", message="at 3", ref="s1"),
    Bye(reason="shutdown"),
    Advisory(kind="remove", consumer="b1/c1/s1", dst="topic://T", origin="b1",
             selector="x = 1", priority=-5, path=["b2", "b3"]),
    Forward(dst="queue://A", id="m1", path=["hq"], headers={"h": 1}, body=b"xyz",
            persistent=True, priority=0, expires=99.5, reply_to="queue://R", timestamp=12.25,
            redelivered=1),
    ForwardAck(ids=["m1", "m2"]),
    Subtree(add=["s1", "s2"], remove=["s3"]),
    Advisory(kind="add", consumer="r1/~cover/queue://S.{broker}.>", dst="queue://S.*.>",
             origin="r1", cover="queue://S.{broker}.>"),
    StatRequest(what="links"),
    StatReply(data={"links": [{"peer": "hq", "up": True}], "depth": 3, "raw": b"\x01"}),
    Admin("link.add", {"name": "m1", "uri": "tcp://h:1", "excluded": ["queue://X"]}),
]


def frame_bytes(*items: object) -> bytes:
    """Length-prefixed CBOR of arbitrary items, for hand-made (malformed) frames."""
    out = b""
    for item in items:
        body = cbor2.dumps(item)
        out += struct.pack(">I", len(body)) + body
    return out


def raw_frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def decode_all(data: bytes, max_frame: int = 4 * 1024 * 1024) -> list:
    decoder = FrameDecoder(max_frame)
    decoder.receive_data(data)
    return list(decoder.frames())


def decode_error(data: bytes, max_frame: int = 4 * 1024 * 1024) -> FrameError:
    with pytest.raises(FrameError) as info:
        decode_all(data, max_frame)
    return info.value


class TestEncode:
    def test_every_frame_type_has_a_fixture(self):
        """The fixtures cover every frame type of the protocol, so round trips are complete."""
        assert {type(f) for f in MINIMAL} == set(SPECS)
        assert {type(f) for f in FULL} == set(SPECS)

    def test_layout_is_length_prefix_then_cbor_array(self):
        """A frame is a 4-byte big-endian length and a CBOR array [code, *fields]."""
        data = encode(Ack(sub="s1", msg="m1"))
        (length,) = struct.unpack(">I", data[:4])
        assert length == len(data) - 4
        assert cbor2.loads(data[4:]) == [5, "s1", "m1"]

    def test_trailing_defaults_are_omitted(self):
        """Fields left at their defaults at the end of the array are not sent."""
        assert cbor2.loads(encode(Send(dst="queue://A", id="m1"))[4:]) == [2, "queue://A", "m1"]
        assert cbor2.loads(encode(Ping())[4:]) == [9]

    def test_defaults_before_a_set_field_are_kept(self):
        """A default field followed by a non-default one is sent so positions hold."""
        item = cbor2.loads(encode(Send(dst="queue://A", id="m1", receipt=True))[4:])
        assert item == [2, "queue://A", "m1", {}, b"", False, 4, 0, None, True]

    def test_zero_does_not_stand_in_for_false(self):
        """Trimming compares types too: an int 0 in a bool field is not dropped as False."""
        item = cbor2.loads(encode(Hello(version=1, role="client", duplex=0))[4:])
        assert item[-1] == 0 and len(item) == 10

    def test_encode_many_is_the_concatenation(self):
        """encode_many produces exactly the frames' encodings back to back."""
        assert encode_many(FULL) == b"".join(encode(f) for f in FULL)
        assert encode_many([]) == b""

    def test_non_frame_is_a_local_error(self):
        """Encoding something that is not a frame is our own misuse, not a peer's fault."""
        with pytest.raises(LocalError) as info:
            encode("hello")
        assert info.value.code == "not_a_frame"

    def test_unencodable_value_is_a_local_error(self):
        """A value cbor2 cannot encode raises LocalError(code='unencodable')."""
        with pytest.raises(LocalError) as info:
            encode(StatReply(data={"x": object()}))
        assert info.value.code == "unencodable"


class TestRoundTrip:
    @pytest.mark.parametrize("frame", MINIMAL, ids=lambda f: type(f).__name__)
    def test_minimal_frames_round_trip(self, frame):
        """A frame with only required fields decodes to an equal frame, defaults filled."""
        assert decode_all(encode(frame)) == [frame]

    @pytest.mark.parametrize("frame", FULL, ids=lambda f: type(f).__name__)
    def test_full_frames_round_trip(self, frame):
        """A frame with every field set decodes to an equal frame."""
        assert decode_all(encode(frame)) == [frame]

    def test_int_in_float_field_becomes_float(self):
        """Another encoder may shorten 2.0 to 2; the decoder hands back a float."""
        (frame,) = decode_all(frame_bytes([7, "s", "m", "queue://A", {}, b"", False, 4, 0,
                                           None, 2]))
        assert frame.timestamp == 2.0 and type(frame.timestamp) is float


class TestFrameDecoder:
    def test_needs_data_until_a_frame_is_complete(self):
        """next_frame returns NEED_DATA for an empty or partial buffer."""
        decoder = FrameDecoder()
        assert decoder.next_frame() is NEED_DATA
        data = encode(FULL[1])
        decoder.receive_data(data[:3])
        assert decoder.next_frame() is NEED_DATA
        decoder.receive_data(data[3:-1])
        assert decoder.next_frame() is NEED_DATA
        decoder.receive_data(data[-1:])
        assert decoder.next_frame() == FULL[1]
        assert decoder.next_frame() is NEED_DATA

    def test_many_frames_from_one_buffer(self):
        """Every complete frame in one received buffer is returned, in order."""
        frames = FULL * 20
        decoder = FrameDecoder()
        decoder.receive_data(encode_many(frames) + encode(Ping(token=1))[:5])
        assert list(decoder.frames()) == frames
        assert decoder.buffered == 5
        assert decoder.next_frame() is NEED_DATA

    def test_one_byte_at_a_time(self):
        """A stream fed one byte at a time yields the same frames as one big buffer."""
        frames = FULL + MINIMAL
        decoder = FrameDecoder()
        got = []
        for byte in encode_many(frames):
            decoder.receive_data(bytes([byte]))
            got.extend(decoder.frames())
        assert got == frames
        assert decoder.buffered == 0

    def test_next_frame_and_frames_share_the_queue(self):
        """next_frame takes one frame; frames() then yields the rest."""
        decoder = FrameDecoder()
        decoder.receive_data(encode_many(FULL[:4]))
        assert decoder.next_frame() == FULL[0]
        assert list(decoder.frames()) == FULL[1:4]

    def test_long_stream_keeps_buffer_bounded(self):
        """Consumed bytes are released, so a long stream does not grow the buffer."""
        decoder = FrameDecoder()
        chunk = encode_many([FULL[1]] * 50)
        count = 0
        for _ in range(200):
            decoder.receive_data(chunk[:1000])
            count += len(list(decoder.frames()))
            decoder.receive_data(chunk[1000:])
            count += len(list(decoder.frames()))
            assert decoder.buffered < len(chunk)
        assert count == 200 * 50
        assert decoder.buffered == 0

    def test_bad_max_frame_is_refused(self):
        """max_frame must be a positive int that fits the 4-byte length."""
        for bad in (0, -1, 2**32, 1.5):
            with pytest.raises(LocalError):
                FrameDecoder(bad)


class TestMalformed:
    def test_oversized_length_refused_before_the_body(self):
        """A length above max_frame is refused as soon as the 4 length bytes arrive."""
        decoder = FrameDecoder(max_frame=1000)
        decoder.receive_data(struct.pack(">I", 1001))
        with pytest.raises(FrameError) as info:
            decoder.next_frame()
        assert info.value.code == "oversized"
        assert "1001" in info.value.message and "1000" in info.value.message

    def test_frame_at_max_is_accepted(self):
        """A frame exactly max_frame long is fine."""
        data = encode(Send(dst="queue://A", id="m1", body=b"x" * 100))
        assert decode_all(data, max_frame=len(data) - 4) == [Send(dst="queue://A", id="m1",
                                                                  body=b"x" * 100)]

    def test_zero_length_frame(self):
        """A zero-length frame carries no CBOR item and is refused."""
        err = decode_error(b"\x00\x00\x00\x00")
        assert err.code == "bad_cbor" and "zero-length" in err.message

    def test_undecodable_cbor(self):
        """Bytes that are not CBOR give bad_cbor."""
        assert decode_error(raw_frame(b"\xff\xff")).code == "bad_cbor"

    def test_truncated_cbor_item(self):
        """A CBOR item cut short by the frame length gives bad_cbor."""
        body = cbor2.dumps([2, "queue://A", "m1"])
        assert decode_error(raw_frame(body[:-1])).code == "bad_cbor"

    def test_item_overrunning_into_next_frame(self):
        """An item that claims bytes of the following frame is refused, not spliced."""
        body = cbor2.dumps([2, "queue://A", "m1"])
        data = raw_frame(body[:-2]) + encode(Ping())
        err = decode_error(data)
        assert err.code == "bad_cbor"

    def test_trailing_bytes(self):
        """Bytes after the CBOR item inside the frame give bad_cbor naming the sizes."""
        body = cbor2.dumps([9, 1]) + b"\x00"
        err = decode_error(raw_frame(body))
        assert err.code == "bad_cbor" and str(len(body)) in err.message

    def test_invalid_utf8(self):
        """A text string that is not UTF-8 gives bad_cbor."""
        assert decode_error(raw_frame(b"\x82\x0c\x62\xff\xfe")).code == "bad_cbor"

    @pytest.mark.parametrize("body", [
        bytes.fromhex("82 0c c1 1a 51 4b 67 b0"),      # epoch datetime (tag 1)
        bytes.fromhex("82 09 c2 49 01 00 00 00 00 00 00 00 00"),  # bignum (tag 2)
        bytes.fromhex("82 0c d9 01 02 81 01"),          # set (tag 258)
        bytes.fromhex("82 0c d8 1c 61 61"),             # shareable (tag 28)
        bytes.fromhex("d9 d9 f7 81 09"),                # self-describe (tag 55799)
        bytes.fromhex("82 0c d8 ff 01"),                # unknown tag
    ])
    def test_tags_are_refused(self, body):
        """Semantic tags never build objects from peer input: every tag gives bad_cbor."""
        assert decode_error(raw_frame(body)).code == "bad_cbor"

    def test_undefined_and_simple_values(self):
        """CBOR undefined and simple values are not field values: bad_field."""
        assert decode_error(raw_frame(b"\x82\x0c\xf7")).code == "bad_field"
        assert decode_error(raw_frame(b"\x82\x0c\xf0")).code == "bad_field"
        err = decode_error(frame_bytes([31, {"a": cbor2.undefined}]))
        assert err.code == "bad_field" and "StatReply.data['a']" in err.message

    def test_not_an_array(self):
        """A frame whose item is not an array gives not_array."""
        err = decode_error(frame_bytes({"type": 9}))
        assert err.code == "not_array" and "map" in err.message

    @pytest.mark.parametrize("item", [[], [99], ["ping"], [True], [9.0]])
    def test_unknown_type(self, item):
        """An empty array or a code not in BY_CODE gives unknown_type."""
        assert decode_error(frame_bytes(item)).code == "unknown_type"

    def test_missing_field_is_named(self):
        """A missing required field gives missing_field naming the frame and field."""
        err = decode_error(frame_bytes([2, "queue://A"]))
        assert err.code == "missing_field"
        assert "Send" in err.message and "'id'" in err.message

    def test_too_many_fields(self):
        """More fields than the type has gives too_many_fields."""
        err = decode_error(frame_bytes([9, 1, 2]))
        assert err.code == "too_many_fields" and "Ping" in err.message

    @pytest.mark.parametrize("item, where, expected", [
        ([2, 5, "m1"], "Send.dst", "expected str"),
        ([9, True], "Ping.token", "expected int"),
        ([9, 1.0], "Ping.token", "expected int"),
        ([1, 1, "client", None, None, None, None, [], None, 1], "Hello.duplex", "expected bool"),
        ([2, "q", "m", {}, "text"], "Send.body", "expected bytes"),
        ([7, "s", "m", "q", {}, b"", False, 4, 0, None, "now"], "Deliver.timestamp",
         "expected float"),
        ([7, "s", "m", "q", {}, b"", False, 4, 0, None, False], "Deliver.timestamp",
         "expected float"),
        ([3, "s", "q", 5], "Subscribe.selector", "expected str or null"),
        ([22, "m1"], "ForwardAck.ids", "expected array of str"),
        ([22, ["m1", 2]], "ForwardAck.ids", "item 1"),
        ([2, "q", "m", []], "Send.headers", "expected map"),
        ([2, "q", "m", {b"k": "x"}], "Send.headers", "key b'k'"),
        ([2, "q", "m", {"k": b"raw"}], "Send.headers['k']", "got bytes"),
        ([2, "q", "m", {"k": [1]}], "Send.headers['k']", "got array"),
        ([31, {"a": {b"k": 1}}], "StatReply.data['a']", "key b'k'"),
        ([31, [1]], "StatReply.data", "expected map"),
        ([11, "c", "m", 3], "Error.ref", "expected str or null"),
    ])
    def test_mistyped_field_is_named(self, item, where, expected):
        """A mistyped field gives bad_field naming the field and the expected type."""
        err = decode_error(frame_bytes(item))
        assert err.code == "bad_field"
        assert where in err.message and expected in err.message

    def test_non_text_map_keys_are_refused_while_decoding(self):
        """Int or map keys (hash-collision fodder) are refused by the CBOR layer: bad_cbor."""
        err = decode_error(frame_bytes([2, "q", "m", {1: "x"}]))
        assert err.code == "bad_cbor" and "map key" in err.message
        assert decode_error(frame_bytes([31, {"a": {2: 1}}])).code == "bad_cbor"

    def test_duplicate_map_keys(self):
        """A map repeating a key is ambiguous and refused: bad_cbor."""
        body = b"\x84\x02\x61q\x61m" + b"\xa2\x61k\x01\x61k\x02"  # [2,"q","m",{k:1,k:2}]
        err = decode_error(raw_frame(body))
        assert err.code == "bad_cbor" and "duplicate" in err.message.lower()

    def test_null_in_required_field(self):
        """null is not a value for a non-optional field."""
        err = decode_error(frame_bytes([5, None, "m1"]))
        assert err.code == "bad_field" and "Ack.sub" in err.message

    def test_frames_before_the_bad_one_are_returned(self):
        """Good frames ahead of a malformed one come out first, then the error."""
        decoder = FrameDecoder()
        decoder.receive_data(encode_many(FULL[:3]) + frame_bytes([99]) + encode(Ping()))
        assert [decoder.next_frame() for _ in range(3)] == FULL[:3]
        with pytest.raises(FrameError) as info:
            decoder.next_frame()
        assert info.value.code == "unknown_type"

    def test_error_is_sticky(self):
        """After raising, every call raises the same error: the connection is doomed."""
        decoder = FrameDecoder()
        decoder.receive_data(frame_bytes({"x": 1}))
        with pytest.raises(FrameError) as first:
            decoder.next_frame()
        with pytest.raises(FrameError) as again:
            list(decoder.frames())
        assert again.value is first.value
        with pytest.raises(FrameError) as fed:
            decoder.receive_data(encode(Ping()))
        assert fed.value is first.value
        assert decoder.buffered == 0

    def test_deep_nesting_is_refused(self):
        """Nesting far beyond any frame's needs gives bad_cbor, not a RecursionError."""
        body = b"\x82\x1f" + b"\x81" * 5000 + b"\x00"
        assert decode_error(raw_frame(body)).code == "bad_cbor"


class TestCheckHello:
    def test_accepts_matching_hello(self):
        """A hello of our version and a known role is returned unchanged."""
        hello = Hello(version=PROTOCOL_VERSION, role="broker")
        assert check_hello(hello, PROTOCOL_VERSION) is hello

    def test_other_version(self):
        """A different protocol version gives bad_version naming both versions."""
        with pytest.raises(FrameError) as info:
            check_hello(Hello(version=99, role="client"), 1)
        assert info.value.code == "bad_version"
        assert "99" in info.value.message and "1" in info.value.message

    def test_first_frame_not_hello(self):
        """Anything but a hello as the first frame gives not_hello."""
        with pytest.raises(FrameError) as info:
            check_hello(Ping(), 1)
        assert info.value.code == "not_hello"

    def test_unknown_or_unwanted_role(self):
        """An unknown role, or one the listener does not take, gives bad_role."""
        with pytest.raises(FrameError) as info:
            check_hello(Hello(version=1, role="admin"), 1)
        assert info.value.code == "bad_role"
        with pytest.raises(FrameError):
            check_hello(Hello(version=1, role="client"), 1, roles=("broker",))
