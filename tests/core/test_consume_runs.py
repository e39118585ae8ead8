"""Issue #14: at the chain's store, the local consumer's cumulative Ack settles a run of
forwarded messages, and each acked id joins the consumed-id window (so a re-forwarded copy
is known).  The run's ids now join in ONE call (``IdWindow.add_many`` via
``Duplicates.consume_many``) instead of ``consume`` -> ``add`` -> ``_set_bit`` per id --
with exactly the window ``add`` of each id in turn gives."""

from __future__ import annotations

import random

from tests.wire.test_decode_flat import _bytecodes
from treefed.core.broker import Broker
from treefed.core.idwindow import IdWindow
from treefed.core.policy import PolicySet
from treefed.wire.frames import Ack, Deliver, Forward


def _store(n: int) -> tuple[Broker, list]:
    """A store with a local consumer that was delivered ``n`` forwarded messages."""
    b = Broker("S", PolicySet([]), log_messages=False)
    b.connect("L:R", 0.0)
    b.allow_revisits("L:R")
    b.connect("c", 0.0)
    b.add_consumer("c", "s1", "queue://Q", 0.0, prefetch=10_000)
    out: list = []
    b.accept_forwards("L:R", [Forward("queue://Q", f"prod-abc:{i}\x1fscope", ["H", "R"],
                                      {"ph": "np"}, b"x" * 100) for i in range(n)], 1.0, out)
    delivered = [a.frame.msg for a in out if type(getattr(a, "frame", None)) is Deliver]
    assert len(delivered) == n
    return b, delivered


def test_a_cumulative_ack_of_a_run_costs_fewer_bytecodes_per_message():
    b, ids = _store(300)
    b.handle_frame("c", Ack("s1", ids[99], True), 2.0)     # warm: the producer's slot
    per_msg = _bytecodes(b.handle_frame, "c", Ack("s1", ids[299], True), 2.0) / 200
    # before: ~372 per message (consume + add + _split + _set_bit per id); now ~262
    assert per_msg <= 300, per_msg
    for i in ids:   # every acked id is known: a re-forwarded copy is a duplicate
        assert b._dups.known(i)


def test_the_acked_copy_coming_again_is_dropped():
    b, ids = _store(3)
    b.handle_frame("c", Ack("s1", ids[2], True), 2.0)
    out = b.handle_frame("L:R", Forward("queue://Q", ids[1], ["H", "R"], {}, b"x"), 3.0)
    assert not [a for a in out if type(getattr(a, "frame", None)) is Deliver]


def _ids(rng: random.Random, n: int) -> list[str]:
    forms = ["p:{}", "p:{}\x1fs", "q:{}", "p:0{}", "p:{}0000000000000000000", "stomp-{}",
             "p:+{}"]
    out = []
    seq = 0
    for _ in range(n):
        r = rng.random()
        if r < 0.6:
            seq += 1
            out.append(f"p:{seq}\x1fs")               # a producer's next id
        elif r < 0.7:
            out.append(f"p:{seq + rng.randrange(1, 10_000)}\x1fs")   # far ahead: sparse
        elif r < 0.8 and out:
            out.append(rng.choice(out))                # again (present, or evicted)
        else:
            out.append(rng.choice(forms).format(rng.randrange(0, 300)))
    return out


def test_add_many_is_add_of_each_in_turn():
    rng = random.Random(1414)
    for window in (0, 1, 3, 17, 200, 100_000):
        one, many = IdWindow(window), IdWindow(window)
        for _ in range(40):
            run = _ids(rng, rng.randrange(0, 60))
            for i in run:
                one.add(i)
            many.add_many(run)
            if rng.random() < 0.3 and run:
                gone = rng.choice(run)
                one.discard(gone)
                many.discard(gone)
            assert list(many) == list(one), window
            assert len(many) == len(one)
            for probe in _ids(rng, 20) + run:
                assert (probe in many) == (probe in one), (window, probe)
