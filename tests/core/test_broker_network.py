"""Tests for treefed.core.broker.Broker: network demand, forwarding, fallback, dedup.

These are the semantics the federation layer builds on (docs/internals.md, core.Broker).
A link conn is named ``L:<peer>``; demand is added with ``add_consumer(..., peer=)``.
"""

from treefed.core.actions import DeleteMessage, Log, Out, StoreMessage
from treefed.core.broker import Broker
from treefed.core.policy import DestinationPolicy, PolicySet
from treefed.wire.frames import Ack, Deliver, Error, Forward, ForwardAck, Nack, Send, Subscribe


def to(actions, conn):
    return [a.frame for a in actions if isinstance(a, Out) and a.conn == conn]


def forwards(actions, conn):
    return [f for f in to(actions, conn) if isinstance(f, Forward)]


def got(actions, conn):
    return [f.msg for f in to(actions, conn) if isinstance(f, Deliver)]


def send(b, dst, msg_id, now=0.0, conn="p", **kw):
    return b.handle_frame(conn, Send(dst, msg_id, **kw), now)


def fwd(b, conn, dst, msg_id, path, now=0.0, **kw):
    return b.handle_frame(conn, Forward(dst, msg_id, list(path), **kw), now)


def demand(b, peer, dst, sub_id="d1", **kw):
    return b.add_consumer(f"L:{peer}", sub_id, dst, 0.0, peer=peer, **kw)


class TestNetworkConsumers:
    def test_forward_carries_the_path_with_this_broker_appended(self):
        """Network demand gets Forward(path + [broker_id]) and a message.forwarded event."""
        b = Broker("B")
        demand(b, "C", "queue://Q")
        out = send(b, "Q", "m1", now=3.0, headers={"k": "v"}, persistent=True, ttl=1000)
        [f] = forwards(out, "L:C")
        assert (f.dst, f.path, f.headers, f.persistent, f.expires, f.timestamp) == (
            "queue://Q", ["B"], {"k": "v"}, True, 4.0, 3.0)
        [ev] = [a.fields for a in out if isinstance(a, Log) and a.event == "message.forwarded"]
        assert ev == {"msg": "m1", "dst": "queue://Q", "link": "L:C", "peer": "C", "hops": 1}

    def test_never_back_to_a_broker_in_the_path(self):
        """A message that has left broker C is not offered to demand toward C."""
        b = Broker("B")
        demand(b, "C", "queue://Q")
        demand(b, "D", "queue://Q")
        out = fwd(b, "L:C", "queue://Q", "m1", ["A", "C"])
        assert forwards(out, "L:C") == []
        assert [f.path for f in forwards(out, "L:D")] == [["A", "C", "B"]]

    def test_message_ttl_limits_the_path_length(self):
        """message_ttl=1: only messages with an empty path are offered."""
        b = Broker("B")
        demand(b, "C", "queue://Q", message_ttl=1)
        assert forwards(fwd(b, "L:A", "queue://Q", "m1", ["A"]), "L:C") == []
        assert len(forwards(send(b, "Q", "m2"), "L:C")) == 1
        demand(b, "D", "queue://R", message_ttl=-1)
        assert len(forwards(fwd(b, "L:A", "queue://R", "m3", ["X", "Y", "A"]), "L:D")) == 1

    def test_forward_ack_releases_credit_and_deletes(self):
        """A forwarded message holds credit until ForwardAck, which deletes it."""
        b = Broker("B")
        demand(b, "C", "queue://Q", prefetch=1)
        send(b, "Q", "m1", persistent=True)
        out = send(b, "Q", "m2", persistent=True)
        assert forwards(out, "L:C") == []
        assert b.statistics()["destinations"]["queue://Q"]["depth"] == 1
        out = b.handle_frame("L:C", ForwardAck(["m1"]), 1.0)
        assert DeleteMessage("m1", "queue://Q") in out
        assert [f.id for f in forwards(out, "L:C")] == ["m2"]
        stats = b.statistics()["destinations"]["queue://Q"]
        assert (stats["depth"], stats["inflight"], stats["dequeued"]) == (0, 1, 1)

    def test_unknown_forward_ack_is_ignored(self):
        """A ForwardAck for ids not in flight changes nothing and sends nothing."""
        b = Broker("B")
        demand(b, "C", "queue://Q")
        assert b.handle_frame("L:C", ForwardAck(["zz"]), 0.0) == []

    def test_local_consumers_are_preferred_by_priority(self):
        """Demand at -5 gets messages only while the local consumer (0) has no credit."""
        b = Broker("B", log_messages=False)
        demand(b, "C", "queue://Q", priority=-5)
        b.handle_frame("c", Subscribe("s", "Q", prefetch=1), 0.0)
        out = send(b, "Q", "m1")
        assert got(out, "c") == ["m1"] and forwards(out, "L:C") == []
        assert [f.id for f in forwards(send(b, "Q", "m2"), "L:C")] == ["m2"]

    def test_local_only_destinations_never_leave(self):
        """local_only: network demand is not offered the message unless local_only_ok."""
        b = Broker("B", PolicySet([("queue://LOCAL.>", DestinationPolicy(local_only=True))]))
        demand(b, "C", "queue://LOCAL.X")
        out = send(b, "LOCAL.X", "m1")
        assert forwards(out, "L:C") == []
        assert b.statistics()["destinations"]["queue://LOCAL.X"]["depth"] == 1
        out = demand(b, "D", "queue://LOCAL.X", sub_id="ok", local_only_ok=True)
        assert [f.id for f in forwards(out, "L:D")] == ["m1"]

    def test_link_loss_requeues_forwarded_messages(self):
        """Disconnecting a link requeues its unacked forwards for other consumers."""
        b = Broker("B", log_messages=False)
        demand(b, "C", "queue://Q")
        send(b, "Q", "m1")
        b.disconnect("L:C", 1.0)
        out = b.handle_frame("c", Subscribe("s", "Q"), 1.0)
        [d] = [f for f in to(out, "c") if isinstance(f, Deliver)]
        assert (d.msg, d.redelivered) == ("m1", 1)
        assert b.handle_frame("L:C", ForwardAck(["m1"]), 2.0) == []   # stale ack: ignored
        assert b.statistics()["destinations"]["queue://Q"]["inflight"] == 1

    def test_non_conduit_demand_round_robins_on_one_link(self):
        """Several demand consumers on one link share queue messages round-robin."""
        b = Broker("B", log_messages=False)
        demand(b, "C", "queue://Q", sub_id="x")
        demand(b, "C", "queue://Q", sub_id="y")
        demand(b, "D", "queue://Q", sub_id="z")
        ids = [[f.id for f in forwards(send(b, "Q", f"m{i}"), link)]
               for i, link in enumerate(["L:C", "L:C", "L:D", "L:C"])]
        assert ids == [["m0"], ["m1"], ["m2"], ["m3"]]


