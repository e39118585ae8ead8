"""Issue 18 part 1: the federation layer's structure -- one routing table, side-effect-free
policies, a pure handshake, no mutable module state, no I/O in the pure packages."""

import ast
import importlib
import pkgutil
from pathlib import Path
from types import MappingProxyType, ModuleType

import pytest

import treefed
from treefed.core.actions import Drop
from treefed.federation import routing
from treefed.federation.handshake import LinkPlan, Refusal, plan_link
from treefed.federation.mesh import MeshPolicy
from treefed.federation.policy import ConnectorPolicy
from treefed.federation.settings import LinkSettings, TreeSettings
from treefed.federation.sharing import Sharing
from treefed.federation.testing import Estate, tree_estate
from treefed.federation.tree import TreePolicy
from treefed.wire.frames import Advisory, Hello

PURE = ("core", "federation", "wire")
#: DESIGN §1: what a pure package never imports (cbor2 is the codec's own business)
FORBIDDEN = {"trio", "socket", "time", "random", "sqlite3", "structlog", "pyspark",
             "threading", "asyncio", "selectors", "subprocess", "os"}
ROOT = Path(treefed.__file__).parent


def modules(package: str) -> list[ModuleType]:
    pkg = importlib.import_module(f"treefed.{package}")
    return [pkg] + [importlib.import_module(m.name)
                    for m in pkgutil.iter_modules(pkg.__path__, f"treefed.{package}.")]


def module_containers(mod: ModuleType) -> dict[str, object]:
    """Module-level values of mutable container types (``__all__`` aside)."""
    return {name: value for name, value in vars(mod).items()
            if isinstance(value, (dict, list, set, bytearray))
            and not name.startswith("__") and not isinstance(value, MappingProxyType)}


