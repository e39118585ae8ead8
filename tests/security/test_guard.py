"""Tests for treefed.security.guard: screening frames before they reach the Site."""

from __future__ import annotations

from treefed.core.actions import Drop, Log, Out
from treefed.security.authz import DENIED, Authorizer, Rule
from treefed.security.guard import STAT_REF, Guard
from treefed.security.tree_scope import TreeScope
from treefed.wire.frames import (Ack, Advisory, Error, Forward, ForwardAck, Send,
                                 StatRequest, Subscribe, Subtree)

AUTHZ = Authorizer([
    Rule("group:stores", "read", "queue://Store.{user}.>"),
    Rule("group:stores", "read", "topic://Broadcast.>"),
    Rule("group:stores", "write", "queue://HQ.>"),
    Rule("group:stores", "write", "queue://Store.>"),
    Rule("group:regions", "read", "queue://Store.>"),
    Rule("group:regions", "write", ">"),
    Rule("ops", "admin", ">"),
], {"s1": ["stores"], "s2": ["stores"], "region": ["regions"]})
SCOPE = TreeScope(["queue://Store.{subtree}.>"], ["topic://Broadcast.>"], ["queue://HQ.>"])


def screen(guard: Guard, frame) -> tuple[bool, list]:
    out: list = []
    return guard.screen("c1", frame, out), out


def errors(out: list) -> list[Error]:
    return [a.frame for a in out if type(a) is Out and type(a.frame) is Error]


class TestClientFrames:
    def test_allowed_frames_pass_untouched(self):
        """Permitted subscribe and send pass with no actions."""
        guard = Guard("s1", AUTHZ)
        assert screen(guard, Subscribe("sub1", "queue://Store.s1.Orders")) == (True, [])
        assert screen(guard, Send("queue://HQ.Sales", "m1")) == (True, [])
        assert screen(guard, Ack("sub1", "m0")) == (True, [])

    def test_subscribe_to_other_store_is_refused_naming_it(self):
        """A store user subscribing to another store's queue gets an Error naming it."""
        ok, out = screen(Guard("s1", AUTHZ), Subscribe("sub9", "queue://Store.s2.Orders"))
        assert not ok
        [error] = errors(out)
        assert error.code == DENIED and error.ref == "sub9"
        assert "queue://Store.s2.Orders" in error.message

    def test_wildcard_subscription_reaching_other_stores_is_refused(self):
        """queue://Store.> would include other stores: refused."""
        ok, out = screen(Guard("s1", AUTHZ), Subscribe("sub", "Store.>"))
        assert not ok and errors(out)[0].message.endswith("queue://Store.>")

    def test_send_needs_write(self):
        """A send to a destination without write permission is refused by message id."""
        ok, out = screen(Guard("s1", AUTHZ), Send("topic://Broadcast.Prices", "m7"))
        assert not ok and errors(out)[0].ref == "m7"

    def test_denial_logged_once_per_destination(self):
        """Repeated refusals of one (permission, dst) log one security.denied line."""
        guard = Guard("s1", AUTHZ)
        logs = []
        for i in range(5):
            _, out = screen(guard, Send("queue://Secret", f"m{i}"))
            logs += [a for a in out if type(a) is Log]
        assert [log.event for log in logs] == ["security.denied"]
        assert logs[0].fields["user"] == "s1" and logs[0].fields["dst"] == "queue://Secret"
        assert guard.denied == 5

    def test_stat_needs_admin(self):
        """StatRequest passes for admin on '>', else Error(ref='stat')."""
        assert screen(Guard("ops", AUTHZ), StatRequest())[0]
        ok, out = screen(Guard("s1", AUTHZ), StatRequest())
        assert not ok and errors(out)[0].ref == STAT_REF

    def test_no_authorizer_means_no_checks(self):
        """Authentication off (authz None): every client frame passes."""
        guard = Guard(None, None)
        assert screen(guard, Subscribe("s", "queue://Store.s2.X"))[0]
        assert screen(guard, StatRequest())[0]

    def test_invalid_destination_is_left_to_the_core(self):
        """A malformed destination passes, so the core refuses it with its own reason."""
        assert screen(Guard("s1", AUTHZ), Send("queue://A..B", "m"))[0]


