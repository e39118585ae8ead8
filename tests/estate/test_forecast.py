"""treefed forecast: an estate as configured and as the tree, with the guide's and
ActiveMQ 5.17's numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.estate.amq import hub_and_spoke
from tests.estate.test_activemq import cli, guide_broker, write
from treefed.config import load_config
from treefed.estate.activemq import import_files, write_import
from treefed.estate.forecast import forecast, load_estate, load_workload
from treefed.estate.topology import NotATree, infer_tree

FOO = "queue://TEST.FOO"


def imported(tmp_path: Path, brokers: dict[str, tuple[int, str]]) -> Path:
    """Write one guide-style activemq.xml per broker, import them; the config folder."""
    files = [write(tmp_path, f"{name}.xml", guide_broker(name, port, conns))
             for name, (port, conns) in brokers.items()]
    out = tmp_path / "configs"
    write_import(import_files(files), out)
    return out


def connector(to_port: int, name: str = "link", **attrs: str) -> str:
    extra = " ".join(f'{k}="{v}"' for k, v in attrs.items())
    return (f'<networkConnector name="{name}" uri="static:(tcp://localhost:{to_port})" '
            f'{extra}>{attrs.pop("_children", "")}</networkConnector>')


def workload(tmp_path: Path, text: str) -> Path:
    return write(tmp_path, "workload.toml", text)


class TestGuideNumbers:
    def split(self, tmp_path, conduit):
        folder = imported(tmp_path, {
            "A": (61001, connector(61002, networkTTL="3",
                                   conduitSubscriptions=str(conduit).lower())),
            "B": (61002, "")})
        est = load_estate([folder])
        w = load_workload(workload(tmp_path, f"""
[[consumer]]
broker = "A"
dst = "{FOO}"
name = "C1"
[[consumer]]
broker = "B"
dst = "{FOO}"
name = "C2"
[[consumer]]
broker = "B"
dst = "{FOO}"
name = "C3"
[[send]]
broker = "A"
dst = "{FOO}"
count = 12
"""), est.configs)
        d = forecast(est, w)["current"]["deliveries"]
        return d["A/C1"], d["B/C2"], d["B/C3"]

    def test_conduit_on_splits_6_3_3(self, tmp_path):
        """Imported A -> B with conduit subscriptions: C1 6, C2 3, C3 3 (the guide)."""
        assert self.split(tmp_path, True) == (6, 3, 3)

    def test_conduit_off_splits_4_4_4(self, tmp_path):
        """conduitSubscriptions="false": 4, 4, 4 (the guide)."""
        assert self.split(tmp_path, False) == (4, 4, 4)

    def test_static_propagation_ends_five_and_five(self, tmp_path):
        """Static TEST.FOO on A -> B -> C -> {D, E}: 10 messages end 5 at D and 5 at E."""
        static = "<staticallyIncludedDestinations><queue physicalName=\"TEST.FOO\"/>" \
                 "</staticallyIncludedDestinations>"

        def conn(port, name="link"):
            return (f'<networkConnector name="{name}" uri="static:(tcp://localhost:{port})" '
                    f'networkTTL="3">{static}</networkConnector>')

        folder = imported(tmp_path, {"A": (61001, conn(61002)), "B": (61002, conn(61003)),
                                     "C": (61003, conn(61004, "toD") + conn(61005, "toE")),
                                     "D": (61004, ""), "E": (61005, "")})
        est = load_estate([folder])
        w = load_workload(workload(tmp_path, f'[[send]]\nbroker = "A"\ndst = "{FOO}"\n'
                                             "count = 10\n"), est.configs)
        result = forecast(est, w)
        assert result["current"]["held"] == {"D": 5, "E": 5}
        (route,) = result["current"]["stranded_routes"]
        assert route["messages"] == 10 and route["example"]["path"][:3] == ["A", "B", "C"]
        assert route["example"]["waits_at"] in ("D", "E")


    @pytest.mark.parametrize("conduit, delivered, stranded", [(True, 6, 6), (False, 12, 0)])
    def test_conduit_and_selectors(self, tmp_path, conduit, delivered, stranded):
        """A -> B, A -> C; selectors region = 'us' at B, 'emea' at C: conduits drop the
        selectors and half the messages strand; without conduits all 12 arrive."""
        c = str(conduit).lower()
        folder = imported(tmp_path, {
            "A": (61001, connector(61002, "toB", conduitSubscriptions=c)
                  + connector(61003, "toC", conduitSubscriptions=c)),
            "B": (61002, ""), "C": (61003, "")})
        est = load_estate([folder])
        w = load_workload(workload(tmp_path, f"""
[[consumer]]
broker = "B"
dst = "{FOO}"
selector = "region = 'us'"
[[consumer]]
broker = "C"
dst = "{FOO}"
selector = "region = 'emea'"
[[send]]
broker = "A"
dst = "{FOO}"
count = 6
headers = {{region = "us"}}
[[send]]
broker = "A"
dst = "{FOO}"
count = 6
headers = {{region = "emea"}}
"""), est.configs)
        result = forecast(est, w)["current"]
        assert result["messages"]["delivered"] == delivered
        assert result["messages"]["stranded"] == stranded
        assert sum(result["held"].get(b, 0) for b in "BC") == stranded


STORE1 = "queue://Store.store-1-0001.Incoming"


def retail_forecast(tmp_path: Path, ttl: int, stores: int = 5):
    files = hub_and_spoke(tmp_path / f"xml{ttl}", regions=1, stores=stores, ttl=ttl)
    out = tmp_path / f"configs{ttl}"
    write_import(import_files(files), out)
    est = load_estate([out])
    w = load_workload(workload(tmp_path, f"""