class TestPurity:
    @pytest.mark.parametrize("package", PURE)
    def test_pure_packages_import_no_io(self, package):
        """No module of core/, federation/ or wire/ imports an I/O, clock or random module."""
        found = []
        for path in sorted((ROOT / package).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                found += [(path.name, n) for n in names if n.split(".")[0] in FORBIDDEN]
        assert found == []

    def test_federation_holds_no_mutable_module_state(self):
        """federation/ keeps no dict, list or set at module level (tables are read-only)."""
        found = {(m.__name__, name) for m in modules("federation")
                 for name in module_containers(m)}
        assert found == set()

    def test_running_an_estate_changes_no_module_level_table(self):
        """Routing, refusing and delivering in core/federation/wire leave every module-level
        container as it was: state lives in objects the engine owns."""
        before = {(m.__name__, n): repr(v) for p in PURE for m in modules(p)
                  for n, v in module_containers(m).items()}
        e, names = tree_estate([2, 3])
        mesh = Estate()
        for b in ("A", "B", "C"):
            mesh.add(b)
        mesh.link("A", "B", LinkSettings(duplex=True, network_ttl=2))
        mesh.link("B", "C", LinkSettings(duplex=True, network_ttl=2))
        mesh.link("A", "C", LinkSettings(duplex=True, network_ttl=2, name="ac"))
        for est, at, other in ((e, "R1.1", "R2.3"), (mesh, "A", "C")):
            est.subscribe(at, "s", f"queue://Q.{at}", selector="x > 1")
            est.subscribe(other, "t", "topic://T.>")
            est.run_until_quiet()
            est.send(other, f"queue://Q.{at}", headers={"x": 2}, count=3)
            est.send(at, "topic://T.a", count=2)
            est.run_until_quiet()
            est.unsubscribe(at, "s")
            est.run_until_quiet()
        assert len(e.delivered("R1.1")) == 3 and len(mesh.delivered("A")) == 3
        assert mesh.count("advisory.dropped") > 0
        after = {(m.__name__, n): repr(v) for p in PURE for m in modules(p)
                 for n, v in module_containers(m).items()}
        assert after == before


class TestRoutingTable:
    def test_policies_read_the_one_table(self):
        """Each policy's ROUTES is its half of routing.ROUTES, and read-only."""
        assert MeshPolicy.ROUTES is routing.ROUTES["mesh"]
        assert TreePolicy.ROUTES is routing.ROUTES["tree"]
        with pytest.raises(TypeError):
            TreePolicy.ROUTES["child"] = ("child",)

    def test_merged_table_is_both_halves(self):
        """A Site with links of both kinds offers interest to the lanes of both halves."""
        for src in routing.SOURCES:
            assert routing.lanes_for(src) == routing.ROUTES["mesh"][src] + \
                routing.ROUTES["tree"][src]
            assert routing.DOWN not in routing.lanes_for(src, down=False)

    def test_siblings_are_never_offered_a_childs_interest(self):
        """Tree interest from a child goes up only; from the parent down only."""
        assert routing.ROUTES["tree"]["child"] == ("parent",)
        assert routing.ROUTES["tree"]["parent"] == ("child",)

    def test_policies_follow_the_protocol(self):
        """Both policies implement ConnectorPolicy (claims included)."""
        for cls in (MeshPolicy, TreePolicy):
            assert isinstance(cls(LinkSettings(kind=cls.kind)), ConnectorPolicy)


class TestSideEffectFreeAccept:
    def test_tree_accept_claims_nothing(self):
        """TreePolicy.accept only answers: the subtree stays unclaimed until the Bridge
        applies ``claims`` (before issue 18 accept claimed at once)."""
        e, _ = tree_estate([1, 1])
        hq = e.sites["HQ"]
        bridge = hq.bridge(e.conn_to("HQ", "R1"))
        new = Advisory("add", "R1.1/c/x", "queue://Q", "R1.1", path=["R1.1"])
        assert bridge.owned == {"R1"}
        assert bridge.policy.accept(bridge, new) is None
        assert bridge.owned == {"R1"} and hq.subtree_owner("R1.1") is None
        assert list(bridge.policy.claims(bridge, new)) == ["R1.1"]

    def test_an_advisory_refused_for_limit_leaves_no_claim(self):
        """A child's advisory refused 'limit' does not grow that child's subtree."""
        e = Estate()
        e.add("HQ")
        e.add("R", tree=TreeSettings("branch"))
        e.add("S1", tree=TreeSettings("leaf"))
        e.add("S2", tree=TreeSettings("leaf"))
        e.link("R", "HQ", LinkSettings(kind="tree", name="tree", node_type="branch"),
               accept=LinkSettings(kind="tree", name="tree", max_demand_per_link=1))
        e.tree_link("S1", "R")
        e.tree_link("S2", "R")
        e.subscribe("S1", "a", "queue://S1.In")
        e.subscribe("S2", "b", "queue://S2.In")
        e.run_until_quiet()
        assert e.count("advisory.dropped", broker="HQ", reason="limit") == 1
        owned = e.sites["HQ"].bridge(e.conn_to("HQ", "R")).owned
        assert "S1" in owned and "S2" not in owned


class TestHandshake:
    ME = "R"

    def hello(self, broker_id="S", **kw):
        kw.setdefault("connector", "tree")
        kw.setdefault("node_type", "leaf")
        return Hello(1, "broker", broker_id=broker_id, name=broker_id, **kw)

    def plan(self, hello, **kw):
        kw.setdefault("tree", TreeSettings("branch"))
        kw.setdefault("dialed", False)
        return plan_link(LinkSettings(kind="tree", name="tree"), hello, me=self.ME, **kw)

    def test_child_plan(self):
        """An acceptable child: lane child, both directions, its role."""
        plan = self.plan(self.hello())
        assert type(plan) is LinkPlan
        assert (plan.lane, plan.forwards, plan.accepts, plan.advertises, plan.peer_role) \
            == ("child", True, True, True, "leaf")

    def test_second_link_for_a_linked_child_is_refused(self):
        """A child id already linked below us is refused, not taken over."""
        plan = self.plan(self.hello("S"), children=("S",))
        assert type(plan) is Refusal and "already linked" in plan.why

    def test_parent_needs_a_branch_or_root(self):
        """Dialing a leaf as a parent is refused; a dialer without TreeSettings adopts
        its connector's node type."""
        why = plan_link(LinkSettings(kind="tree", name="t", node_type="leaf"),
                        self.hello("P", node_type="leaf"), me="S", dialed=True, tree=None)
        assert type(why) is Refusal and "not a branch or root" in why.why
        ok = plan_link(LinkSettings(kind="tree", name="t", node_type="branch"),
                       self.hello("P", node_type="root"), me="S", dialed=True, tree=None)
        assert type(ok) is LinkPlan and ok.lane == "parent" and ok.tree.node_type == "branch"

    def test_mesh_direction_flags(self):
        """Mesh: the dialer forwards and accepts, the acceptor advertises; duplex both."""
        hello = Hello(1, "broker", broker_id="B", name="B", connector="mesh")
        dialer = plan_link(LinkSettings(), hello, me="A", dialed=True, tree=None)
        assert (dialer.forwards, dialer.accepts, dialer.advertises) == (True, True, False)
        acceptor = plan_link(LinkSettings(), hello, me="A", dialed=False, tree=None)
        assert (acceptor.forwards, acceptor.accepts, acceptor.advertises) == \
            (False, False, True)


class TestDropAction:
    def test_refusals_are_drop_actions_rendered_once(self):
        """A refused advisory is one Drop action; its log() is the advisory.dropped line."""
        e = Estate()
        for b in ("A", "B"):
            e.add(b)
        e.link("A", "B", LinkSettings(duplex=True))
        conn = e.conn_to("A", "B")
        out = e.sites["A"].handle_frame(conn, Advisory("add", "A/c/1", "queue://Q", "A"),
                                        e.now)
        [drop] = [a for a in out if type(a) is Drop]
        assert drop.reason == "loop" and drop.link == "link" and drop.peer == "B"
        line = drop.log()
        assert line.event == "advisory.dropped"
        assert line.fields == {"link": "link", "peer": "B", "consumer": "A/c/1",
                               "dst": "queue://Q", "origin": "A", "kind": "add",
                               "reason": "loop"}


class TestSharing:
    def test_sites_of_one_estate_share_tables(self):
        """An engine hands one Sharing to its Sites: one path object across sites."""
        e, _ = tree_estate([2, 2])
        assert e.sites["R1"].sharing is e.sites["HQ"].sharing is e.sharing
        e.subscribe("R1.1", "s", "queue://Q")
        e.run_until_quiet()
        keys = [next(iter(s.bridge(c).remote)) for s, c in (
            (e.sites["R1"], e.conn_to("R1", "R1.1")),)]
        assert keys[0] is e.sharing.key(*keys[0])

    def test_a_site_alone_gets_its_own(self):
        """A Site made without one has a private Sharing (a broker process)."""
        from treefed.core.broker import Broker
        from treefed.federation.site import Site

        a, b = Site("A", broker=Broker("A")), Site("B", broker=Broker("B"))
        assert isinstance(a.sharing, Sharing) and a.sharing is not b.sharing
