"""Tests for treefed.core.broker.Broker: local producers and consumers.

Plain function calls with explicit ``now``; a few helpers collect the Outs per conn.
Network demand and forwarding are in test_broker_network.py.
"""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from treefed.core.actions import DeleteMessage, Log, Out, Pause, Resume, StoreMessage
from treefed.core.broker import Broker
from treefed.core.message import Message
from treefed.core.policy import DestinationPolicy, PolicySet
from treefed.errors import TreefedError
from treefed.wire.frames import (Ack, Deliver, Forward, ForwardAck, Nack, Ping, Pong, Receipt,
                                 Send, Subscribe, Unsubscribe)


# ---------------------------------------------------------------- helpers

def to(actions, conn):
    """Frames written to ``conn``, in order."""
    return [a.frame for a in actions if isinstance(a, Out) and a.conn == conn]


def got(actions, conn):
    """(sub, msg id) of every Deliver written to ``conn``."""
    return [(f.sub, f.msg) for f in to(actions, conn) if isinstance(f, Deliver)]


def logs(actions, event):
    return [a.fields for a in actions if isinstance(a, Log) and a.event == event]


def sub(b, conn, sub_id, dst, now=0.0, **kw):
    out = b.handle_frame(conn, Subscribe(sub_id, dst, **kw), now)
    assert to(out, conn)[0] == Receipt(sub_id), out
    return out


def send(b, conn, dst, msg_id, now=0.0, **kw):
    return b.handle_frame(conn, Send(dst, msg_id, **kw), now)


def ack(b, conn, sub_id, msg_id, now=0.0):
    return b.handle_frame(conn, Ack(sub_id, msg_id), now)


def policies(pattern, **kw):
    return PolicySet([(pattern, DestinationPolicy(**kw))])


class FakeSelector:
    """Stands in for a compiled selector: matches when headers[key] == value."""

    def __init__(self, key, value):
        self.key, self.value, self.text = key, value, f"{key} = {value!r}"

    def matches(self, headers, *, message=None):
        return headers.get(self.key) == self.value


# ---------------------------------------------------------------- tests

class TestSubscribe:
    def test_receipt_and_consumer_added_event(self):
        """A Subscribe is answered with Receipt(id) and logged as consumer.added."""
        b = Broker("B1")
        out = sub(b, "c1", "s1", "ORDERS")
        assert logs(out, "consumer.added") == [{"consumer": "B1/c1/s1", "dst": "queue://ORDERS"}]
        assert b.has_consumer("c1", "s1")
        assert b.consumer("c1", "s1").dst == "queue://ORDERS"

    def test_bad_destination_is_refused_with_ref(self):
        """An invalid destination gets Error(bad_destination, ref=sub id) and no consumer."""
        b = Broker("B1")
        out = b.handle_frame("c1", Subscribe("s1", "A..B"), 0.0)
        [err] = to(out, "c1")
        assert (err.code, err.ref) == ("bad_destination", "s1")
        assert "empty segment" in err.message
        assert not b.has_consumer("c1", "s1")

    def test_bad_selector_is_refused_with_position(self):
        """A malformed selector gets Error(bad_selector) naming where parsing failed."""
        pytest.importorskip("treefed.core.selector")
        b = Broker("B1")
        out = b.handle_frame("c1", Subscribe("s1", "Q", selector="color = = 'red'"), 0.0)
        [err] = to(out, "c1")
        assert (err.code, err.ref) == ("bad_selector", "s1")
        assert "position" in err.message
        assert not b.has_consumer("c1", "s1")

    def test_duplicate_subscription_id_is_refused(self):
        """A second Subscribe with the same id on one conn is refused; the first stays."""
        b = Broker("B1")
        sub(b, "c1", "s1", "A")
        out = b.handle_frame("c1", Subscribe("s1", "B"), 0.0)
        assert [(f.code, f.ref) for f in to(out, "c1")] == [("duplicate_subscription", "s1")]
        assert b.consumer("c1", "s1").dst == "queue://A"
        sub(b, "c2", "s1", "B")   # the same id on another conn is a different consumer

    def test_zero_prefetch_is_refused(self):
        """prefetch must be at least 1."""
        b = Broker("B1")
        [err] = to(b.handle_frame("c1", Subscribe("s1", "A", prefetch=0), 0.0), "c1")
        assert err.code == "bad_frame"

    def test_unsubscribe(self):
        """Unsubscribe closes the consumer with a Receipt; an unknown id is an Error."""
        b = Broker("B1")
        sub(b, "c1", "s1", "A")
        out = b.handle_frame("c1", Unsubscribe("s1"), 1.0)
        assert to(out, "c1") == [Receipt("s1")]
        assert logs(out, "consumer.removed") == [{"consumer": "B1/c1/s1", "dst": "queue://A"}]
        [err] = to(b.handle_frame("c1", Unsubscribe("s1"), 1.0), "c1")
        assert (err.code, err.ref) == ("no_such_subscription", "s1")

    def test_unexpected_frame_type_is_an_error(self):
        """A frame the broker does not take from peers (Deliver) gets Error(bad_frame)."""
        b = Broker("B1")
        [err] = to(b.handle_frame("c1", Deliver("s", "m", "queue://A"), 0.0), "c1")
        assert err.code == "bad_frame" and "Deliver" in err.message

    def test_ping_is_answered(self):
        """Ping gets a Pong with the same token."""
        assert to(Broker("B1").handle_frame("c1", Ping(7), 0.0), "c1") == [Pong(7)]


