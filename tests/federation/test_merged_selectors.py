"""Issue 12 defect 5: a tree conduit keeps its members' selectors compiled once each
("any of"); a change costs one member, and the 4,096-character limit applies to one
user's selector, never to the merge."""

import pytest

from treefed.core.selector import MAX_SELECTOR_LENGTH
from treefed.federation.merged import MergedSelector
from treefed.federation.settings import TreeSettings
from treefed.federation.testing import Estate
from treefed.wire.frames import Error

Q = "queue://Store.S.Orders"


def chain() -> Estate:
    """HQ <- R <- S, tree connectors."""
    e = Estate()
    e.add("HQ")
    e.add("R", tree=TreeSettings("branch"))
    e.add("S", tree=TreeSettings("leaf"))
    assert e.tree_link("R", "HQ") and e.tree_link("S", "R")
    return e


def selector(i: int) -> str:
    return f"region = 'north-east-{i:04d}' AND amount > {i}"   # ~45 characters


def core_consumer(e: Estate, site: str, peer: str):
    """The core consumer object of ``site``'s conduit toward ``peer`` for Q."""
    bridge = e.sites[site].bridge(e.conn_to(site, peer))
    demand = bridge.conduits[Q]
    conn = e.sites[site].broker._conns[bridge.conn]
    return demand, conn.consumers[demand.sub]


class TestMergedSelector:
    def test_any_member_matches(self):
        """matches() is true when one member matches (the SQL OR of the members)."""
        m = MergedSelector()
        assert m.add("a = 1") and m.add("b = 2") and not m.add("a = 1")
        assert m.matches({"a": 1}) and m.matches({"b": 2}) and not m.matches({"a": 2})
        assert m.text == "(a = 1) OR (b = 2)"
        m.discard("a = 1")
        assert m.matches({"a": 1})           # one member with that text is left
        m.discard("a = 1")
        assert not m.matches({"a": 1}) and m.text == "b = 2" and len(m) == 1

    def test_unknown_is_not_a_match(self):
        """A member whose result is UNKNOWN (missing header) does not match."""
        m = MergedSelector()
        m.add("x > 1")
        assert not m.matches({})


class TestTreeConduit:
    def test_hundreds_of_selectors_past_the_old_merged_limit(self):
        """200 consumers with distinct ~45-character selectors (9,000 characters merged)
        are all accepted up the tree, and each gets exactly its own messages."""
        e = chain()
        n = 200
        for i in range(n):
            e.subscribe("S", f"s{i}", Q, selector=selector(i))
        e.run_until_quiet()
        assert sum(len(selector(i)) + 6 for i in range(n)) > MAX_SELECTOR_LENGTH
        assert e.count("advisory.dropped") == 0
        ids = {}
        for i in (0, 99, 150, n - 1):
            [ids[i]] = e.send("HQ", Q, headers={"region": f"north-east-{i:04d}",
                                                  "amount": i + 1})
        e.run_until_quiet()
        got = {f.sub: f.msg for f in e.inbox[("S", "c")]}
        assert got == {f"s{i}": ids[i] for i in ids}

    def test_a_member_change_keeps_the_core_consumer(self):
        """Adding or removing a member with a selector changes the conduit in place: no
        core consumer is re-created (a change is O(that member), not O(all))."""
        e = chain()
        e.subscribe("S", "a", Q, selector="x = 1")
        e.run_until_quiet()
        demand, before = core_consumer(e, "R", "S")
        for i in range(2, 50):
            e.subscribe("S", f"s{i}", Q, selector=f"x = {i}")
        e.unsubscribe("S", "s7")
        e.run_until_quiet()
        demand_after, after = core_consumer(e, "R", "S")
        assert demand_after is demand and after is before
        assert after.selector is demand.merged and len(demand.merged) == 48

    def test_widening_offers_waiting_messages(self):
        """A queue message waiting at the root because no member selected it is
        forwarded as soon as a new member's selector matches it."""
        e = chain()
        e.subscribe("S", "a", Q, selector="x = 1")
        e.run_until_quiet()
        [mid] = e.send("HQ", Q, headers={"x": 2})
        e.run_until_quiet()
        assert e.delivered("S") == [] and e.held("HQ", Q) == 1
        e.subscribe("S", "b", Q, selector="x = 2")
        e.run_until_quiet()
        assert e.delivered("S", sub="b") == [mid]

    def test_narrowing_stops_forwarding(self):
        """When the only member selecting a message leaves, the conduit stops taking it."""
        e = chain()
        e.subscribe("S", "a", Q, selector="x = 1")
        e.subscribe("S", "b", Q, selector="x = 2")
        e.run_until_quiet()
        e.unsubscribe("S", "b")
        e.run_until_quiet()
        e.send("HQ", Q, headers={"x": 2})
        e.run_until_quiet()
        assert e.delivered("S") == [] and e.held("HQ", Q) == 1

    def test_a_member_without_selector_takes_everything(self):
        """A member with no selector makes the conduit take every message; when it
        leaves, the others' selectors apply again."""
        e = chain()
        e.subscribe("S", "a", Q, selector="x = 1")
        e.subscribe("S", "all", Q)
        e.run_until_quiet()
        e.send("HQ", Q, headers={"x": 5})
        e.run_until_quiet()
        assert len(e.delivered("S", sub="all")) == 1
        e.unsubscribe("S", "all")
        e.run_until_quiet()
        e.send("HQ", Q, headers={"x": 5})
        e.run_until_quiet()
        assert e.held("HQ", Q) == 1

    def test_the_length_limit_applies_to_one_users_selector(self):
        """A single selector over the limit is refused where the user subscribes."""
        e = chain()
        long = " OR ".join(f"x = {i}" for i in range(1000))
        assert len(long) > MAX_SELECTOR_LENGTH
        e.subscribe("S", "big", Q, selector=long)
        e.run_until_quiet()
        errors = [f for f in e.client_frames.get(("S", "c"), []) if type(f) is Error]
        assert errors and "longer than" in errors[0].message
        assert e.count("advisory.sent") == 0
