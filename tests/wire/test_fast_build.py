"""Issue #14: every broker and client decodes every message once; a decoded CBOR item
becomes its frame through one generated function per frame type and item length
(``codec._fast_builders``): each field's type tested by identity, the containers and
limits in the same expression, the frame built from the unpacked fields -- no signature
tuple built and hashed, no checker call, no slice per frame.  It returns a frame exactly
when the usual path's signature and limits test passes (and the same frame); anything
else takes the usual path, which names the problem as before."""

from __future__ import annotations

import random
import struct

import cbor2
import pytest

from treefed.errors import FrameError
from treefed.wire import codec
from treefed.wire.codec import _DECODERS, _FAST, FrameDecoder, _build, encode_many
from treefed.wire.frames import BY_CODE, SPECS, Ack, Deliver, Forward, Send

_POOL = [
    "", "q", "queue://Q", "x" * 5000, None, 0, 4, 9, -1, 10, 2**40, True, False,
    0.0, 1.5, -2.0, 1e12, float("inf"), float("nan"), b"", b"body", [], ["a", "b"],
    ["a", 1], ["y" * 5000], ["p"] * 300, ["a" * 3000, "b" * 3000], ["c" * 4096],
    {}, {"k": "v", "n": 1, "f": 2.5, "b": True},
    {"k": None}, {1: "v"}, {"k": [1]}, {"k": b"x"}, ("t",),
]


def _old_fast_answer(item: list):
    """The usual path's fast branch: signature + containers/limits, then ``cls(*fields)``."""
    cls, _, _, _, signatures, _, _, within = _DECODERS[item[0]]
    if tuple(map(type, item)) in signatures and within[len(item)](item):
        return cls(*item[1:])
    return None


def _valid_values(cls: type, rng: random.Random) -> list:
    frame_item = {
        Send: ["queue://Q", "p:1", {"h": 1}, b"x", True, 4, 0, None, False],
        Forward: ["queue://Q", "p:1", ["a"], {"h": "v"}, b"x", False, 4, 0.0, None, 1.5, 0],
        Deliver: ["s", "p:1", "queue://Q", {}, b"x", False, 4, 0, "r", 1.5, 0.0],
        Ack: ["s", "p:1", True],
    }.get(cls)
    if frame_item is None:
        return [rng.choice(_POOL) for _ in SPECS[cls]]
    return list(frame_item)


@pytest.mark.parametrize("code", sorted(BY_CODE))
def test_a_builder_answers_exactly_what_the_usual_fast_branch_does(code):
    cls = BY_CODE[code]
    rng = random.Random(code)
    builders = _FAST[code]
    for _ in range(1500):
        values = _valid_values(cls, rng)
        for _ in range(rng.randrange(0, 3)):   # spoil a field or two, or none
            values[rng.randrange(len(values))] = rng.choice(_POOL)
        item = [code, *values[:rng.randrange(0, len(values) + 2)]]
        n = len(item)
        build = builders[n] if n < len(builders) else None
        got = build(item) if build is not None else None
        want = _old_fast_answer(item)
        assert got == want or (got is None and want is None) or repr(got) == repr(want), item
        if want is not None:
            assert type(got) is cls
        # and _build as a whole: the same frame, or the same refusal
        try:
            built = _build(item)
        except FrameError as exc:
            assert want is None, item
            assert exc.code in ("bad_field", "missing_field", "too_many_fields"), exc
        else:
            if want is not None:
                assert repr(built) == repr(want)


@pytest.mark.parametrize("item, code", [
    ([True, 1, "broker"], "unknown_type"),            # a bool is not a code ...
    ([21.0, "queue://Q", "p:1", ["a"]], "unknown_type"),   # ... nor a float equal to one
    ({0: 5, "s": 1, "m": 2, True: 3}, "not_array"),   # a map whose keys unpack like an Ack
    ([], "unknown_type"),
    ([5], "missing_field"),
    ([999, "x"], "unknown_type"),
])
def test_odd_items_are_refused_as_before(item, code):
    with pytest.raises(FrameError) as info:
        _build(item)
    assert info.value.code == code


