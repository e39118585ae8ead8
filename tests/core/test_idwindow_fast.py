"""Issue #14: the consumed-id window at a store costs each message less Python -- a
producer's next id sets its bit at once, and a sequence number is checked by one regex
call -- with membership exactly that of a plain set."""

from __future__ import annotations

import random

from tests.wire.test_decode_flat import _bytecodes
from treefed.core.idwindow import IdWindow, _split, _split_full


def test_a_producers_next_id_costs_fewer_bytecodes():
    w = IdWindow(100_000)
    for i in range(100):
        w.add(f"prod-abc:{i}\x1fscope")
    # before: 262 to add, 138 to look up
    assert _bytecodes(w.add, "prod-abc:101\x1fscope") <= 230
    assert _bytecodes(w.__contains__, "prod-abc:50\x1fscope") <= 128


def test_membership_is_a_sets():
    """Ids of every form (bitmap and string), added and discarded, no eviction."""
    rng = random.Random(14)
    forms = ["p:{}", "p:{}\x1fs", "q:{}", "p:0{}", "p:{}0000000000000000000", "p:\u0661{}",
             "p:+{}", "p:{} ", "stomp-{}"]
    w, ref = IdWindow(100_000), set()
    for _ in range(5000):
        msg_id = rng.choice(forms).format(rng.randrange(0, 3000))
        if rng.random() < 0.2:
            w.discard(msg_id)
            ref.discard(msg_id)
        else:
            w.add(msg_id)
            ref.add(msg_id)
        probe = rng.choice(forms).format(rng.randrange(0, 3000))
        assert (probe in w) == (probe in ref), probe
        assert _split(probe) == _split_full(probe)
    assert len(w) == len(ref)