class TestLinkFrames:
    def test_advisory_spoofing_another_store_is_dropped(self):
        """A store advertising interest in another store's queue: refused, no demand."""
        guard = Guard("s1", AUTHZ, scope=SCOPE.for_child("s1", leaf=True), link="tree",
                      peer="s1")
        adv = Advisory("add", "s1/c1/x", "queue://Store.s2.Orders", "s1")
        ok, out = screen(guard, adv)
        assert not ok
        assert errors(out)[0].ref == "s1/c1/x"
        [dropped] = [a.log() for a in out if type(a) is Drop]
        assert dropped.event == "advisory.dropped"
        assert dropped.fields["reason"] == "forbidden" and dropped.fields["peer"] == "s1"

    def test_refused_advisories_are_counted_with_the_site(self):
        """A shared drop-reason dict (the Site's) counts refused advisories."""
        counters = {"forbidden": 0}
        guard = Guard("s1", AUTHZ, dropped=counters)
        screen(guard, Advisory("add", "c1", "queue://Store.s2.X", "s1"))
        screen(guard, Advisory("add", "c2", "queue://Store.s1.X", "s1"))
        assert counters == {"forbidden": 1}

    def test_own_and_broadcast_advisories_pass(self):
        """Interest in its own queues and broadcast topics passes."""
        guard = Guard("s1", AUTHZ, scope=SCOPE.for_child("s1", leaf=True))
        assert screen(guard, Advisory("add", "s1/c1/a", "queue://Store.s1.A", "s1"))[0]
        assert screen(guard, Advisory("add", "s1/c1/b", "topic://Broadcast.X", "s1"))[0]

    def test_removals_always_pass(self):
        """An advisory removal is never refused."""
        guard = Guard("s1", AUTHZ, scope=SCOPE.for_child("s1", leaf=True))
        assert screen(guard, Advisory("remove", "s1/c1/x", "queue://Store.s2.X", "s1"))[0]

    def test_tree_scope_applies_without_authentication(self):
        """With authentication off, tree confinement still refuses out-of-scope interest."""
        guard = Guard(None, None, scope=SCOPE.for_child("s1", leaf=True))
        assert not screen(guard, Advisory("add", "c", "queue://Store.s2.X", "s1"))[0]

    def test_branch_subtree_follows_claimable_paths(self):
        """A region may advertise for stores below it; not for ones another child owns."""
        owned_elsewhere = {"s9"}
        guard = Guard("region", AUTHZ, scope=SCOPE.for_child("region"),
                      claimable=lambda b: b not in owned_elsewhere)
        assert screen(guard, Advisory("add", "s1/c/x", "queue://Store.s1.X", "s1",
                                      path=["s1"]))[0]
        assert not screen(guard, Advisory("add", "s9/c/x", "queue://Store.s9.X", "s9",
                                          path=["s9"]))[0]
        assert not screen(guard, Advisory("add", "s3/c/x", "queue://Store.s3.X", "s3"))[0]

    def test_forward_outside_scope_is_refused_and_acked(self):
        """A refused forward gets Error and ForwardAck, so the sender releases it."""
        guard = Guard("s1", AUTHZ, scope=SCOPE.for_child("s1", leaf=True))
        ok, out = screen(guard, Forward("queue://Store.s2.X", "m5", ["s1"]))
        assert not ok
        assert errors(out)[0].ref == "m5"
        assert [a.frame for a in out if type(a) is Out and type(a.frame) is ForwardAck] == \
            [ForwardAck(["m5"])]

    def test_forward_needs_write_permission(self):
        """A forward the link user may not write is refused even inside the scope."""
        guard = Guard("s1", AUTHZ)
        assert screen(guard, Forward("queue://HQ.Sales", "m1", ["s1"]))[0]
        assert not screen(guard, Forward("topic://Broadcast.X", "m2", ["s1"]))[0]


class TestSubtreeFrames:
    """A summarising child's Subtree frame (issue 18 part 2) under confinement: it may
    not name brokers outside its own subtree (found at the session's integration: the
    frames were not screened, so a confined store could claim another store)."""

    def test_a_leaf_may_name_only_itself(self):
        counters = {"forbidden": 0}
        guard = Guard("s1", AUTHZ, scope=SCOPE.for_child("s1", leaf=True), dropped=counters)
        frame = Subtree(["s1", "s2", "region-b"], [])
        assert screen(guard, frame)[0]
        assert frame.add == ["s1"] and counters == {"forbidden": 2}

    def test_a_branch_may_not_name_a_broker_another_child_owns(self):
        scope = SCOPE.for_child("region")
        guard = Guard("region", AUTHZ, scope=scope, claimable=lambda b: b != "s9")
        frame = Subtree(["s1", "s9"], ["s3"])
        assert screen(guard, frame)[0]
        assert frame.add == ["s1"] and frame.remove == ["s3"]
        assert "s1" in scope.subtree and "s9" not in scope.subtree

    def test_without_confinement_the_frame_is_untouched(self):
        frame = Subtree(["s1", "s2"], [])
        assert screen(Guard("s1", AUTHZ), frame)[0] and frame.add == ["s1", "s2"]