class TestFallback:
    def test_queue_fallback_only_without_other_eligible_consumer(self):
        """A fallback consumer gets nothing while a regular eligible one exists,
        even one without credit; it takes everything once that one is gone."""
        b = Broker("B", log_messages=False)
        demand(b, "P", "queue://>", sub_id="up", fallback=True)
        b.handle_frame("c", Subscribe("s", "Q", prefetch=1), 0.0)
        out = send(b, "Q", "m1")
        assert got(out, "c") == ["m1"]
        out = send(b, "Q", "m2")
        assert forwards(out, "L:P") == []
        out = b.disconnect("c", 1.0)
        assert [f.id for f in forwards(out, "L:P")] == ["m1", "m2"]

    def test_queue_fallback_when_no_consumer_selects_the_message(self):
        """A regular consumer whose selector refuses the message does not count."""
        b = Broker("B", log_messages=False)

        class Red:
            text = "color = 'red'"

            def matches(self, headers, *, message=None):
                return headers.get("color") == "red"

        b.add_consumer("c", "s", "queue://Q", 0.0, selector=Red())
        demand(b, "P", "queue://>", sub_id="up", fallback=True)
        assert [f.id for f in forwards(send(b, "Q", "m1", headers={"color": "blue"}),
                                       "L:P")] == ["m1"]
        assert got(send(b, "Q", "m2", headers={"color": "red"}), "c") == ["m2"]

    def test_fallback_never_returns_to_its_peer(self):
        """A message that came from the parent is not sent back up by the fallback."""
        b = Broker("B", log_messages=False)
        demand(b, "P", "queue://>", sub_id="up", fallback=True)
        out = fwd(b, "L:P", "queue://Q", "m1", ["P"])
        assert forwards(out, "L:P") == []
        assert b.statistics()["destinations"]["queue://Q"]["depth"] == 1

    def test_topic_fallback_gets_a_copy_unless_its_link_already_has_one(self):
        """Topic fallback: a copy, except when a demand consumer on the same link got one."""
        b = Broker("B", log_messages=False)
        demand(b, "P", "topic://>", sub_id="up", fallback=True)
        b.handle_frame("c", Subscribe("s", "topic://T"), 0.0)
        out = send(b, "topic://T", "m1")
        assert got(out, "c") == ["m1"] and len(forwards(out, "L:P")) == 1
        demand(b, "P", "topic://T", sub_id="real")
        assert len(forwards(send(b, "topic://T", "m2"), "L:P")) == 1


