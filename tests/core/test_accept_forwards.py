"""``Broker.accept_forwards``: a run of Forward frames from one link in one core call,
answered with ONE ForwardAck (issue #14: at every hop of HQ -> region -> store an ack
action per forwarded message was an allocation, an ``Out`` and a pass of the shell's
action loop).  Everything else is what ``accept_forward`` of each frame in turn does."""

from __future__ import annotations

from treefed.core.actions import Out, Pause, StoreMessage
from treefed.core.broker import Broker
from treefed.core.policy import DestinationPolicy, PolicySet
from treefed.wire.frames import Error, Forward, ForwardAck


def _broker() -> Broker:
    b = Broker("B", PolicySet([("queue://LIM", DestinationPolicy(max_messages=2))]),
               log_messages=False)
    b.add_consumer("L:C", "d1", "queue://Q", 0.0, peer="C")   # network demand
    b.add_consumer("c", "s1", "queue://P", 0.0)              # a local consumer
    return b


def _run() -> list:
    return [
        Forward("queue://Q", "a:1", ["A"], persistent=True),
        Forward("queue://P", "a:2", ["A"], body=b"x"),
        Forward("queue://Q", "a:1", ["A"]),                    # duplicate: acked, dropped
        Forward("queue://Q", "a:3", ["A", "B"]),               # loop: acked, dropped
        Forward("nope://Q", "a:4", ["A"]),                     # refused: Error, then ack
        Forward("queue://Q", "a:5", ["A"], persistent=True),
        Forward("queue://LIM", "a:6", ["A"]),
        Forward("queue://LIM", "a:7", ["A"]),
        Forward("queue://LIM", "a:8", ["A"]),                  # blocked: parked, Pause
        Forward("queue://Q", "a:9", ["A"]),                    # parked behind it
    ]


def _shape(actions: list) -> tuple[list, list]:
    """The actions other than ForwardAcks, in order; the acked ids, in order."""
    out, acked = [], []
    for a in actions:
        if type(a) is Out and type(a.frame) is ForwardAck:
            acked += [(a.conn, i) for i in a.frame.ids]
        elif type(a) is Out:
            out.append(("out", a.conn, a.frame))
        elif type(a) is StoreMessage:
            out.append(("store", a.msg.id))
        else:
            out.append(a)
    return out, acked


def test_a_run_does_what_each_forward_in_turn_does_with_one_ack_per_stretch():
    one_by_one, batch = _broker(), _broker()
    expected: list = []
    for f in _run():
        expected += one_by_one.handle_frame("L:A", f, 1.0)
    got: list = []
    batch.accept_forwards("L:A", _run(), 1.0, got)
    assert _shape(got) == _shape(expected)
    # one ForwardAck frame per stretch between errors, not one per forward
    acks = [a.frame.ids for a in got if type(a) is Out and type(a.frame) is ForwardAck]
    assert acks == [["a:1", "a:2", "a:1", "a:3"], ["a:4", "a:5", "a:6", "a:7"]]
    assert [a for a in got if type(a) is Pause] == [Pause("L:A", "queue://LIM")]
    assert [f.id for f in batch._conns["L:A"].parked] == ["a:8", "a:9"]
    assert batch.statistics() == one_by_one.statistics()


def test_the_ack_follows_the_runs_stores_and_an_error_keeps_its_place():
    b = _broker()
    got: list = []
    b.accept_forwards("L:A", [Forward("queue://Q", f"s:{i}", ["A"], persistent=True)
                              for i in range(5)], 1.0, got)
    kinds = [type(a).__name__ if type(a) is not Out else type(a.frame).__name__
             for a in got]
    assert kinds.count("ForwardAck") == 1 and kinds[-1] == "ForwardAck"
    assert kinds.count("StoreMessage") == 5
    err: list = []
    b.accept_forwards("L:A", [Forward("queue://Q", "e:1", ["A"]),
                              Forward("nope://", "e:2", ["A"]),
                              Forward("queue://Q", "e:3", ["A"])], 1.0, err)
    frames = [a.frame for a in err if type(a) is Out and a.conn == "L:A"]
    assert [(type(f).__name__, getattr(f, "ids", getattr(f, "ref", None)))
            for f in frames] == [("ForwardAck", ["e:1"]), ("Error", "e:2"),
                                 ("ForwardAck", ["e:2", "e:3"])]
    assert type(frames[1]) is Error
