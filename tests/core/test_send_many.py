"""``Broker.send_many``: a run of a producer's Send frames in one core call (issue #14:
three calls and a list per message at HQ), doing exactly what ``send`` of each frame in
turn does: deliveries, forwards, receipts, refusals in their places, a blocked send
parking the rest behind it."""

from __future__ import annotations

from treefed.core.actions import Out, Pause, StoreMessage
from treefed.core.broker import Broker
from treefed.core.policy import DestinationPolicy, PolicySet
from treefed.wire.frames import Send


def _broker() -> Broker:
    b = Broker("B", PolicySet([("queue://LIM", DestinationPolicy(max_messages=2))]),
               log_messages=False)
    b.add_consumer("L:C", "d1", "queue://Q", 0.0, peer="C")   # network demand
    b.add_consumer("c", "s1", "queue://P", 0.0)              # a local consumer
    return b


def _run() -> list:
    return [
        Send("queue://Q", "p:1", persistent=True, receipt=True),
        Send("queue://P", "p:2", {"k": 1}, b"x"),
        Send("queue://Q", "p:1", persistent=True, receipt=True),   # a re-send: receipt again
        Send("queue://Q", "p:3", priority=12),                     # refused: Error(ref)
        Send("nope://Q", "p:4"),                                   # refused: Error(ref)
        Send("queue://LIM", "p:5"),
        Send("queue://LIM", "p:6"),
        Send("queue://LIM", "p:7", receipt=True),                  # blocked: parked, Pause
        Send("queue://Q", "p:8"),                                  # parked behind it
    ]


def _shape(actions: list) -> list:
    return [("out", a.conn, a.frame) if type(a) is Out
            else ("store", a.msg.id) if type(a) is StoreMessage else a for a in actions]


def test_a_run_does_what_each_send_in_turn_does():
    one_by_one, batch = _broker(), _broker()
    expected: list = []
    for f in _run():
        expected += one_by_one.handle_frame("p", f, 1.0)
    got: list = []
    batch.send_many("p", _run(), 1.0, got)
    assert _shape(got) == _shape(expected)
    assert [a for a in got if type(a) is Pause] == [Pause("p", "queue://LIM")]
    assert [f.id for f in batch._conns["p"].parked] == ["p:7", "p:8"]
    assert batch.statistics() == one_by_one.statistics()
    # the parked sends go on, in order, once the queue has room
    later: list = []
    first: list = []
    for b, out in ((batch, later), (one_by_one, first)):
        out += b.add_consumer("c2", "s2", "queue://LIM", 2.0)
    assert _shape(later) == _shape(first)