class TestQueueDispatch:
    def test_round_robin_order_within_a_level(self):
        """Equal-priority consumers with credit take turns in subscription order."""
        b = Broker("B1", log_messages=False)
        for c in ("a", "b", "c"):
            sub(b, c, "s", "Q")
        order = []
        for i in range(7):
            out = send(b, "p", "Q", f"m{i}")
            order += [c for c in ("a", "b", "c") if got(out, c)]
        assert order == ["a", "b", "c", "a", "b", "c", "a"]

    def test_round_robin_skips_consumers_without_credit(self):
        """A consumer whose prefetch is full is skipped, and rejoins after an ack."""
        b = Broker("B1", log_messages=False)
        sub(b, "a", "s", "Q", prefetch=1)
        sub(b, "b", "s", "Q", prefetch=5)
        out = [send(b, "p", "Q", f"m{i}") for i in range(4)]
        assert [got(o, "a") + got(o, "b") for o in out] == [
            [("s", "m0")], [("s", "m1")], [("s", "m2")], [("s", "m3")]]
        assert [bool(got(o, "a")) for o in out] == [True, False, False, False]
        ack(b, "a", "s", "m0")
        assert got(send(b, "p", "Q", "m4"), "a") == [("s", "m4")]

    def test_highest_priority_level_with_credit_wins(self):
        """Priority 9 takes messages until its prefetch is full, then level 0 round-robins."""
        b = Broker("B1", log_messages=False)
        sub(b, "hi", "s", "Q", priority=9, prefetch=2)
        sub(b, "lo1", "s", "Q", priority=0)
        sub(b, "lo2", "s", "Q", priority=0)
        who = []
        for i in range(6):
            out = send(b, "p", "Q", f"m{i}")
            who += [c for c in ("hi", "lo1", "lo2") if got(out, c)]
        assert who == ["hi", "hi", "lo1", "lo2", "lo1", "lo2"]
        ack(b, "hi", "s", "m0")
        assert got(send(b, "p", "Q", "m6"), "hi") == [("s", "m6")]

    def test_pending_messages_wait_for_credit_in_order(self):
        """Without credit messages stay pending and go out in order as acks arrive."""
        b = Broker("B1", log_messages=False)
        sub(b, "c", "s", "Q", prefetch=1)
        for i in range(3):
            send(b, "p", "Q", f"m{i}")
        assert b.statistics()["destinations"]["queue://Q"]["depth"] == 2
        assert got(ack(b, "c", "s", "m0"), "c") == [("s", "m1")]
        assert got(ack(b, "c", "s", "m1"), "c") == [("s", "m2")]
        assert got(ack(b, "c", "s", "m2"), "c") == []

    def test_late_consumer_gets_the_backlog_up_to_prefetch(self):
        """Messages sent before any consumer are delivered in order when one subscribes."""
        b = Broker("B1", log_messages=False)
        for i in range(5):
            send(b, "p", "Q", f"m{i}")
        out = sub(b, "c", "s", "Q", prefetch=3)
        assert got(out, "c") == [("s", "m0"), ("s", "m1"), ("s", "m2")]
        assert to(out, "c")[0] == Receipt("s")   # the receipt precedes the deliveries

    def test_deliver_carries_the_message(self):
        """Deliver holds headers, body, reply_to, timestamp and the absolute expiry."""
        b = Broker("B1")
        sub(b, "c", "s", "Q")
        out = send(b, "p", "Q", "m1", now=100.0, headers={"k": "v"}, body=b"hi", ttl=2500,
                   priority=7, reply_to="temp-queue://p.1")
        [d] = to(out, "c")
        assert (d.dst, d.headers, d.body, d.priority, d.reply_to, d.timestamp, d.expires) == (
            "queue://Q", {"k": "v"}, b"hi", 7, "temp-queue://p.1", 100.0, 102.5)
        assert logs(out, "message.produced") == [{"msg": "m1", "dst": "queue://Q"}]
        assert logs(out, "message.delivered") == [
            {"msg": "m1", "dst": "queue://Q", "consumer": "B1/c/s"}]

    def test_selectors_are_evaluated_per_consumer(self):
        """A consumer only gets messages its selector matches; others take the rest."""
        b = Broker("B1", log_messages=False)
        b.add_consumer("red", "s", "Q", 0.0, selector=FakeSelector("color", "red"))
        b.add_consumer("any", "s", "Q", 0.0)
        out = send(b, "p", "Q", "m1", headers={"color": "blue"})
        assert got(out, "any") == [("s", "m1")] and got(out, "red") == []
        out = send(b, "p", "Q", "m2", headers={"color": "red"})
        assert got(out, "red") == [("s", "m2")]

    def test_unmatched_message_waits_without_blocking_others(self):
        """A pending message no consumer selects does not hold back later ones."""
        b = Broker("B1", log_messages=False)
        b.add_consumer("red", "s", "Q", 0.0, selector=FakeSelector("color", "red"))
        assert got(send(b, "p", "Q", "m1", headers={"color": "blue"}), "red") == []
        assert got(send(b, "p", "Q", "m2", headers={"color": "red"}), "red") == [("s", "m2")]
        out = b.add_consumer("any", "s", "Q", 0.0)
        assert got(out, "any") == [("s", "m1")]

    def test_real_selector_text(self):
        """Selector text in a Subscribe is compiled and applied (SQL-92 expression)."""
        pytest.importorskip("treefed.core.selector")
        b = Broker("B1", log_messages=False)
        sub(b, "c", "s", "Q", selector="qty > 10 AND region IN ('EU', 'UK')")
        assert got(send(b, "p", "Q", "m1", headers={"qty": 5, "region": "EU"}), "c") == []
        assert got(send(b, "p", "Q", "m2", headers={"qty": 50, "region": "UK"}), "c") == [
            ("s", "m2")]
        assert b.consumer("c", "s").selector == "qty > 10 AND region IN ('EU', 'UK')"

    def test_wildcard_subscription_spans_existing_and_new_queues(self):
        """queue://PRICE.> receives from matching queues created before and after it."""
        b = Broker("B1", log_messages=False)
        send(b, "p", "PRICE.A", "m1")
        out = sub(b, "c", "s", "PRICE.>")
        assert got(out, "c") == [("s", "m1")]
        assert got(send(b, "p", "PRICE.B.C", "m2"), "c") == [("s", "m2")]
        assert got(send(b, "p", "OTHER", "m3"), "c") == []

    def test_persistent_send_is_stored_before_its_receipt_and_deleted_on_ack(self):
        """StoreMessage precedes Receipt; the ack yields DeleteMessage."""
        b = Broker("B1")
        sub(b, "c", "s", "Q")
        out = send(b, "p", "Q", "m1", persistent=True, receipt=True)
        kinds = [type(a).__name__ for a in out if isinstance(a, (StoreMessage, Out))]
        assert kinds[:2] == ["StoreMessage", "Out"]
        assert to(out, "p") == [Receipt("m1")]
        assert [a for a in ack(b, "c", "s", "m1") if isinstance(a, DeleteMessage)] == [
            DeleteMessage("m1", "queue://Q", consumed=True)]

    def test_non_persistent_send_is_not_stored_and_receipt_only_when_asked(self):
        """Non-persistent: no store; a Receipt comes only if the Send asked for one."""
        b = Broker("B1")
        out = send(b, "p", "Q", "m1")
        assert not [a for a in out if isinstance(a, StoreMessage)] and to(out, "p") == []
        assert to(send(b, "p", "Q", "m2", receipt=True), "p") == [Receipt("m2")]
        out = send(b, "p", "Q", "m3", persistent=True)
        assert len([a for a in out if isinstance(a, StoreMessage)]) == 1 and to(out, "p") == []

    def test_disconnect_requeues_in_flight_at_the_head(self):
        """A closed consumer's unacked messages go first to others, redelivered + 1."""
        b = Broker("B1", log_messages=False)
        sub(b, "a", "s", "Q", prefetch=2)
        for i in range(3):
            send(b, "p", "Q", f"m{i}")
        out = b.disconnect("a", 1.0)
        assert logs(out, "consumer.removed")
        out = sub(b, "b", "s", "Q", prefetch=10)
        delivered = [f for f in to(out, "b") if isinstance(f, Deliver)]
        assert [(f.msg, f.redelivered) for f in delivered] == [("m0", 1), ("m1", 1), ("m2", 0)]

    def test_bad_send_is_refused_with_ref(self):
        """A Send to an invalid destination gets Error(bad_destination, ref=id)."""
        b = Broker("B1")
        [err] = to(send(b, "p", "queue://A B", "m1"), "p")
        assert (err.code, err.ref) == ("bad_destination", "m1")
        [err] = to(send(b, "p", "Q", "m2", priority=12), "p")
        assert (err.code, err.ref) == ("bad_frame", "m2")


