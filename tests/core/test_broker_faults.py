"""Tests for the fault-tolerance parts of treefed.core.broker.Broker: duplicates after a
reconnect or restart (persistent re-sends, tree-link retransmits), order of messages
that come back after an outage, monotonic timestamps, and ``withdraw`` (a store commit
that failed)."""

from treefed.core.actions import DeleteMessage, Log, Out, Resume, StoreMessage
from treefed.core.broker import Broker
from treefed.core.message import Message
from treefed.core.policy import DestinationPolicy, PolicySet
from treefed.wire.frames import (Ack, Deliver, Error, Forward, ForwardAck, Nack, Receipt,
                                 Send, Subscribe)


def to(actions, conn):
    return [a.frame for a in actions if isinstance(a, Out) and a.conn == conn]


def got(actions, conn):
    return [f.msg for f in to(actions, conn) if isinstance(f, Deliver)]


def forwards(actions, conn):
    return [f for f in to(actions, conn) if isinstance(f, Forward)]


def psend(b, msg_id, dst="queue://Q", now=0.0, conn="p"):
    return b.handle_frame(conn, Send(dst, msg_id, persistent=True, receipt=True), now)


def fwd(b, conn, msg_id, path, dst="queue://Q", now=0.0, **kw):
    return b.handle_frame(conn, Forward(dst, msg_id, list(path), persistent=True, **kw), now)


class TestPersistentResend:
    def test_resent_message_still_held_is_confirmed_once(self):
        """A producer re-sending (after failover) a message the broker holds gets a
        receipt again, and the queue keeps one copy."""
        b = Broker("B")
        psend(b, "m1")
        out = psend(b, "m1")
        assert to(out, "p") == [Receipt("m1")]
        assert b.statistics()["destinations"]["queue://Q"]["depth"] == 1
        assert b.statistics()["dropped"] == {"duplicate": 1}

    def test_resent_message_already_consumed_is_not_delivered_again(self):
        """A re-send of a message a local consumer already acked is confirmed, not queued."""
        b = Broker("B")
        b.handle_frame("c", Subscribe("s", "Q"), 0.0)
        psend(b, "m1")
        b.handle_frame("c", Ack("s", "m1"), 0.0)
        out = psend(b, "m1")
        assert to(out, "p") == [Receipt("m1")] and got(out, "c") == []

    def test_restored_message_resent_after_restart_is_one_copy(self):
        """After a restart, a re-send of a restored message does not add a second copy."""
        b = Broker("B")
        b.restore([Message("m1", "queue://Q", persistent=True)], 0.0)
        psend(b, "m1")
        assert b.statistics()["destinations"]["queue://Q"]["depth"] == 1


class TestTreeLinkDuplicates:
    def test_copy_of_a_held_message_is_dropped_whatever_its_path(self):
        """On a tree link a copy of a message still held here is a duplicate, even when
        it comes back around with a longer path."""
        b = Broker("S1")
        b.allow_revisits("L:R1")
        fwd(b, "L:R1", "m1", ["HQ", "R1"])
        out = fwd(b, "L:R1", "m1", ["HQ", "R1", "HQ", "R1"])
        assert to(out, "L:R1") == [ForwardAck(["m1"])]
        assert b.statistics()["destinations"]["queue://Q"]["depth"] == 1

    def test_copy_of_a_consumed_message_is_dropped(self):
        """A late copy of a message a local consumer acked is acked and dropped."""
        b = Broker("S1")
        b.allow_revisits("L:R1")
        b.handle_frame("c", Subscribe("s", "Q"), 0.0)
        fwd(b, "L:R1", "m1", ["HQ", "R1"])
        b.handle_frame("c", Ack("s", "m1"), 0.0)
        out = fwd(b, "L:R1", "m1", ["HQ", "R1", "HQ", "R1"])
        assert got(out, "c") == [] and b.statistics()["dropped"] == {"duplicate": 1}

    def test_message_that_left_may_come_back(self):
        """A message forwarded away (and acked) is accepted again when it returns: a
        tree replay, not a duplicate."""
        b = Broker("R1")
        b.allow_revisits("L:HQ")
        b.add_consumer("L:HQ", "f", "queue://>", 0.0, peer="HQ", fallback=True, replay=True)
        out = fwd(b, "L:S1", "m1", ["S1"])
        assert [f.id for f in forwards(out, "L:HQ")] == ["m1"]
        b.handle_frame("L:HQ", ForwardAck(["m1"]), 0.0)
        b.handle_frame("c", Subscribe("s", "Q"), 0.0)
        out = fwd(b, "L:HQ", "m1", ["S1", "R1", "HQ"])
        assert got(out, "c") == ["m1"]

    def test_mesh_link_drops_a_copy_of_a_restored_message(self):
        """Mesh: a peer re-forwarding a message we restored from the store is a duplicate."""
        b = Broker("R1")
        b.restore([Message("m1", "queue://Q", persistent=True, path=("HQ",))], 0.0)
        out = fwd(b, "L:HQ", "m1", ["HQ"])
        assert to(out, "L:HQ") == [ForwardAck(["m1"])]
        assert b.statistics()["destinations"]["queue://Q"]["depth"] == 1


