"""Issue #14: an Ack or a ForwardAck settles a run of messages (a read's worth under
load) -- at every hop of HQ -> region -> store.  ``Broker._settle_many`` books each
stretch of one destination's messages once, with exactly the books and actions that
settling each message on its own gives."""

from __future__ import annotations

import random

from tests.wire.test_decode_flat import _bytecodes
from treefed.core.actions import DeleteMessage, Out
from treefed.core.broker import Broker
from treefed.core.paging import Paged
from treefed.core.policy import DestinationPolicy, PolicySet
from treefed.wire.frames import Ack, Forward, ForwardAck, Send


def _hop(n: int) -> tuple[Broker, list]:
    """A relaying broker that forwarded ``n`` messages down its link, unacked."""
    b = Broker("R", PolicySet([]), log_messages=False)
    b.connect("L:H", 0.0)
    b.allow_revisits("L:H")
    b.connect("L:S", 0.0)
    b.add_consumer("L:S", "fwd", "queue://Q", 0.0, prefetch=10_000, peer="S")
    out: list = []
    b.accept_forwards("L:H", [Forward("queue://Q", f"prod-abc:{i}\x1fscope", ["H"],
                                      {"ph": "np"}, b"x" * 100) for i in range(n)], 1.0, out)
    sent = [a.frame.id for a in out if type(a) is Out and type(a.frame) is Forward]
    assert len(sent) == n
    return b, sent


def test_a_forward_ack_of_a_run_costs_fewer_bytecodes_per_message():
    b, ids = _hop(300)
    b.handle_frame("L:S", ForwardAck(ids[:100]), 2.0)   # warm
    per_msg = _bytecodes(b.handle_frame, "L:S", ForwardAck(ids[100:]), 2.0) / 200
    # before: ~139 per message (_settle + Duplicates.release + msg_size each); now ~94
    assert per_msg <= 120, per_msg
    assert not b._dups.held and b._mem == 0


def _settle_state(b: Broker) -> tuple:
    return (sorted((d.name, d.inflight, d.dequeued, d.bytes, d.roomy)
                   for d in b._dests.values()),
            b._mem, b._paged, dict(b._dups.held), [d.name for d in b._blocked.room])


def test_a_run_settles_as_each_message_on_its_own():
    rng = random.Random(1414)
    for _ in range(30):
        seed = rng.random()
        pair = []
        for _copy in range(2):
            b = Broker("B", PolicySet([("queue://LIM", DestinationPolicy(max_messages=3))]),
                       log_messages=False)
            b.connect("c", 0.0)
            pair.append(b)
        msgs_of = []
        for b in pair:
            r = random.Random(seed)   # both copies: the same messages, same order
            for dst in ("queue://A", "queue://B", "queue://LIM", "topic://T"):
                b.add_consumer("c", dst, dst, 0.0, prefetch=10_000)
            b.connect("p", 0.0)
            for i in range(r.randrange(1, 40)):
                dst = r.choice(("queue://A", "queue://B", "queue://LIM", "topic://T"))
                b.handle_frame("p", Send(dst, f"p:{i}", {"k": "v" * r.randrange(3)},
                                         b"y" * r.randrange(300), r.random() < 0.5), 1.0)
            msgs = _inflight(b)
            for m in msgs:   # some bodies paged out, some held twice
                if r.random() < 0.2 and not m.dst.startswith("topic"):
                    b._paged += len(m.body)
                    m.body = Paged(len(m.body), (m.id, m.dst))
                if r.random() < 0.2:
                    b._dups.hold(m.id)
            for d in b._dests.values():
                d.blocked = d.blocked or (r.random() < 0.5 and d.name == "queue://LIM")
            r.shuffle(msgs)
            msgs_of.append(msgs)
        one, many = pair
        out_one: list = []
        for m in msgs_of[0]:
            one._settle_many([m], out_one, True)
        out_many: list = []
        many._settle_many(msgs_of[1], out_many, True)
        assert out_many == out_one
        assert _settle_state(many) == _settle_state(one)
        assert all(type(a) is DeleteMessage for a in out_many)


def _inflight(b: Broker) -> list:
    seen = []
    for d in b._dests.values():
        for c in d.consumers:
            seen += list(c.inflight.values())
    return seen


def test_an_ack_of_a_run_still_frees_every_book():
    b = Broker("S", PolicySet([]), log_messages=False)
    b.connect("L:R", 0.0)
    b.allow_revisits("L:R")
    b.connect("c", 0.0)
    b.add_consumer("c", "s1", "queue://Q", 0.0, prefetch=10_000)
    out: list = []
    b.accept_forwards("L:R", [Forward("queue://Q", f"p:{i}", ["H", "R"], {}, b"x" * 10,
                                      persistent=True) for i in range(50)], 1.0, out)
    acted = b.handle_frame("c", Ack("s1", "p:49", True), 2.0)
    deletes = [a for a in acted if type(a) is DeleteMessage]
    assert [a.msg_id for a in deletes] == [f"p:{i}" for i in range(50)]
    assert all(a.consumed for a in deletes)
    assert b._mem == 0 and not b._dups.held and b._dests["queue://Q"].inflight == 0