class TestAckNack:
    def test_ack_of_unknown_message_or_subscription(self):
        """Acking what is not in flight is refused with the message id as ref."""
        b = Broker("B1")
        sub(b, "c", "s", "Q")
        [err] = to(ack(b, "c", "s", "nope"), "c")
        assert (err.code, err.ref) == ("no_such_message", "nope")
        [err] = to(ack(b, "c", "zz", "nope"), "c")
        assert err.code == "no_such_subscription"

    def test_nack_requeues_at_the_head_with_redelivered_plus_one(self):
        """A nacked message is redelivered before older pending messages."""
        b = Broker("B1", log_messages=False)
        sub(b, "c", "s", "Q", prefetch=1)
        send(b, "p", "Q", "m1")
        send(b, "p", "Q", "m2")
        out = b.handle_frame("c", Nack("s", "m1"), 1.0)
        [d] = [f for f in to(out, "c") if isinstance(f, Deliver)]
        assert (d.msg, d.redelivered) == ("m1", 1)

    def test_dead_letter_after_max_redeliveries(self):
        """With max_redeliveries=2 a message is delivered 3 times, then moved to the DLQ."""
        b = Broker("B1", max_redeliveries=2)
        sub(b, "c", "s", "Q")
        sub(b, "d", "dlq", "DLQ")
        send(b, "p", "Q", "m1", persistent=True, headers={"k": 1})
        deliveries = 1
        for _ in range(5):
            out = b.handle_frame("c", Nack("s", "m1"), 1.0)
            if got(out, "c"):
                deliveries += 1
            else:
                break
        assert deliveries == 3
        [dead] = [f for f in to(out, "d") if isinstance(f, Deliver)]
        assert dead.dst == "queue://DLQ" and dead.redelivered == 2
        assert dead.headers == {"k": 1, "dlq_reason": "max_redeliveries",
                                "original_dst": "queue://Q"}
        assert DeleteMessage("m1", "queue://Q") in out
        [stored] = [a.msg for a in out if isinstance(a, StoreMessage)]
        assert stored.dst == "queue://DLQ"
        stats = b.statistics()
        assert stats["dropped"] == {"max_redeliveries": 1} and stats["dead_lettered"] == 1
        assert stats["destinations"]["queue://Q"]["depth"] == 0

    def test_custom_dlq_name(self):
        """Dead letters go to the configured DLQ destination."""
        b = Broker("B1", max_redeliveries=0, dlq="queue://DEAD.LETTERS", log_messages=False)
        sub(b, "c", "s", "Q")
        send(b, "p", "Q", "m1")
        b.handle_frame("c", Nack("s", "m1"), 1.0)
        assert b.statistics()["destinations"]["queue://DEAD.LETTERS"]["depth"] == 1


