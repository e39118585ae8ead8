"""Tests for treefed.security.tree_scope: a child's confinement to its subtree."""

from __future__ import annotations

import pytest

from treefed.security.tree_scope import TreeScope

SCOPE = TreeScope(child_patterns=["queue://Store.{child}.>", "queue://Region.{subtree}.>"],
                  broadcast=["topic://Broadcast.>"], upward=["queue://HQ.>"])


class TestLeafChild:
    def test_own_destinations_and_broadcast(self):
        """A store may advertise its own queues and broadcast topics."""
        store = SCOPE.for_child("store-1", leaf=True)
        assert store.may_advertise("queue://Store.store-1.Orders")
        assert store.may_advertise("topic://Broadcast.Prices")
        assert store.may_advertise("topic://Broadcast.>")

    def test_other_stores_are_refused(self):
        """A store may not advertise another store's queue, directly or by wildcard."""
        store = SCOPE.for_child("store-1", leaf=True)
        assert not store.may_advertise("queue://Store.store-2.Orders")
        assert not store.may_advertise("queue://Store.>")
        assert not store.may_advertise("queue://Store.*.Orders")
        assert not store.may_advertise("queue://HQ.Sales")

    def test_upward_destinations_may_be_sent_not_advertised(self):
        """HQ queues may be sent up but interest in them is refused."""
        store = SCOPE.for_child("store-1", leaf=True)
        assert store.may_send("queue://HQ.Sales")
        assert not store.may_advertise("queue://HQ.Sales")
        assert store.may_send("queue://Store.store-1.Orders")
        assert not store.may_send("queue://Store.store-2.Orders")

    def test_leaf_ignores_claimed_subtree(self):
        """A leaf has no subtree: brokers it names in paths are spoofs and ignored."""
        store = SCOPE.for_child("store-1", leaf=True)
        store.add_subtree(["store-2"])
        assert store.subtree == {"store-1"}
        assert not store.may_advertise("queue://Region.store-2.X")


    def test_temporary_destinations_pass_unless_disabled(self):
        """Reply queues may cross the tree (request/reply) unless temp is switched off."""
        store = SCOPE.for_child("store-1", leaf=True)
        assert store.may_send("temp-queue://replies.abc")
        assert store.may_advertise("temp-queue://replies.abc")
        closed = TreeScope(["queue://Store.{child}.>"], temp_destinations=False)
        assert not closed.for_child("store-1", leaf=True).may_send("temp-queue://r.abc")


class TestBranchChild:
    def test_subtree_grows_as_announced(self):
        """A branch may advertise for brokers once it has announced them below it."""
        region = SCOPE.for_child("region-uk")
        assert region.may_advertise("queue://Region.region-uk.X")
        assert not region.may_advertise("queue://Region.store-9.X")   # cached refusal
        region.add_subtree(["store-9"])
        assert region.may_advertise("queue://Region.store-9.X")
        assert not region.may_advertise("queue://Region.store-10.X")

    def test_child_placeholder_is_the_branch_itself_only(self):
        """{child} binds to the link's own broker id, not to its subtree."""
        region = SCOPE.for_child("region-uk")
        region.add_subtree(["store-9"])
        assert region.may_advertise("queue://Store.region-uk.X")
        assert not region.may_advertise("queue://Store.store-9.X")


class TestUnconfined:
    @pytest.mark.parametrize("dst", ["queue://Store.other.X", "queue://>", "topic://Any"])
    def test_confine_false_allows_everything(self, dst):
        """confine_children = false turns the scope off."""
        child = TreeScope(["queue://Store.{child}.>"], confine=False).for_child("s1")
        assert child.may_advertise(dst) and child.may_send(dst)

    def test_describe_names_child_and_patterns(self):
        """describe() says who and what, for log lines."""
        text = SCOPE.for_child("store-1", leaf=True).describe()
        assert "store-1" in text and "queue://Store.{child}.>" in text
