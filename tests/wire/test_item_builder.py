"""Issue #14: a frame's CBOR array is built by generated straight-line code (one test per
optional field from the last), with exactly the result of the loop it replaces: trailing
defaults cut, 0 never standing in for False, a default-valued field kept when a later
one is set."""

from __future__ import annotations

import itertools

import pytest

from tests.wire.test_decode_flat import _bytecodes
from treefed.errors import LocalError
from treefed.wire.codec import _ENCODERS, _item, encode_many
from treefed.wire.frames import SPECS, Forward

_SAMPLE = {"str": "a", "int": 1, "bool": True, "bytes": b"x", "float": 1.5, "num?": 2.5,
           "str?": "r", "strlist": ["a"], "headers": {"k": 1}, "map": {"k": [1]}}


def _reference(frame) -> tuple:  # noqa: ANN001
    """The loop of 650488c's ``_item``."""
    code, getter, defaults, n_required = _ENCODERS[type(frame)]
    values = getter(frame)
    n = len(values)
    while n > n_required:
        v, d = values[n - 1], defaults[n - 1]
        if v is d or (type(v) is type(d) and v == d):
            n -= 1
        else:
            break
    return (code, *values[:n])


def _frames(cls: type) -> list:
    specs = SPECS[cls]
    required = [_SAMPLE[s.kind] for s in specs if s.required]
    optional = [s for s in specs if not s.required]
    out = []
    for mask in itertools.product((False, True), repeat=min(len(optional), 8)):
        kw = {s.name: _SAMPLE[s.kind] for s, on in zip(optional, mask) if on}
        out.append(cls(*required, **kw))
    return out


@pytest.mark.parametrize("cls", list(SPECS), ids=lambda c: c.__name__)
def test_the_generated_item_is_the_loops(cls):
    for frame in _frames(cls):
        assert _item(frame) == _reference(frame), frame


def test_zero_does_not_stand_in_for_false_and_non_frames_are_refused():
    f = Forward("queue://Q", "m", [], persistent=0, priority=4)   # 0 is not False
    assert _item(f) == _reference(f) and len(_item(f)) == 7
    with pytest.raises(LocalError):
        _item(object())
    with pytest.raises(LocalError):
        encode_many([object()])


def test_a_forwards_item_costs_fewer_bytecodes():
    f = Forward("queue://Q", "p:1", ["hq"], {"ph": "np", "t": 1.5}, b"x" * 100,
                timestamp=1.7e9)
    _item(f)
    assert _bytecodes(_item, f) <= 70   # before: 94
