"""Tests for cumulative acknowledgement in treefed.core.broker: ``Ack(upto=True)``.

``Ack(sub, msg, upto=True)`` settles every message still in flight on ``sub`` that was
delivered before ``msg``, and ``msg`` itself, in delivery order -- one frame for a batch.
"""

from treefed.core.actions import DeleteMessage, Out
from treefed.core.broker import Broker
from treefed.wire.frames import Ack, Deliver, Error, Nack, Send, Subscribe


def delivered(actions, conn="c"):
    return [a.frame.msg for a in actions
            if type(a) is Out and a.conn == conn and type(a.frame) is Deliver]


def errors(actions, conn="c"):
    return [a.frame for a in actions if type(a) is Out and type(a.frame) is Error]


def broker_with(n, *, prefetch=1000, persistent=False, dst="queue://Q"):
    """A broker with consumer c/s on ``dst`` that was delivered m0..m{n-1}."""
    b = Broker("B1", log_messages=False)
    b.handle_frame("c", Subscribe("s", dst, prefetch=prefetch), 0.0)
    out = []
    for i in range(n):
        out += b.handle_frame("p", Send(dst, f"m{i}", persistent=persistent), 0.0)
    return b, out


def inflight(b):
    return b.consumer("c", "s").inflight


class TestCumulativeAck:
    def test_settles_everything_delivered_up_to_the_named_message(self):
        """upto acks m0..m2 in one frame and leaves m3, m4 in flight."""
        b, _ = broker_with(5)
        out = b.handle_frame("c", Ack("s", "m2", upto=True), 1.0)
        assert errors(out) == [] and inflight(b) == 2
        stats = b.statistics()["destinations"]["queue://Q"]
        assert (stats["dequeued"], stats["inflight"]) == (3, 2)
        # the rest can still be acked, one by one or together
        b.handle_frame("c", Ack("s", "m4", upto=True), 1.0)
        assert inflight(b) == 0

    def test_skips_messages_settled_singly(self):
        """Messages acked or nacked on their own before the range are not touched twice."""
        b, _ = broker_with(5, prefetch=5)
        b.handle_frame("c", Ack("s", "m1"), 1.0)
        out = b.handle_frame("c", Nack("s", "m3"), 1.0)
        assert delivered(out) == ["m3"]                     # redelivered, now newest
        out = b.handle_frame("c", Ack("s", "m4", upto=True), 1.0)
        assert errors(out) == []
        # m0, m2, m4 settled; the redelivered m3 came after m4, so it is still in flight
        assert inflight(b) == 1
        assert b.handle_frame("c", Ack("s", "m3"), 1.0) == []

    def test_unknown_message_changes_nothing(self):
        """An upto naming a message not in flight is refused and settles nothing."""
        b, _ = broker_with(3)
        out = b.handle_frame("c", Ack("s", "nope", upto=True), 1.0)
        assert [(e.code, e.ref) for e in errors(out)] == [("no_such_message", "nope")]
        assert inflight(b) == 3

    def test_returned_credit_dispatches_pending_messages_in_order(self):
        """With prefetch 2, acking both in one frame delivers the next two pending."""
        b, out = broker_with(6, prefetch=2)
        assert delivered(out) == ["m0", "m1"]
        out = b.handle_frame("c", Ack("s", "m1", upto=True), 1.0)
        assert delivered(out) == ["m2", "m3"]
        out = b.handle_frame("c", Ack("s", "m3", upto=True), 1.0)
        assert delivered(out) == ["m4", "m5"]

    def test_persistent_messages_are_deleted_each(self):
        """Every persistent message the range covers gets its DeleteMessage."""
        b, _ = broker_with(3, persistent=True)
        out = b.handle_frame("c", Ack("s", "m2", upto=True), 1.0)
        deletes = [a for a in out if type(a) is DeleteMessage]
        assert deletes == [DeleteMessage(f"m{i}", "queue://Q", consumed=True) for i in range(3)]

    def test_acked_ids_are_remembered_as_consumed(self):
        """A producer re-sending a message the range acked is answered as a duplicate."""
        b, _ = broker_with(2, persistent=True)
        b.handle_frame("c", Ack("s", "m1", upto=True), 1.0)
        out = b.handle_frame("p", Send("queue://Q", "m0", persistent=True, receipt=True), 2.0)
        assert delivered(out) == [] and b.statistics()["dropped"] == {"duplicate": 1}

    def test_topic_subscription(self):
        """A topic subscriber settles its copies with one cumulative ack too."""
        b, out = broker_with(4, dst="topic://T")
        assert delivered(out) == ["m0", "m1", "m2", "m3"]
        b.handle_frame("c", Ack("s", "m3", upto=True), 1.0)
        assert inflight(b) == 0
        assert b.statistics()["destinations"]["topic://T"]["dequeued"] == 4

    def test_plain_ack_still_settles_one(self):
        """Without upto an Ack settles exactly the message it names, in any order."""
        b, _ = broker_with(3)
        b.handle_frame("c", Ack("s", "m2"), 1.0)
        assert inflight(b) == 2
        b.handle_frame("c", Ack("s", "m0"), 1.0)
        assert inflight(b) == 1
