"""The two policies and the bridge's structural check, as pure units."""

import pytest

from treefed.federation.bridge import Demand, Interest, malformed
from treefed.federation.mesh import MeshPolicy
from treefed.federation.settings import LinkSettings, TreeSettings
from treefed.federation.site import POLICIES, check_tree_hello
from treefed.federation.tree import TreePolicy
from treefed.wire.frames import Advisory, Hello


def adv(**kw):
    base = dict(kind="add", consumer="X/c/1", dst="queue://Q", origin="X", path=[])
    base.update(kw)
    return Advisory(**base)


class TestPolicyRegistry:
    def test_policies_are_chosen_by_name(self):
        """POLICIES maps the connector kind to its policy class."""
        assert POLICIES == {"mesh": MeshPolicy, "tree": TreePolicy}


class TestMeshPolicy:
    def test_permission_order(self):
        """temp -> excluded -> static -> dynamic -> allowed, each refusal 'filter'."""
        p = MeshPolicy(LinkSettings(excluded=["X.>", "S2"], statically_included=["S", "S2"],
                                    dynamically_included=["D.>"],
                                    bridge_temp_destinations=False))
        assert p.permit("temp-queue://t1") == "filter"
        assert p.permit("queue://X.1") == "filter"
        assert p.permit("queue://S2") == "filter"      # excluded beats static
        assert p.permit("queue://S") is None           # static beats dynamic
        assert p.permit("queue://D.1") is None
        assert p.permit("queue://W") == "filter"       # dynamic includes present, no match
        assert MeshPolicy(LinkSettings()).permit("queue://W") is None

    def test_decreasing_priority_by_hops(self):
        """Path lengths 1,2,3,4 give -5,-8,-9,-10; off, every demand is 0."""
        p = MeshPolicy(LinkSettings(decrease_network_consumer_priority=True))
        assert [p.demand_priority(h) for h in (1, 2, 3, 4)] == [-5, -8, -9, -10]
        assert MeshPolicy(LinkSettings()).demand_priority(3) == 0

    def test_conduit_rules(self):
        """Topics always conduit; queues only for consumers local to the sender."""
        p = MeshPolicy(LinkSettings())
        assert p.conduit("topic://T", 3) and p.conduit("queue://Q", 1)
        assert not p.conduit("queue://Q", 2)
        assert not MeshPolicy(LinkSettings(conduit_subscriptions=False)).conduit("topic://T", 1)
        assert p.conduit_selector({"a = 1": 1}) is None

    def test_duplicate_suppression_by_kind(self):
        """Topic duplicates are suppressed by default, queue duplicates are not."""
        p = MeshPolicy(LinkSettings())
        assert p.suppresses("topic://T") and not p.suppresses("queue://Q")


class TestTreePolicy:
    def test_routes_table(self):
        """Child interest goes up only; parent interest down only; local both ways."""
        assert TreePolicy.ROUTES["child"] == ("parent",)
        assert TreePolicy.ROUTES["parent"] == ("child",)
        assert set(TreePolicy.ROUTES["local"]) == {"parent", "child"}

    def test_conduit_selector_is_the_or_of_members(self):
        """Members' selectors are ORed; any member without a selector means none."""
        p = TreePolicy(LinkSettings(kind="tree"))
        assert p.conduit_selector({"b = 2": 1, "a = 1": 2}) == "(a = 1) OR (b = 2)"
        assert p.conduit_selector({"a = 1": 1}) == "a = 1"
        assert p.conduit_selector({"a = 1": 1, None: 1}) is None

    def test_priority_and_no_ttl(self):
        """Demand priority is -(hops) and tree demand carries no message TTL."""
        p = TreePolicy(LinkSettings(kind="tree"))
        assert [p.demand_priority(h) for h in (1, 2, 3)] == [-1, -2, -3]
        assert p.message_ttl == -1 and not p.suppresses("topic://T")


class TestMalformed:
    @pytest.mark.parametrize("frame", [
        adv(path="AB"), adv(path=[1]), adv(path=[""]), adv(path=["b"] * 65),
        adv(origin=""), adv(consumer=""), adv(dst="queue://bad name"), adv(dst="Q"),
        adv(dst="queue://A.>.B"), adv(kind="change"), adv(selector=5),
    ])
    def test_structural_garbage_is_malformed(self, frame):
        """Bad paths, empty ids, invalid or non-canonical destinations are malformed."""
        assert malformed(frame)

    def test_sane_advisory_passes(self):
        """A well-formed advisory with a wildcard destination is not malformed."""
        assert not malformed(adv(dst="topic://PRICE.>", path=["a", "b"], selector="x > 1"))


class TestDemand:
    def test_reference_counts_follow_members(self):
        """Selector and priority tables count members and forget at zero."""
        d = Demand("d:1", "queue://Q", conduit=True)
        a = Interest("a", "queue://Q", "A", "x = 1", 0, ("A",), None, 1)
        b = Interest("b", "queue://Q", "B", "x = 1", 0, ("B",), None, 2)
        a.demand_priority, b.demand_priority = -1, -3
        d.add(a)
        d.add(b)
        assert d.selectors == {"x = 1": 2} and max(d.priorities) == -1
        d.discard(a)
        assert d.selectors == {"x = 1": 1} and d.priorities == {-3: 1}


def tree_hello(broker_id, node_type, ancestry=(), connector="tree"):
    return Hello(1, "broker", broker_id=broker_id, connector=connector,
                 node_type=node_type, ancestry=list(ancestry))


class TestCheckTreeHello:
    def test_valid_child_and_parent(self):
        """A leaf offered to a root, and a branch parent seen by a leaf, are fine."""
        assert check_tree_hello(None, tree_hello("s1", "leaf"), me="hq", dialed=False) is None
        assert check_tree_hello(TreeSettings("leaf"), tree_hello("r1", "branch", ["hq"]),
                                me="s1", dialed=True) is None

    @pytest.mark.parametrize("settings, hello, dialed, accept, word", [
        (None, tree_hello("r9", "root"), False, True, "second root"),
        (TreeSettings("leaf"), tree_hello("x", "leaf"), False, True, "leaf"),
        (TreeSettings("branch", True), tree_hello("hq", "branch"), False, True, "cycle"),
        (None, tree_hello("x", "leaf"), False, False, "does not accept"),
        (None, tree_hello("x", "leaf", connector="mesh"), False, True, "mesh"),
        (TreeSettings("leaf"), tree_hello("s2", "leaf"), True, True, "leaf"),
        (TreeSettings("branch"), tree_hello("r2", "branch", ["r1", "hq"]), True, True,
         "cycle"),
        (TreeSettings("root"), tree_hello("x", "root"), True, True, "root has no parent"),
    ])
    def test_refusals_say_why(self, settings, hello, dialed, accept, word):
        """Second root, leaf parent, cycles, closed sites and mesh peers are refused."""
        why = check_tree_hello(settings, hello, me="r1", dialed=dialed, ancestry=["hq"],
                               accept_children=accept)
        assert why is not None and word in why