def test_decoding_the_chains_frames_builds_no_signature_tuple(monkeypatch):
    """Before: one ``tuple(map(type, item))`` per decoded frame (200 here)."""
    calls = []

    def counting_tuple(*args):
        calls.append(1)
        return tuple(*args)

    frames = ([Send("queue://Q", f"p:{i}", {"ph": "np", "t": 1.5}, b"x" * 100)
               for i in range(50)]
              + [Forward("queue://Q", f"p:{i}", ["hq"], {"ph": "np"}, b"x", False, 4, 0.0,
                         None, 1.7e9) for i in range(50)]
              + [Deliver("s1", f"p:{i}", "queue://Q", {"t": 1.5}, b"x", False, 4, 0, None,
                         1.7e9, 0.0) for i in range(50)]
              + [Ack("s1", f"p:{i}", True) for i in range(50)])
    data = encode_many(frames)
    monkeypatch.setattr(codec, "tuple", counting_tuple, raising=False)
    decoder = FrameDecoder()
    decoder.receive_data(data)
    assert decoder.take() == frames
    assert calls == []


def test_a_broker_path_is_measured_without_max(monkeypatch):
    """A path's items are each within MAX_NAME when all of them together are: one join
    instead of ``max(map(len, path))`` per Forward (before: one ``max`` per Forward);
    a path whose items are long together but not each is still valid."""
    import builtins

    frames = [Forward("queue://Q", f"p:{i}", ["hq", "region"], {}, b"x", False, 4, 0.0, None,
                      1.7e9) for i in range(100)]
    long_path = Forward("queue://Q", "p:x", ["a" * 3000, "b" * 3000], {}, b"x",
                        timestamp=1.7e9)
    data = encode_many(frames)
    calls = []
    real_max = builtins.max

    def counting_max(*args, **kwargs):
        calls.append(1)
        return real_max(*args, **kwargs)

    decoder = FrameDecoder()
    decoder.receive_data(data)
    monkeypatch.setattr(builtins, "max", counting_max)
    got = decoder.take()
    monkeypatch.undo()
    assert got == frames
    assert calls == []
    decoder.receive_data(encode_many([long_path]))
    assert decoder.take() == [long_path]


def test_a_length_mismatch_names_the_frame_it_is_in():
    """The body offset is no longer kept per frame: the error still measures the right
    frame (the second of three here: 3 bytes longer than its prefix says)."""
    good = encode_many([Ack("s", "m")])
    body = cbor2.dumps([5, "s", "m"]) + b"\xf6\xf6\xf6"   # the item, then 3 more bytes
    bad = struct.pack(">I", len(body)) + body
    decoder = FrameDecoder()
    decoder.receive_data(good + bad + good)
    assert decoder.take() == [Ack("s", "m")]
    with pytest.raises(FrameError) as info:
        decoder.take()
    assert info.value.code == "bad_cbor"
    item = len(cbor2.dumps([5, "s", "m"]))
    assert str(info.value.message) == (f"CBOR item is {item} bytes but the frame length "
                                       f"is {len(body)}")


def test_builders_are_generated_for_the_frame_types_a_process_decodes():
    """A type's builders are generated at its first decoded frame, not at import (each
    process decodes a few of the types; issue #14's idle memory), and then kept."""
    import subprocess
    import sys

    probe = ("from treefed.wire import codec\n"
             "from treefed.wire.frames import Ack\n"
             "before = len(codec._FAST)\n"
             "codec._build([codec.CODES[Ack], 's', 'p:1'])\n"
             "first = codec._FAST[codec.CODES[Ack]]\n"
             "codec._build([codec.CODES[Ack], 's', 'p:2'])\n"
             "print(before, len(codec._FAST), codec._FAST[codec.CODES[Ack]] is first)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["0", "1", "True"], out
