"""Tests for treefed.security.authz: grants per user/group, wildcards, {user}, cache."""

from __future__ import annotations

import pytest

from treefed.security.authz import DENIED, Authorizer, Rule, denied

RULES = [
    Rule("group:stores", "read", "queue://Store.{user}.>"),
    Rule("group:stores", "write", "queue://HQ.>"),
    Rule("group:stores", "write", "queue://Store.{user}.>"),
    Rule("*", "read", "topic://Broadcast.>"),
    Rule("hq", "read", "queue://>"),
    Rule("hq", "write", ">"),
    Rule("hq", "admin", ">"),
    Rule("auditor", "admin", "queue://Audit.>"),
]
GROUPS = {"store-1": ["stores"], "store-2": ["stores"], "hq": ["staff"]}


@pytest.fixture
def authz() -> Authorizer:
    return Authorizer(RULES, GROUPS)


class TestCheck:
    def test_group_rule_with_user_placeholder(self, authz):
        """A store reads its own queues, not another store's."""
        assert authz.check("store-1", "read", "queue://Store.store-1.Orders")
        assert not authz.check("store-1", "read", "queue://Store.store-2.Orders")
        assert authz.check("store-2", "read", "queue://Store.store-2.Orders")

    def test_wildcard_subscription_must_be_covered_whole(self, authz):
        """A subscription that would include other stores' queues is refused."""
        assert authz.check("store-1", "read", "queue://Store.store-1.>")
        assert not authz.check("store-1", "read", "queue://Store.>")
        assert not authz.check("store-1", "read", "queue://Store.*.Orders")
        assert not authz.check("store-1", "read", "queue://>")

    def test_permissions_are_separate(self, authz):
        """Write on HQ queues does not grant reading them; read does not grant write."""
        assert authz.check("store-1", "write", "queue://HQ.Sales")
        assert not authz.check("store-1", "read", "queue://HQ.Sales")
        assert not authz.check("store-1", "write", "topic://Broadcast.Prices")

    def test_everyone_principal(self, authz):
        """'*' grants every authenticated user, including one in no group."""
        assert authz.check("stranger", "read", "topic://Broadcast.Prices")
        assert not authz.check("stranger", "read", "queue://Store.stranger.x")

    def test_any_destination_pattern(self, authz):
        """The bare '>' grants every kind; 'queue://>' only queues."""
        assert authz.check("hq", "write", "topic://Anything.Here")
        assert authz.check("hq", "read", "queue://Store.store-2.Orders")
        assert not authz.check("hq", "read", "topic://Secret")

    def test_unauthenticated_is_refused(self, authz):
        """user None (not authenticated) gets nothing, not even '*' grants."""
        assert not authz.check(None, "read", "topic://Broadcast.Prices")

    def test_temp_destinations_open_to_authenticated_users(self):
        """Reply queues are open to read/write unless disabled; never admin."""
        open_ = Authorizer(RULES, GROUPS)
        assert open_.check("store-1", "write", "temp-queue://c1-7")
        assert open_.check("store-1", "read", "temp-topic://c1-8")
        assert not open_.check("store-1", "admin", "temp-queue://c1-7")
        closed = Authorizer(RULES, GROUPS, temp_destinations=False)
        assert not closed.check("store-1", "write", "temp-queue://c1-7")

    def test_no_rules_refuse_everything(self):
        """Rules only grant: with none, everything is refused."""
        assert not Authorizer([]).check("alice", "read", "queue://A")


class TestAdmin:
    def test_is_admin_needs_admin_on_everything(self, authz):
        """is_admin (stat) needs admin on '>'; admin on a subtree is not enough."""
        assert authz.is_admin("hq")
        assert not authz.is_admin("auditor")
        assert authz.check("auditor", "admin", "queue://Audit.Log")
        assert not authz.is_admin("store-1") and not authz.is_admin(None)


class TestCache:
    def test_repeated_checks_hit_the_cache(self, authz):
        """The second check of one (user, permission, dst) is a cache hit, same answer."""
        first = authz.check("store-1", "read", "queue://Store.store-1.A")
        second = authz.check("store-1", "read", "queue://Store.store-1.A")
        assert first == second is True
        assert authz.statistics() == {"cached": 1, "hits": 1, "misses": 1}

    def test_cache_is_bounded(self):
        """Beyond cache_size the cache starts over; answers stay right."""
        authz = Authorizer(RULES, GROUPS, cache_size=10)
        for i in range(25):
            assert authz.check("store-1", "read", f"queue://Store.store-1.Q{i}")
            assert not authz.check("store-1", "read", f"queue://Store.store-2.Q{i}")
        assert authz.statistics()["cached"] <= 10


class TestRule:
    def test_unknown_permission_is_refused(self):
        """A rule's permission must be read, write or admin."""
        with pytest.raises(ValueError):
            Rule("alice", "delete", "queue://A")

    def test_denied_error_names_destination(self):
        """The refusal frame carries code not_authorized and the destination."""
        frame = denied("read", "queue://Store.s2.Orders", ref="sub-1")
        assert frame.code == DENIED and frame.ref == "sub-1"
        assert "queue://Store.s2.Orders" in frame.message and "read" in frame.message