class TestTopics:
    def test_fan_out_to_every_matching_subscription(self):
        """Each matching subscription, wildcard or not, gets a copy; others none."""
        b = Broker("B1", log_messages=False)
        sub(b, "a", "s", "topic://PRICE.STOCK.NYSE.IBM")
        sub(b, "b", "s", "topic://PRICE.>")
        sub(b, "c", "s", "topic://PRICE.STOCK.*.IBM")
        sub(b, "d", "s", "topic://PRICE.STOCK.NASDAQ.*")
        out = send(b, "p", "topic://PRICE.STOCK.NYSE.IBM", "m1")
        assert [c for c in "abcd" if got(out, c)] == ["a", "b", "c"]

    def test_topic_messages_are_never_stored(self):
        """A persistent topic message yields no StoreMessage and its ack no DeleteMessage."""
        b = Broker("B1")
        sub(b, "a", "s", "topic://T")
        out = send(b, "p", "topic://T", "m1", persistent=True, receipt=True)
        assert not [a for a in out if isinstance(a, StoreMessage)]
        assert to(out, "p") == [Receipt("m1")]
        assert not [a for a in ack(b, "a", "s", "m1") if isinstance(a, DeleteMessage)]

    def test_topic_without_subscribers_keeps_nothing(self):
        """A topic message nobody subscribes to is gone; a later subscriber gets nothing."""
        b = Broker("B1", log_messages=False)
        send(b, "p", "topic://T", "m1")
        assert got(sub(b, "a", "s", "topic://T"), "a") == []

    def test_slow_subscriber_gets_a_bounded_queue(self):
        """Without credit a subscriber's copies wait (prefetch x 10, oldest dropped)."""
        b = Broker("B1", log_messages=False)
        sub(b, "slow", "s", "topic://T", prefetch=1)
        sub(b, "fast", "s", "topic://T", prefetch=100)
        for i in range(13):
            out = send(b, "p", "topic://T", f"m{i}")
            assert got(out, "fast") == [("s", f"m{i}")]
        assert b.consumer("slow", "s").queued == 10
        assert b.statistics()["dropped"] == {"overflow": 2}
        # m0 in flight, m1 and m2 dropped as oldest, m3.. waiting
        assert got(ack(b, "slow", "s", "m0"), "slow") == [("s", "m3")]

    def test_topic_nack_redelivers_a_private_copy(self):
        """A nacked topic message comes back to that subscriber only, redelivered + 1."""
        b = Broker("B1", log_messages=False)
        sub(b, "a", "s", "topic://T")
        sub(b, "b", "s", "topic://T")
        send(b, "p", "topic://T", "m1")
        out = b.handle_frame("a", Nack("s", "m1"), 1.0)
        [d] = [f for f in to(out, "a") if isinstance(f, Deliver)]
        assert d.redelivered == 1 and to(out, "b") == []
        assert b.consumer("b", "s").inflight == 1
        assert got(ack(b, "b", "s", "m1"), "b") == []