def deletes(actions):
    return [a for a in actions if type(a) is DeleteMessage]


def dropped(actions):
    return [a.fields for a in actions if type(a) is Log and a.event == "message.dropped"]


class TestConsumedAcrossRestart:
    """The ids local consumers acked reach the store with their DeleteMessage
    (``consumed=True``) and come back through ``restore(..., consumed=)``."""

    def test_only_a_local_ack_marks_the_delete_consumed(self):
        """A local consumer's ack (single or cumulative) yields DeleteMessage(consumed=
        True); a forward-ack, an expiry and a move to the DLQ do not."""
        b = Broker("B", PolicySet([("queue://EXP", DestinationPolicy(on_expiry="discard"))]),
                   max_redeliveries=0)
        b.handle_frame("c", Subscribe("s", "Q"), 0.0)
        psend(b, "m1")
        psend(b, "m2")
        psend(b, "m3")
        assert deletes(b.handle_frame("c", Ack("s", "m1"), 0.0)) == [
            DeleteMessage("m1", "queue://Q", consumed=True)]
        assert deletes(b.handle_frame("c", Ack("s", "m3", upto=True), 0.0)) == [
            DeleteMessage("m2", "queue://Q", consumed=True),
            DeleteMessage("m3", "queue://Q", consumed=True)]
        # network demand: a forward-ack settles, but nothing was consumed here
        b.add_consumer("L:HQ", "d", "queue://FWD", 0.0, peer="HQ")
        psend(b, "f1", dst="queue://FWD")
        assert deletes(b.handle_frame("L:HQ", ForwardAck(["f1"]), 0.0)) == [
            DeleteMessage("f1", "queue://FWD")]
        # expiry (discarded) and a dead letter
        b.handle_frame("p", Send("queue://EXP", "e1", persistent=True, ttl=1000), 0.0)
        assert deletes(b.handle_timer(2.0)) == [DeleteMessage("e1", "queue://EXP")]
        b.handle_frame("c", Subscribe("n", "NACK"), 0.0)
        psend(b, "n1", dst="queue://NACK")
        assert deletes(b.handle_frame("c", Nack("n", "n1"), 0.0)) == [
            DeleteMessage("n1", "queue://NACK")]

    def test_consumed_id_restored_is_a_duplicate_on_mesh_and_tree_links(self):
        """A forwarded persistent message a local consumer acked; the broker restarts
        with the ids of its consumed deletes; the same id re-forwarded on a mesh link
        and on a tree (revisit) link is acked and dropped as a duplicate, never
        delivered again."""
        b = Broker("S1")
        b.handle_frame("c", Subscribe("s", "Q"), 0.0)
        out = fwd(b, "L:HQ", "m1", ["HQ"])
        assert got(out, "c") == ["m1"]
        consumed = [a.msg_id for a in deletes(b.handle_frame("c", Ack("s", "m1"), 0.0))
                    if a.consumed]
        assert consumed == ["m1"]

        b2 = Broker("S1")        # the restart: nothing held, the store hands back the ids
        assert b2.restore([], 10.0, consumed=consumed) == []
        b2.allow_revisits("L:R1")
        b2.handle_frame("c", Subscribe("s", "Q"), 10.0)
        for conn, path in (("L:HQ", ["HQ"]), ("L:R1", ["HQ", "R1"])):
            out = fwd(b2, conn, "m1", path, now=11.0)
            assert to(out, conn) == [ForwardAck(["m1"])]
            assert got(out, "c") == [] and not [a for a in out if type(a) is StoreMessage]
            assert dropped(out) == [{"msg": "m1", "dst": "queue://Q", "reason": "duplicate"}]
        # a producer's persistent re-send of it is confirmed, not queued
        out = psend(b2, "m1", now=12.0)
        assert to(out, "p") == [Receipt("m1")] and got(out, "c") == []
        stats = b2.statistics()
        assert stats["dropped"] == {"duplicate": 3}
        assert stats["destinations"].get("queue://Q", {"depth": 0})["depth"] == 0

    def test_message_forwarded_on_may_come_back_after_restore(self):
        """Only locally consumed ids are primed: a message that was forwarded on (and
        forward-acked) before the restart is accepted again when a tree replay brings
        it back."""
        b = Broker("R1")
        b.allow_revisits("L:HQ")
        b.add_consumer("L:HQ", "f", "queue://>", 0.0, peer="HQ", fallback=True, replay=True)
        out = fwd(b, "L:S1", "m1", ["S1"])
        assert [f.id for f in forwards(out, "L:HQ")] == ["m1"]
        out = b.handle_frame("L:HQ", ForwardAck(["m1"]), 0.0)
        assert deletes(out) == [DeleteMessage("m1", "queue://Q")]   # not consumed

        b2 = Broker("R1")
        b2.restore([], 10.0, consumed=["other"])
        b2.allow_revisits("L:HQ")
        b2.handle_frame("c", Subscribe("s", "Q"), 10.0)
        out = fwd(b2, "L:HQ", "m1", ["S1", "R1", "HQ"], now=11.0)
        assert [a.msg.id for a in out if type(a) is StoreMessage] == ["m1"]
        assert to(out, "L:HQ") == [ForwardAck(["m1"])] and got(out, "c") == ["m1"]
        # while the id that was consumed stays a duplicate on the same link
        out = fwd(b2, "L:HQ", "other", ["S1", "R1", "HQ"], now=11.0)
        assert got(out, "c") == [] and b2.statistics()["dropped"] == {"duplicate": 1}

    def test_restore_keeps_only_the_newest_window_of_consumed_ids(self):
        """restore primes at most ``dedup_window`` ids, the newest (last) ones."""
        b = Broker("S1", dedup_window=2)
        b.restore([], 0.0, consumed=["a", "b", "c"])
        b.handle_frame("c", Subscribe("s", "Q"), 0.0)
        assert got(fwd(b, "L:HQ", "c", ["HQ"]), "c") == []
        assert got(fwd(b, "L:HQ", "b", ["HQ"]), "c") == []
        assert got(fwd(b, "L:HQ", "a", ["HQ"]), "c") == ["a"]