class TestTopicNetwork:
    def test_one_copy_per_link_per_dispatch(self):
        """Several demand subscriptions on one link yield a single Forward per message."""
        b = Broker("B", log_messages=False)
        demand(b, "C", "topic://PRICE.>", sub_id="a")
        demand(b, "C", "topic://PRICE.STOCK", sub_id="b")
        demand(b, "D", "topic://PRICE.STOCK", sub_id="c")
        out = send(b, "topic://PRICE.STOCK", "m1")
        assert len(forwards(out, "L:C")) == 1 and len(forwards(out, "L:D")) == 1

    def test_topic_forward_not_back_to_sender(self):
        """A topic message forwarded by C reaches D's demand and local subscribers only."""
        b = Broker("B", log_messages=False)
        demand(b, "C", "topic://T", sub_id="a")
        demand(b, "D", "topic://T", sub_id="b")
        b.handle_frame("c", Subscribe("s", "topic://T"), 0.0)
        out = fwd(b, "L:C", "topic://T", "m1", ["C"])
        assert forwards(out, "L:C") == [] and len(forwards(out, "L:D")) == 1
        assert got(out, "c") == ["m1"]


class TestAcceptForward:
    def test_store_then_ack_and_path_kept(self):
        """A persistent forward is stored before its ForwardAck and keeps its path."""
        b = Broker("B")
        out = fwd(b, "L:A", "queue://Q", "m1", ["A"], persistent=True, redelivered=1,
                  timestamp=2.0)
        kinds = [type(a).__name__ for a in out]
        assert kinds.index("StoreMessage") < kinds.index("Out")
        [stored] = [a.msg for a in out if isinstance(a, StoreMessage)]
        assert (stored.path, stored.redelivered, stored.timestamp) == (("A",), 1, 2.0)
        assert to(out, "L:A") == [ForwardAck(["m1"])]
        [f] = forwards(demand(b, "C", "queue://Q"), "L:C")
        assert f.path == ["A", "B"]

    def test_duplicates_are_acked_and_dropped(self):
        """A forward whose id was seen is acked again but not delivered twice."""
        b = Broker("B")
        b.handle_frame("c", Subscribe("s", "topic://T"), 0.0)
        out = fwd(b, "L:A", "topic://T", "m1", ["A"])
        assert got(out, "c") == ["m1"]
        out = fwd(b, "L:X", "topic://T", "m1", ["A", "X"])
        assert got(out, "c") == [] and to(out, "L:X") == [ForwardAck(["m1"])]
        assert b.statistics()["dropped"] == {"duplicate": 1}

    def test_forward_that_already_left_this_broker_is_a_loop(self):
        """A forward whose path holds this broker is acked and dropped as a loop."""
        b = Broker("B")
        b.handle_frame("c", Subscribe("s", "Q"), 0.0)
        out = fwd(b, "L:A", "queue://Q", "m1", ["B", "A"])
        assert got(out, "c") == [] and to(out, "L:A") == [ForwardAck(["m1"])]
        assert b.statistics()["dropped"] == {"loop": 1}

    def test_dedup_window_forgets_old_ids(self):
        """Only the last dedup_window ids are remembered (topic copies are not held,
        so only the window can recognise them)."""
        b = Broker("B", dedup_window=2, log_messages=False)
        for i in range(3):
            fwd(b, "L:A", "topic://T", f"m{i}", ["A"])
        fwd(b, "L:A", "topic://T", "m0", ["A"])     # forgotten: accepted again
        fwd(b, "L:A", "topic://T", "m2", ["A"])     # remembered: dropped
        assert b.statistics()["destinations"]["topic://T"]["enqueued"] == 4

    def test_bad_forward_is_refused_and_acked(self):
        """An invalid forward gets Error(ref=id) plus ForwardAck so the sender lets go."""
        b = Broker("B")
        out = fwd(b, "L:A", "queue://A..B", "m1", ["A"])
        [err, fack] = to(out, "L:A")
        assert isinstance(err, Error) and (err.code, err.ref) == ("bad_destination", "m1")
        assert fack == ForwardAck(["m1"])

    def test_forward_limit_block_pauses_the_link(self):
        """A full blocking destination parks forwards too; the ack comes once admitted."""
        b = Broker("B", PolicySet([("queue://Q", DestinationPolicy(max_messages=1))]))
        b.handle_frame("c", Subscribe("s", "Q"), 0.0)
        fwd(b, "L:A", "queue://Q", "m1", ["A"])
        out = fwd(b, "L:A", "queue://Q", "m2", ["A"])
        assert to(out, "L:A") == [] and out[0].conn == "L:A"
        out = b.handle_frame("c", Ack("s", "m1"), 1.0)
        assert to(out, "L:A") == [ForwardAck(["m2"])]