class TestExpiry:
    def test_pending_message_expires_to_the_dlq_via_the_timer(self):
        """handle_timer at the expiry moves a pending message to the DLQ, logged."""
        b = Broker("B1")
        send(b, "p", "Q", "m1", now=10.0, ttl=1000, persistent=True)
        assert b.next_deadline() == 11.0
        assert b.handle_timer(10.5) == []
        out = b.handle_timer(11.0)
        assert logs(out, "message.dropped") == [
            {"msg": "m1", "dst": "queue://Q", "reason": "expired"}]
        assert DeleteMessage("m1", "queue://Q") in out
        [dead] = [a.msg for a in out if isinstance(a, StoreMessage)]
        assert dead.headers["dlq_reason"] == "expired" and dead.expires == 0.0
        stats = b.statistics()
        assert stats["destinations"]["queue://Q"]["depth"] == 0
        assert stats["destinations"]["queue://DLQ"]["depth"] == 1
        assert b.next_deadline() is None

    def test_discard_policy_drops_without_dlq(self):
        """on_expiry='discard' drops the message; nothing reaches the DLQ."""
        b = Broker("B1", policies("queue://Q", on_expiry="discard"))
        send(b, "p", "Q", "m1", now=0.0, ttl=500)
        out = b.handle_timer(0.5)
        assert logs(out, "message.dropped")[0]["reason"] == "expired"
        assert "queue://DLQ" not in b.statistics()["destinations"]

    def test_expired_message_is_never_delivered(self):
        """A message expired before a consumer arrives is dropped at dispatch instead."""
        b = Broker("B1", policies("queue://Q", on_expiry="discard"), log_messages=False)
        send(b, "p", "Q", "m1", now=0.0, ttl=100)
        send(b, "p", "Q", "m2", now=0.0)
        out = sub(b, "c", "s", "Q", now=5.0)
        assert got(out, "c") == [("s", "m2")]
        assert b.statistics()["dropped"] == {"expired": 1}

    def test_delivered_messages_leave_no_deadline(self):
        """A message dispatched at once needs no timer; one later dispatched goes stale."""
        b = Broker("B1", log_messages=False)
        sub(b, "c", "s", "Q", prefetch=1)
        send(b, "p", "Q", "m1", ttl=1000)
        assert b.next_deadline() is None
        send(b, "p", "Q", "m2", ttl=1000)
        assert b.next_deadline() == 1.0
        ack(b, "c", "s", "m1")            # m2 leaves pending for the consumer
        assert b.next_deadline() is None
        assert b.handle_timer(2.0) == []

    def test_timer_heap_stays_bounded(self):
        """Entries of messages that left pending do not pile up in the timer heap."""
        b = Broker("B1", log_messages=False)
        sub(b, "c", "s", "Q", prefetch=1)
        send(b, "p", "Q", "m0", ttl=3_600_000)
        for i in range(1, 20_000):
            send(b, "p", "Q", f"m{i}", ttl=3_600_000)   # waits in pending, then
            ack(b, "c", "s", f"m{i - 1}")                # leaves it for the consumer
        assert len(b._timers) <= 4096 + 2
        assert b.next_deadline() is None

    def test_only_expired_messages_are_swept(self):
        """The sweep keeps unexpired pending messages in their order."""
        b = Broker("B1", policies("queue://Q", on_expiry="discard"), log_messages=False)
        send(b, "p", "Q", "a", now=0.0, ttl=3000)
        send(b, "p", "Q", "b", now=0.0, ttl=1000)
        send(b, "p", "Q", "c", now=0.0)
        b.handle_timer(b.next_deadline())
        assert b.next_deadline() == 3.0
        out = sub(b, "x", "s", "Q", now=1.5)
        assert got(out, "x") == [("s", "a"), ("s", "c")]


class TestTemporaryDestinations:
    def test_request_reply_through_a_temp_queue(self):
        """A requester's temp queue named in reply_to receives the service's answer."""
        b = Broker("B1", log_messages=False)
        sub(b, "req", "replies", "temp-queue://req.1")
        sub(b, "svc", "s", "SERVICE")
        out = send(b, "req", "SERVICE", "q1", reply_to="temp-queue://req.1")
        [request] = [f for f in to(out, "svc") if isinstance(f, Deliver)]
        out = send(b, "svc", request.reply_to, "a1", headers={"re": request.msg})
        [reply] = [f for f in to(out, "req") if isinstance(f, Deliver)]
        assert (reply.sub, reply.headers) == ("replies", {"re": "q1"})

    def test_send_to_unowned_temp_queue_is_refused(self):
        """Nobody owns the temp queue: Error(no_such_destination, ref=id)."""
        b = Broker("B1")
        [err] = to(send(b, "p", "temp-queue://ghost", "m1"), "p")
        assert (err.code, err.ref) == ("no_such_destination", "m1")

    def test_owner_disconnect_deletes_it_and_its_pending_messages(self):
        """Closing the owner deletes the temp queue, discarding (and logging) pending."""
        b = Broker("B1")
        sub(b, "req", "r", "temp-queue://req.1", prefetch=1)
        send(b, "svc", "temp-queue://req.1", "a1")
        send(b, "svc", "temp-queue://req.1", "a2")
        out = b.disconnect("req", 1.0)
        dropped = logs(out, "message.dropped")
        assert {(d["msg"], d["reason"]) for d in dropped} == {("a1", "deleted"),
                                                              ("a2", "deleted")}
        assert "temp-queue://req.1" not in b.statistics()["destinations"]
        [err] = to(send(b, "svc", "temp-queue://req.1", "a3"), "svc")
        assert err.code == "no_such_destination"

    def test_temp_messages_are_not_stored(self):
        """A persistent send to a temp queue is not written to the store."""
        b = Broker("B1")
        sub(b, "req", "r", "temp-queue://req.1")
        out = send(b, "svc", "temp-queue://req.1", "a1", persistent=True)
        assert not [a for a in out if isinstance(a, StoreMessage)]

    def test_other_connection_cannot_consume_it(self):
        """Only the owning connection may subscribe to its temp destination."""
        b = Broker("B1")
        sub(b, "req", "r", "temp-queue://req.1")
        [err] = to(b.handle_frame("x", Subscribe("s", "temp-queue://req.1"), 0.0), "x")
        assert err.code == "forbidden"
        [err] = to(b.handle_frame("x", Subscribe("s", "temp-queue://>"), 0.0), "x")
        assert err.code == "bad_destination"

    def test_unsubscribed_owner_keeps_it(self):
        """The temp queue lives until its owner disconnects, not until it unsubscribes."""
        b = Broker("B1", log_messages=False)
        sub(b, "req", "r", "temp-queue://req.1")
        b.handle_frame("req", Unsubscribe("r"), 0.0)
        assert to(send(b, "svc", "temp-queue://req.1", "a1"), "svc") == []
        assert got(sub(b, "req", "r2", "temp-queue://req.1"), "req") == [("r2", "a1")]