class TestReturningOrder:
    def test_message_coming_back_takes_its_place_in_the_queue(self):
        """A message that left this broker and returns is queued before newer ones, so a
        producer's order survives a replay up the tree."""
        b = Broker("HQ")
        b.allow_revisits("L:R1")
        for i, t in ((3, 3.0), (4, 4.0)):
            psend(b, f"m{i}", now=t)
        fwd(b, "L:R1", "m1", ["HQ", "R1"], timestamp=1.0)
        fwd(b, "L:R1", "m2", ["HQ", "R1"], timestamp=2.0)
        out = b.handle_frame("c", Subscribe("s", "Q"), 5.0)
        assert got(out, "c") == ["m1", "m2", "m3", "m4"]

    def test_foreign_messages_keep_arrival_order(self):
        """Messages that never passed this broker are queued as they arrive, whatever
        the clocks of the brokers that stamped them."""
        b = Broker("HQ")
        fwd(b, "L:R1", "a", ["S1", "R1"], timestamp=9.0)
        fwd(b, "L:R1", "b", ["S2", "R1"], timestamp=1.0)
        out = b.handle_frame("c", Subscribe("s", "Q"), 5.0)
        assert got(out, "c") == ["a", "b"]

    def test_timestamps_never_go_back(self):
        """A clock stepping back does not stamp a later message earlier."""
        b = Broker("B")
        b.handle_frame("c", Subscribe("s", "Q"), 0.0)
        first = to(psend(b, "m1", now=10.0), "c")
        second = to(psend(b, "m2", now=7.0), "c")
        assert first[0].timestamp == 10.0 and second[0].timestamp == 10.0