[[consumer]]
broker = "store-1-0001"
dst = "{STORE1}"
[[send]]
broker = "hq"
dst = "{STORE1}"
[[send]]
broker = "store-1-0002"
dst = "{STORE1}"
"""), est.configs)
    return forecast(est, w)


def demand_at(run):
    return {b for b, v in run["per_broker"].items() if v["demand"]}


class TestRetailTable:
    """HQ <- region <- N stores, duplex: ActiveMQ 5.17's demand placement (README)."""

    SIBLINGS = {f"store-1-{s:04d}" for s in range(2, 6)}

    def test_ttl1_region_only_and_both_routes_stranded(self, tmp_path):
        """TTL 1: demand at the region only; HQ->store1 and store2->store1 stranded;
        the tree: region and HQ, both delivered."""
        r = retail_forecast(tmp_path, 1)
        assert demand_at(r["current"]) == {"region-1"}
        routes = {(s["from"], s["example"]["waits_at"]) for s in
                  r["current"]["stranded_routes"]}
        assert routes == {("hq", "hq"), ("store-1-0002", "store-1-0002")}
        assert demand_at(r["proposed_tree"]) == {"region-1", "hq"}
        assert r["proposed_tree"]["messages"] == {"sent": 2, "delivered": 2, "stranded": 0}

    @pytest.mark.parametrize("ttl", [2, 3])
    def test_ttl2_and_3_spill_to_hq_and_every_sibling(self, tmp_path, ttl):
        """TTL 2 and 3: region + HQ + every sibling store hold demand; both delivered."""
        r = retail_forecast(tmp_path, ttl)
        assert demand_at(r["current"]) == {"region-1", "hq"} | self.SIBLINGS
        assert r["current"]["messages"]["stranded"] == 0
        spilled = {b for b, v in r["current"]["per_broker"].items() if v["spilled"]}
        assert spilled == self.SIBLINGS - {"store-1-0002"}   # store2 produced to it
        assert r["proposed_tree"]["totals"]["spilled"] == 0
        assert r["current"]["per_tier"]["leaf"]["demand"] == 4
        assert r["proposed_tree"]["per_tier"].get("leaf", {}).get("demand", 0) == 0


class TestTree:
    def test_store_linked_to_two_regions_is_refused(self, tmp_path):
        """A store dialing two regions is no tree: the reason names it and both regions,
        and --emit-tree exits 1."""
        files = hub_and_spoke(tmp_path / "xml", regions=2, stores=1)
        text = files[2].read_text().replace(
            "</networkConnectors>",
            '<networkConnector name="backup" uri="static:(tcp://region-2.shop.example:61616)"/>'
            "</networkConnectors>")
        files[2].write_text(text)
        out = tmp_path / "configs"
        write_import(import_files(files), out)
        est = load_estate([out])
        with pytest.raises(NotATree) as info:
            infer_tree(est.configs, est.links)
        (reason,) = info.value.reasons
        assert reason.startswith("store-1-0001 is linked to region-") and "cycle" in reason
        assert "region-1" in reason and "region-2" in reason
        result = forecast(est)
        assert result["proposed_tree"] is None and result["tree"]["refused"] == [reason]
        done = cli("forecast", str(out), "--out", str(tmp_path / "f"),
                   "--emit-tree", str(tmp_path / "t"))
        assert done.returncode == 1 and "store-1-0001 is linked to" in done.stderr
        assert "No tree proposed" in (tmp_path / "f" / "forecast.md").read_text()

    def test_emitted_tree_validates_and_forecasts_as_a_tree(self, tmp_path):
        """--emit-tree writes tree configs (leaf/branch/root by position) that load, link
        up the same way and forecast with nothing stranded."""
        files = hub_and_spoke(tmp_path / "xml", regions=2, stores=2, ttl=1)
        files[-1].write_text(files[-1].read_text().replace(
            'duplex="true"', 'duplex="true" userName="store-2-0002" password="s3cret"'))
        out = tmp_path / "configs"
        write_import(import_files(files), out)
        done = cli("forecast", str(out), "--out", str(tmp_path / "f"),
                   "--emit-tree", str(tmp_path / "t"))
        assert done.returncode == 0, done.stderr
        store = load_config(tmp_path / "t" / "store-2-0002.toml")
        assert store.network_connectors == () and store.tree_connector.node_type == "leaf"
        assert store.tree_connector.uri == "tcp://region-2.shop.example:61616"
        assert (store.tree_connector.username, store.tree_connector.password) == \
            ("store-2-0002", "s3cret")
        region = load_config(tmp_path / "t" / "region-1.toml")
        assert region.tree_connector.node_type == "branch"
        assert region.broker.accept_tree_children
        assert load_config(tmp_path / "t" / "hq.toml").tree_connector is None
        again = forecast(load_estate([tmp_path / "t"]))
        assert again["estate"]["mode"] == "tree" and again["estate"]["unresolved"] == []
        assert again["current"]["messages"]["stranded"] == 0
        assert again["current"]["totals"] == again["proposed_tree"]["totals"]
        report = json.loads((tmp_path / "f" / "forecast.json").read_text())
        assert report["current"]["messages"]["stranded"] == \
            len([s for s in report["current"]["stranded_routes"]]) and \
            report["proposed_tree"]["messages"]["stranded"] == 0
        md = (tmp_path / "f" / "forecast.md").read_text()
        assert "| spilled advisories |" in md and "## Stranded routes: current (mesh)" in md