class TestLimits:
    def test_reject_newest(self):
        """A full destination refuses the new message with Error(limit, ref=id)."""
        b = Broker("B1", policies("Q", max_messages=2, limit_behaviour="reject_newest"))
        send(b, "p", "Q", "m1")
        send(b, "p", "Q", "m2")
        [err] = to(send(b, "p", "Q", "m3", persistent=True), "p")
        assert (err.code, err.ref) == ("limit", "m3")
        assert b.statistics()["destinations"]["queue://Q"]["depth"] == 2

    def test_in_flight_messages_count_against_the_limit(self):
        """Unacknowledged messages are held too, and an ack makes room."""
        b = Broker("B1", policies("Q", max_messages=1, limit_behaviour="reject_newest"))
        sub(b, "c", "s", "Q")
        send(b, "p", "Q", "m1")
        assert to(send(b, "p", "Q", "m2"), "p")[0].code == "limit"
        ack(b, "c", "s", "m1")
        assert got(send(b, "p", "Q", "m3"), "c") == [("s", "m3")]

    def test_drop_oldest(self):
        """A full destination drops its oldest pending message to admit the new one."""
        b = Broker("B1", policies("Q", max_messages=2, limit_behaviour="drop_oldest"))
        send(b, "p", "Q", "m1", persistent=True)
        send(b, "p", "Q", "m2")
        out = send(b, "p", "Q", "m3", receipt=True)
        assert DeleteMessage("m1", "queue://Q") in out
        assert logs(out, "message.dropped") == [
            {"msg": "m1", "dst": "queue://Q", "reason": "limit"}]
        assert to(out, "p") == [Receipt("m3")]
        assert got(sub(b, "c", "s", "Q"), "c") == [("s", "m2"), ("s", "m3")]

    def test_block_parks_sends_in_order_and_resumes(self):
        """Block: the send is parked with Pause, later sends queue behind it, room admits
        them in order with their StoreMessage/Receipt, then Resume."""
        b = Broker("B1", policies("Q", max_messages=1), log_messages=False)
        sub(b, "c", "s", "Q")
        send(b, "p", "Q", "m1", persistent=True, receipt=True)
        out = send(b, "p", "Q", "m2", persistent=True, receipt=True)
        assert out == [Pause("p", "queue://Q")]
        assert send(b, "p", "OTHER", "m3", receipt=True) == []    # parked behind m2
        assert b.statistics()["parked"] == 2
        out = ack(b, "c", "s", "m1")
        stored = [a.msg.id for a in out if isinstance(a, StoreMessage)]
        assert stored == ["m2"]
        assert to(out, "p") == [Receipt("m2"), Receipt("m3")]
        assert got(out, "c") == [("s", "m2")]
        assert out[-1] == Resume("p")
        assert b.statistics()["parked"] == 0

    def test_block_stays_paused_while_still_full(self):
        """Room for one message admits one parked send; the next keeps the conn paused."""
        b = Broker("B1", policies("Q", max_messages=1), log_messages=False)
        sub(b, "c", "s", "Q", prefetch=1)
        send(b, "p", "Q", "m1")
        send(b, "p", "Q", "m2")
        send(b, "p", "Q", "m3", receipt=True)
        out = ack(b, "c", "s", "m1")
        assert got(out, "c") == [("s", "m2")]
        assert not [a for a in out if isinstance(a, Resume)]
        out = ack(b, "c", "s", "m2")
        assert to(out, "p") == [Receipt("m3")] and Resume("p") in out

    def test_blocked_conn_disconnect_discards_parked_sends(self):
        """Parked sends were never accepted: a disconnect forgets them."""
        b = Broker("B1", policies("Q", max_messages=1), log_messages=False)
        sub(b, "c", "s", "Q")
        send(b, "p", "Q", "m1")
        send(b, "p", "Q", "m2")
        b.disconnect("p", 1.0)
        out = ack(b, "c", "s", "m1")
        assert got(out, "c") == [] and not [a for a in out if isinstance(a, Resume)]

    def test_max_bytes_blocks(self):
        """max_bytes counts Message.size of held messages."""
        size = Message("m", "queue://Q", body=b"x" * 100).size
        b = Broker("B1", policies("Q", max_bytes=2 * size, limit_behaviour="reject_newest"))
        send(b, "p", "Q", "m1", body=b"x" * 100)
        send(b, "p", "Q", "m2", body=b"x" * 100)
        assert to(send(b, "p", "Q", "m3", body=b"x"), "p")[0].code == "limit"
        assert b.statistics()["destinations"]["queue://Q"]["bytes"] == 2 * size

    def test_max_message_bytes(self):
        """A message larger than max_message_bytes is refused, whatever the behaviour."""
        b = Broker("B1", policies("topic://>", max_message_bytes=100))
        [err] = to(send(b, "p", "topic://T", "m1", body=b"x" * 200), "p")
        assert (err.code, err.ref) == ("limit", "m1")
        assert "exceeds max_message_bytes" in err.message