class TestWithdraw:
    def test_pending_message_is_taken_back(self):
        """A message whose commit failed leaves the queue and can be sent again later."""
        b = Broker("B")
        psend(b, "m1")
        b.withdraw("m1", "queue://Q", 0.0)
        stats = b.statistics()["destinations"]["queue://Q"]
        assert (stats["depth"], stats["enqueued"], stats["bytes"]) == (0, 0, 0)
        assert to(psend(b, "m1"), "p") == [Receipt("m1")]
        assert b.statistics()["destinations"]["queue://Q"]["depth"] == 1

    def test_message_given_to_a_consumer_returns_its_credit(self):
        """Withdrawn from a consumer: its credit goes to the next pending message."""
        b = Broker("B")
        b.handle_frame("c", Subscribe("s", "Q", prefetch=1), 0.0)
        psend(b, "m1")
        psend(b, "m2")
        out = b.withdraw("m1", "queue://Q", 0.0)
        assert got(out, "c") == ["m2"]
        assert b.statistics()["destinations"]["queue://Q"]["inflight"] == 1

    def test_forwarded_message_is_forgotten_by_dedup(self):
        """A forward taken back is accepted when the peer re-forwards it."""
        b = Broker("B")
        fwd(b, "L:A", "m1", ["A"])
        b.withdraw("m1", "queue://Q", 0.0)
        out = fwd(b, "L:A", "m1", ["A"])
        assert b.statistics()["destinations"]["queue://Q"]["depth"] == 1
        assert "duplicate" not in b.statistics()["dropped"]
        assert to(out, "L:A") == [ForwardAck(["m1"])]

    def test_withdraw_frees_room_for_a_blocked_producer(self):
        """Room made by a withdrawal resumes a producer blocked on the destination."""
        b = Broker("B", PolicySet([("queue://Q", DestinationPolicy(max_messages=1))]))
        psend(b, "m1")
        psend(b, "m2", conn="p2")
        out = b.withdraw("m1", "queue://Q", 0.0)
        assert any(isinstance(a, Resume) and a.conn == "p2" for a in out)

    def test_unknown_message_is_ignored(self):
        """Withdrawing what is not here changes nothing."""
        b = Broker("B")
        assert b.withdraw("nope", "queue://Q", 0.0) == []
        assert not any(isinstance(f, Error) for f in to(psend(b, "m1"), "p"))


class TestReplayDelay:
    def _leaf(self, delay):
        b = Broker("S1", replay_delay=delay)
        b.allow_revisits("L:R1")
        b.add_consumer("L:R1", "f", "queue://>", 0.0, peer="R1", fallback=True, replay=True)
        return b

    def test_backlog_waits_for_a_returning_consumer(self):
        """A consumer that vanishes and returns within replay_delay gets its backlog
        here: nothing is sent back up to the parent meanwhile."""
        b = self._leaf(10.0)
        b.handle_frame("c", Subscribe("s", "Q", prefetch=1), 0.0)
        fwd(b, "L:R1", "m1", ["HQ", "R1"])
        fwd(b, "L:R1", "m2", ["HQ", "R1"])
        out = b.disconnect("c", 1.0)
        assert forwards(out, "L:R1") == []
        assert forwards(b.handle_timer(5.0), "L:R1") == []
        out = b.handle_frame("c2", Subscribe("s", "Q"), 6.0)
        assert got(out, "c2") == ["m1", "m2"]

    def test_backlog_goes_up_once_the_delay_passed(self):
        """No consumer within replay_delay: the timer sends the rested messages back up,
        in order."""
        b = self._leaf(10.0)
        b.handle_frame("c", Subscribe("s", "Q", prefetch=1), 0.0)
        fwd(b, "L:R1", "m1", ["HQ", "R1"])
        fwd(b, "L:R1", "m2", ["HQ", "R1"])
        b.disconnect("c", 1.0)
        deadline = b.next_deadline()
        assert deadline is not None and 11.0 <= deadline <= 11.25
        out = b.handle_timer(deadline)
        assert [f.id for f in forwards(out, "L:R1")] == ["m1", "m2"]

    def test_messages_from_below_go_up_at_once(self):
        """The delay applies only to going *back*: a message nobody here wants that came
        from below still climbs immediately (route_unknown_up)."""
        b = Broker("R1", replay_delay=10.0)
        b.add_consumer("L:HQ", "f", "queue://>", 0.0, peer="HQ", fallback=True, replay=True)
        out = fwd(b, "L:S1", "m1", ["S1"])
        assert [f.id for f in forwards(out, "L:HQ")] == ["m1"]

    def test_demand_replay_is_not_delayed(self):
        """Known demand below takes a rested message back down at once."""
        b = Broker("HQ", replay_delay=10.0)
        b.allow_revisits("L:R1")
        fwd(b, "L:R1", "m1", ["S1", "R1"])
        out = b.add_consumer("L:R1", "d", "queue://Q", 0.5, peer="R1", replay=True)
        assert [f.id for f in forwards(out, "L:R1")] == ["m1"]
