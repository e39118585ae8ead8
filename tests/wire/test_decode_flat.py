"""Issue #14: validating a decoded message frame costs no Python bytecode per header or
per path entry (the checks of those containers run in C: a set of the item types), and
the range/length checks are one expression per item length; the results are the same
as the field-by-field checks (bad input is still refused, naming the field)."""

from __future__ import annotations

import sys

import pytest

from treefed.errors import FrameError
from treefed.node.node import _body_bytes
from treefed.wire.codec import FrameDecoder, encode, encode_many
from treefed.wire.frames import Forward, Send


def _bytecodes(fn, *args) -> int:
    """Python bytecodes executed by ``fn(*args)`` (sys.settrace opcode events)."""
    n = 0

    def opcode(frame, event, arg):  # noqa: ANN001
        nonlocal n
        if event == "opcode":
            n += 1
        return opcode

    def call(frame, event, arg):  # noqa: ANN001
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return opcode

    sys.settrace(call)
    try:
        fn(*args)
    finally:
        sys.settrace(None)
    return n


def _decode(data: bytes) -> list:
    decoder = FrameDecoder()
    decoder.receive_data(data)
    return list(decoder.frames())


def _forward(headers: int, path: int) -> Forward:
    return Forward("queue://Q", "p:1", [f"b{i}" for i in range(path)],
                   {f"h{i}": i for i in range(headers)}, b"x" * 100, timestamp=1.5)


def test_decoding_costs_no_bytecode_per_header_or_path_entry():
    small = encode(_forward(headers=2, path=1))
    big = encode(_forward(headers=40, path=30))
    _decode(small), _decode(big)   # warm
    assert _decode(big) == [_forward(headers=40, path=30)]
    # before: ~10 bytecodes more per header and ~5 per path entry
    assert _bytecodes(_decode, big) == _bytecodes(_decode, small)


def test_summing_a_chunks_bodies_costs_no_bytecode_per_frame():
    few = _decode(encode_many([Send("queue://Q", f"p:{i}", body=b"x" * i) for i in range(2)]))
    many = _decode(encode_many([Send("queue://Q", f"p:{i}", body=b"x" * i)
                                for i in range(200)]))
    assert _body_bytes(many) == sum(range(200))
    assert _bytecodes(_body_bytes, many) == _bytecodes(_body_bytes, few)
    mixed = many[:3] + _decode(encode(_forward(1, 1)))
    assert _body_bytes(mixed) == 0 + 1 + 2 + 100


@pytest.mark.parametrize("bad, field", [
    (Forward("queue://Q", "p:1", ["b"], {"k": [1]}), "headers"),
    (Forward("queue://Q", "p:1", ["b"], {"k": 1}, priority=12), "priority"),
    (Forward("queue://Q", "p:1", ["b" * 5000]), "path"),
    (Forward("queue://Q", "p:1", ["b"] * 300), "path"),
    (Forward("queue://Q", "p:1", ["b"], reply_to="r" * 5000), "reply_to"),
    (Forward("queue://Q", "p:1", ["b"], redelivered=-1), "redelivered"),
    (Forward("queue://Q", "p:1", ["b"], timestamp=float("nan")), "timestamp"),
])
def test_bad_fields_are_still_refused_by_name(bad, field):
    import cbor2

    from treefed.wire.codec import _item, _pack_len

    body = cbor2.dumps(_item(bad))   # encode() itself would not check the limits
    with pytest.raises(FrameError) as info:
        _decode(_pack_len(len(body)) + body)
    assert f"Forward.{field}" in info.value.message, info.value.message


def test_a_path_with_a_non_text_item_is_refused():
    import cbor2

    from treefed.wire.codec import _pack_len

    item = [_code(), "queue://Q", "p:1", ["b", 7]]
    body = cbor2.dumps(item)
    with pytest.raises(FrameError) as info:
        _decode(_pack_len(len(body)) + body)
    assert "path" in info.value.message and "item 1" in info.value.message


def _code() -> int:
    from treefed.wire.frames import CODES

    return CODES[Forward]


def test_a_forwards_containers_and_limits_are_one_expression():
    """One generated expression per item length checks the containers and the limits
    (before: a call per container field, then the limits): per decoded Forward of the
    chain bench's shape 388 bytecodes before, 331 after (457 at 650488c)."""
    frames = encode_many([_forward(headers=2, path=1)] * 100)
    _decode(frames)
    assert _bytecodes(_decode, frames) <= 100 * 350


def test_a_frame_with_a_map_field_takes_the_field_by_field_path():
    from treefed.wire.frames import PROTOCOL_VERSION, Hello

    hello = Hello(PROTOCOL_VERSION, "broker", broker_id="b", ancestry=["r"],
                  options={"network_ttl": 2, "filters": ["a", {"b": None}]})
    assert _decode(encode(hello)) == [hello]


def test_taking_a_chunks_frames_costs_no_bytecode_per_frame():
    """``FrameDecoder.take`` (used by ``FramedStream.receive_frames``) hands the decoded
    frames over as one list: no generator step and append per frame (before: ~15 each)."""
    from treefed.wire.codec import FrameDecoder

    def taken(data: bytes) -> int:
        decoder = FrameDecoder()
        decoder.receive_data(data)
        decoder._parse()   # decoded apart: only the hand-over is counted
        return _bytecodes(decoder.take)

    few = encode_many([_forward(1, 1)] * 2)
    many = encode_many([_forward(1, 1)] * 200)
    assert taken(many) == taken(few)


def test_take_returns_the_frames_before_a_malformed_one_then_raises():
    from treefed.wire.codec import FrameDecoder

    decoder = FrameDecoder()
    good = encode_many([_forward(0, 0)] * 3)
    decoder.receive_data(good + b"\x00\x00\x00\x01\xff")   # a 1-byte frame: bad CBOR
    assert decoder.take() == [_forward(0, 0)] * 3
    with pytest.raises(FrameError):
        decoder.take()
    assert FrameDecoder().take() == []