class TestRestore:
    def test_restore_requeues_in_order_without_storing_again(self):
        """Stored messages return to their queues in order, redelivered kept, no Store."""
        b = Broker("B1")
        msgs = [Message("m1", "queue://Q", persistent=True, redelivered=2),
                Message("m2", "queue://Q", persistent=True),
                Message("t1", "topic://T", persistent=True)]
        out = b.restore(msgs, 5.0)
        assert not [a for a in out if isinstance(a, StoreMessage)]
        assert DeleteMessage("t1", "topic://T") in out
        out = sub(b, "c", "s", "Q", now=6.0)
        delivered = [f for f in to(out, "c") if isinstance(f, Deliver)]
        assert [(f.msg, f.redelivered) for f in delivered] == [("m1", 2), ("m2", 0)]
        assert DeleteMessage("m1", "queue://Q", consumed=True) in ack(b, "c", "s", "m1")

    def test_restored_expired_message_is_expired(self):
        """A restored message whose time passed while down expires at the next timer."""
        b = Broker("B1", policies("Q", on_expiry="discard"))
        b.restore([Message("m1", "queue://Q", persistent=True, expires=3.0)], 5.0)
        assert b.next_deadline() == 3.0
        out = b.handle_timer(5.0)
        assert DeleteMessage("m1", "queue://Q") in out


class TestStatistics:
    def test_statistics_are_json_and_count(self):
        """statistics() is JSON-serialisable and counts per destination and consumer."""
        b = Broker("B1", log_messages=False)
        sub(b, "c", "s", "Q", prefetch=1)
        for i in range(3):
            send(b, "p", "Q", f"m{i}", body=b"abc")
        ack(b, "c", "s", "m0")
        stats = json.loads(json.dumps(b.statistics()))
        assert stats["broker"] == "B1" and stats["connections"] == 2
        assert stats["destinations"]["queue://Q"] == {
            "depth": 1, "enqueued": 3, "dequeued": 1, "consumers": 1, "inflight": 1,
            "bytes": 2 * Message("x", "queue://Q", body=b"abc").size}
        [c] = stats["consumers"]
        assert (c["conn"], c["sub"], c["inflight"], c["delivered"]) == ("c", "s", 1, 2)

    def test_consumers_for_lists_dispatch_order(self):
        """consumers_for(dst) lists matching consumers, highest priority first."""
        b = Broker("B1")
        b.add_consumer("a", "s", "queue://Q.>", 0.0, priority=1)
        b.add_consumer("b", "s", "queue://Q.X", 0.0, priority=5)
        assert [c.conn for c in b.consumers_for("queue://Q.X")] == ["b", "a"]
        assert [c.conn for c in b.consumers_for("queue://Q.Y")] == ["a"]
        assert [c.conn for c in b.consumers_for("queue://Q.>")] == ["a"]


