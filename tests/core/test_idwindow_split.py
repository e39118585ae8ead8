"""IdWindow's id parse with its last-producer shortcut gives the same answers as the
plain parse (issue #14: the store's +10 us per forwarded message was ``_split``)."""

from __future__ import annotations

import random

from treefed.core import idwindow
from treefed.core.idwindow import IdWindow, _split
from treefed.wire.ids import SCOPE_SEP, qualify


def _reference(msg_id: str) -> tuple[str, int] | None:
    """The parse as it was before the shortcut (two rpartitions per id)."""
    body, scoped, scope = msg_id.rpartition(SCOPE_SEP)
    if not scoped:
        body = msg_id
    p, sep, s = body.rpartition(":")
    if not sep or not s.isascii() or not s.isdigit() or len(s) > 18 \
            or (s[0] == "0" and len(s) > 1) or "\0" in p:
        return None
    return (f"{p}\0{SCOPE_SEP}{scope}" if scoped else f"{p}\0"), int(s)


def _ids(rng: random.Random, n: int) -> list[str]:
    producers = ["p-1", "p-1:2", "p", "", "a\x1fb", "a\0b", "x:", "p-10", "p-"]
    scopes = ["", "S1", "S2", "S1\x1f", "", ":3"]
    out: list[str] = []
    for _ in range(n):
        r = rng.random()
        p, sc = rng.choice(producers), rng.choice(scopes)
        if r < 0.6:      # runs of one producer, the shortcut's case
            seq = str(rng.randrange(0, 10 ** rng.randrange(1, 20)))
        else:            # near misses: leading zeros, signs, unicode digits, empty, colons
            seq = rng.choice(["007", "0", "", "-3", "1²", "١٢", "12:3", "1\x1f2", "9" * 19,
                              "9" * 18, "1 ", str(rng.randrange(100))])
        msg_id = f"{p}:{seq}" if rng.random() < 0.9 else f"{p}{seq}"
        if sc:
            msg_id = qualify(msg_id, sc) if rng.random() < 0.8 else msg_id + sc
        out.append(msg_id)
        if rng.random() < 0.5:
            out.append(out[-1])   # the same id again, and the next one of the run
            out.append(msg_id.replace(f":{seq}", f":{seq}1", 1))
    return out


def test_split_equals_the_plain_parse():
    rng = random.Random(1414)
    ids = _ids(rng, 20_000)
    for msg_id in ids:
        assert _split(msg_id) == _reference(msg_id), repr(msg_id)
    # the shortcut was taken (not a test of speed: that it is exercised at all)
    assert idwindow._last is not None


def test_split_after_each_kind_of_last_id():
    """Every (last id, next id) pair from a small adversarial set."""
    cases = ["p:1", "p:1\x1fS", "p:12\x1fS", "p:1\x1fT", "q:1\x1fS", "p:01\x1fS", "p:1\x1f",
             "p\x1fS:1", "p:1:2", "p:", ":1", ":1\x1fS", "p:1\x1fS\x1fS", "p\x1f:1", "p:\x1fS",
             "p:1\x1fS:2", "\x1f", "", "p:1x", "p:x1\x1fS", "p:123456789012345678",
             "p:1234567890123456789", "a\0b:1", "a\0b:1\x1fS"]
    for last in cases:
        for msg_id in cases:
            idwindow._last = None
            _split(last)
            assert _split(msg_id) == _reference(msg_id), (last, msg_id)


def test_interleaved_producers_keep_exact_membership():
    w = IdWindow(1000)
    ids = [qualify(f"prod-{i % 3}:{i}", f"scope{i % 2}") for i in range(600)]
    for k in ids:
        w.add(k)
    assert all(k in w for k in ids)
    assert qualify("prod-0:1", "scope0") not in w     # 1 is prod-1's, scope1
    assert not w._other, w._other