class TestRestedMessages:
    def test_replay_consumer_takes_a_rested_message_back_along_its_path(self):
        """A message that found no consumer rests; a replay consumer may then send it back."""
        b = Broker("HQ")
        b.allow_revisits("L:R1")
        fwd(b, "L:R1", "queue://Q", "m1", ["S1", "R1"])
        out = demand(b, "R1", "queue://Q", replay=True)
        assert [f.id for f in forwards(out, "L:R1")] == ["m1"]

    def test_mesh_consumer_never_goes_back_even_when_rested(self):
        """Without replay the path rule holds for a rested message too (ActiveMQ default)."""
        b = Broker("HQ")
        fwd(b, "L:R1", "queue://Q", "m1", ["S1", "R1"])
        assert forwards(demand(b, "R1", "queue://Q"), "L:R1") == []

    def test_busy_consumers_do_not_make_a_message_rest(self):
        """A message waiting only for credit is not rested: it keeps the path rule."""
        b = Broker("R1")
        b.handle_frame("c", Subscribe("s", "Q", prefetch=1), 0.0)
        fwd(b, "L:HQ", "queue://Q", "m1", ["HQ"])
        fwd(b, "L:HQ", "queue://Q", "m2", ["HQ"])
        assert forwards(demand(b, "HQ", "queue://Q", replay=True), "L:HQ") == []

    def test_revisits_only_on_tree_links(self):
        """A forward naming this broker is a loop unless the link allows revisits."""
        b = Broker("B")
        b.handle_frame("c", Subscribe("s", "Q"), 0.0)
        b.allow_revisits("L:T")
        assert got(fwd(b, "L:T", "queue://Q", "m1", ["B", "A"]), "c") == ["m1"]
        assert got(fwd(b, "L:M", "queue://Q", "m2", ["B", "A"]), "c") == []

    def test_tree_link_retransmit_is_still_a_duplicate(self):
        """On a revisit link the same id with the same path is a retransmit: dropped."""
        b = Broker("B")
        b.handle_frame("c", Subscribe("s", "topic://T"), 0.0)
        b.allow_revisits("L:T")
        assert got(fwd(b, "L:T", "topic://T", "m1", ["A"]), "c") == ["m1"]
        assert got(fwd(b, "L:T", "topic://T", "m1", ["A"]), "c") == []
        assert b.statistics()["dropped"] == {"duplicate": 1}

    def test_hop_limit_drops_looping_messages(self):
        """A forward that crossed MAX_HOPS links is acked and dropped as hop_limit."""
        from treefed.core.broker import MAX_HOPS
        b = Broker("B")
        b.handle_frame("c", Subscribe("s", "Q"), 0.0)
        out = fwd(b, "L:A", "queue://Q", "m1", [f"X{i}" for i in range(MAX_HOPS)])
        assert got(out, "c") == [] and to(out, "L:A") == [ForwardAck(["m1"])]
        assert b.statistics()["dropped"] == {"hop_limit": 1}


class TestDeadLetterStaysLocal:
    def test_dlq_is_never_forwarded(self):
        """Dead letters stay at the site that dead-lettered them, even with demand for >."""
        b = Broker("B", max_redeliveries=0)
        out = demand(b, "P", "queue://>", fallback=True)
        b.handle_frame("c", Subscribe("s", "Q"), 0.0)
        send(b, "queue://Q", "m1")
        out = b.handle_frame("c", Nack("s", "m1"), 0.0)
        assert forwards(out, "L:P") == []
        assert b.statistics()["destinations"]["queue://DLQ"]["depth"] == 1