class TestInvariants:
    """Random frame sequences from misbehaving peers: never an exception, books balance."""

    DSTS = ["Q.A", "Q.B", "Q.L", "Q.R", "Q.D", "queue://Q.>", "topic://T.A", "topic://T.>",
            "temp-queue://c0.t", "A..bad"]
    CONNS = ["c0", "c1", "c2", "L:X", "L:Y"]

    @staticmethod
    def check(b, now):
        from treefed.core.dispatch import pick
        from treefed.core.records import msg_size as _size
        held: dict = {}
        for cs in b._conns.values():
            for c in cs.consumers.values():
                assert len(c.inflight) <= c.prefetch
                for m in c.inflight.values():
                    held.setdefault(m.dst, []).append(m)
            if cs.parked:
                assert cs.blocked_on is not None and cs in cs.blocked_on.blocked
        assert b._expiring == sum(d.expiring for d in b._dests.values())
        for name, d in b._dests.items():
            assert d.inflight == len(held.get(name, ())), name
            if d.topic:
                continue
            assert d.bytes == sum(map(_size, [*d.pending, *held.get(name, ())])), name
            assert d.expiring == sum(1 for m in d.pending if m.expires)
            for m in d.pending:   # nothing pending could have been dispatched
                assert pick(d, m, now) < 0, (name, m.id)

    @settings(max_examples=200, deadline=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 4), st.integers(0, 9),
                              st.integers(0, 3), st.booleans()), min_size=10, max_size=80))
    def test_random_traffic(self, ops):
        """Any sequence of sends, subscriptions, acks, nacks, forwards, disconnects and
        timers leaves counters consistent and no dispatchable message pending."""
        pol = PolicySet([
            ("queue://Q.L", DestinationPolicy(max_messages=3)),
            ("queue://Q.R", DestinationPolicy(max_messages=2, limit_behaviour="reject_newest")),
            ("queue://Q.D", DestinationPolicy(max_messages=2, limit_behaviour="drop_oldest")),
        ])
        b = Broker("B", pol, max_redeliveries=1, dedup_window=5)
        now = 0.0
        for n, (op, ci, di, k, flag) in enumerate(ops):
            conn, dst = self.CONNS[ci], self.DSTS[di]
            now += 0.25
            peer = conn[2:] if conn.startswith("L:") else None
            cs = b._conns.get(conn)
            if op == 0 and peer is None:
                b.handle_frame(conn, Subscribe(f"s{k}", dst, prefetch=k + 1, priority=k % 2), now)
            elif op == 0:
                try:
                    b.add_consumer(conn, f"s{k}", dst, now, peer=peer, prefetch=k + 1,
                                   fallback=flag, message_ttl=k - 1)
                except TreefedError:
                    pass
            elif op in (1, 2):
                b.handle_frame(conn, Send(dst, f"m{n % 12}", persistent=flag,
                                          ttl=1000 * k), now)
            elif op == 3:
                b.handle_frame(conn, Forward(dst, f"m{n % 12}", ["Z", "X"][:k % 3],
                                             expires=now + k if flag else 0.0), now)
            elif op == 4:
                busy = [c for c in cs.consumers.values() if c.inflight] if cs else []
                sub_id, msg = (busy[0].sub_id, next(iter(busy[0].inflight))) if busy else (
                    f"s{k}", "zz")
                b.handle_frame(conn, (Ack if flag or k == 3 else Nack)(sub_id, msg), now)
            elif op == 5:
                ids = list(cs.forwarded)[: k + 1] if cs else ["zz"]
                b.handle_frame(conn, ForwardAck(ids), now)
            elif op == 6:
                b.handle_frame(conn, Unsubscribe(f"s{k}"), now)
            elif op == 7:
                b.disconnect(conn, now)
            elif op == 8:
                now += k
                b.handle_timer(now)
            else:
                b.next_deadline()
            self.check(b, now)
        json.dumps(b.statistics())


class TestLazyContainers:
    """Memory: demand that never carries a message costs no destination and no
    per-consumer containers (shared empties until first use)."""

    def test_demand_creates_no_destination_until_a_message(self):
        """A network consumer on a new queue leaves the destination uncreated; the first
        message creates it and is forwarded to that consumer."""
        b = Broker("B")
        b.connect("L:up:A", 0.0)
        b.add_consumer("L:up:A", "d:1", "queue://Store.S1.Incoming", 0.0, peer="A")
        assert b.statistics()["destinations"] == {}
        out = send(b, "c1", "queue://Store.S1.Incoming", "m1")
        assert [f.id for f in to(out, "L:up:A") if isinstance(f, Forward)] == ["m1"]
        assert "queue://Store.S1.Incoming" in b.statistics()["destinations"]

    def test_local_consumer_still_gets_queued_messages(self):
        """A local subscriber to an unused queue receives what is sent there later."""
        b = Broker("B")
        sub(b, "c1", "s1", "queue://Q")
        assert got(send(b, "p", "queue://Q", "m1"), "c1") == [("s1", "m1")]

    def test_temp_destination_is_created_for_its_owner(self):
        """A temp queue subscription still creates (and owns) its destination at once."""
        b = Broker("B")
        sub(b, "c1", "s1", "temp-queue://r1")
        assert "temp-queue://r1" in b.statistics()["destinations"]

    def test_shared_empties_stay_empty_through_traffic(self):
        """Consumers, acks, requeues and pending messages never write into the shared
        empty containers."""
        import treefed.core.records as core

        b = Broker("B")
        send(b, "p", "queue://Q", "m0")                       # pending, no consumer yet
        sub(b, "c1", "s1", "queue://Q", prefetch=1)
        for i in range(1, 4):
            send(b, "p", "queue://Q", f"m{i}")
        ack(b, "c1", "s1", "m0")
        b.disconnect("c1", 1.0)                                # in-flight requeued
        sub(b, "c2", "s2", "queue://>")
        b.connect("L:up:A", 0.0)
        b.add_consumer("L:up:A", "d:1", "queue://Q", 0.0, peer="A")
        b.remove_consumer("L:up:A", "d:1", 0.0)
        assert core.NO_MESSAGES == {} and core.NO_DESTS == {} and not core.NO_PENDING
