"""Tests for treefed.scenario.spec: shipped scenarios, validation, modes, timeline."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from treefed.errors import ConfigError
from treefed.scenario.spec import (
    ACTIONS, Mode, Scenario, expand_destination, load_scenario, parse_scenario,
)

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"

BASE = {
    "name": "t",
    "seed": 1,
    "topology": {"regions": 2, "stores_per_region": 3},
    "mode": [{"connector": "tree"}, {"connector": "mesh", "network_ttl": 2, "duplex": True}],
    "workload": {"hq_consumers": ["queue://HQ.Incoming"],
                 "region_consumers": ["queue://Region.{region}.Incoming"],
                 "store_to_store": 4},
}


def doc(**changes: object) -> dict:
    """BASE with top-level keys replaced; a value of None removes the key."""
    out = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def timeline(*events: dict) -> dict:
    return doc(timeline=[{"at": float(i), **e} for i, e in enumerate(events)])


def error(data: dict) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_scenario(data)
    return info.value


class TestShippedScenarios:
    @pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.toml")), ids=lambda p: p.stem)
    def test_loads(self, path: Path) -> None:
        """Every shipped scenario loads, its name matching its file name."""
        scenario = load_scenario(path)
        assert scenario.name == path.stem and scenario.source_path == str(path)
        assert scenario.modes and scenario.modes[0].label == "tree"

    def test_the_expected_set_is_shipped(self) -> None:
        """The six scenarios the design calls for are present."""
        assert {p.stem for p in SCENARIOS.glob("*.toml")} >= {
            "retail-small", "retail-4x250", "retail-4x1000", "deep", "reconfigure", "churn"}

    def test_retail_small(self) -> None:
        """retail-small: HQ, 2 regions, 5 stores each; tree, mesh-ttl1, mesh-ttl2."""
        scenario = load_scenario(SCENARIOS / "retail-small.toml")
        assert len(scenario.build_topology()) == 13
        assert [m.label for m in scenario.modes] == ["tree", "mesh-ttl1", "mesh-ttl2"]
        assert scenario.mode("mesh-ttl2").options == {"network_ttl": 2, "duplex": True}

    @pytest.mark.parametrize("name,brokers", [("retail-4x250", 1005), ("retail-4x1000", 4005)])
    def test_retail_large(self, name: str, brokers: int) -> None:
        """The 4 x N estates run tree and mesh TTL 1..3."""
        scenario = load_scenario(SCENARIOS / f"{name}.toml")
        assert len(scenario.build_topology()) == brokers
        assert [m.label for m in scenario.modes] == ["tree", "mesh-ttl1", "mesh-ttl2",
                                                     "mesh-ttl3"]

    def test_deep_puts_stores_three_hops_below_hq(self) -> None:
        """deep: 4 countries x 4 regions x 60 stores, so TTL 2 cannot reach HQ."""
        topo = load_scenario(SCENARIOS / "deep.toml").build_topology()
        assert len(topo.of_kind("store")) == 960 and len(topo.of_kind("region")) == 16
        assert topo.depth == 3

    def test_reconfigure_inserts_a_layer(self) -> None:
        """reconfigure: depth 2 at the start, an insert_layer event makes it 3."""
        scenario = load_scenario(SCENARIOS / "reconfigure.toml")
        topo = scenario.build_topology()
        assert topo.depth == 2
        (insert,) = [e for e in scenario.timeline if e.action == "insert_layer"]
        assert topo.insert_layer(insert.name, insert.count, parent=insert.target).depth == 3

    def test_churn_exercises_every_kind_of_churn(self) -> None:
        """churn: consumers, links and a broker all come and go."""
        actions = {e.action for e in load_scenario(SCENARIOS / "churn.toml").timeline}
        assert actions >= {"add_consumer", "remove_consumer", "cut_link", "restore_link",
                           "kill_broker", "restart_broker", "send"}


class TestModes:
    @pytest.mark.parametrize("mode,label", [
        ({"connector": "tree"}, "tree"),
        ({"connector": "tree", "route_unknown_up": False}, "tree"),
        ({"connector": "mesh"}, "mesh-ttl1"),
        ({"connector": "mesh", "network_ttl": 3}, "mesh-ttl3"),
        ({"connector": "mesh", "network_ttl": -1}, "mesh-ttlinf"),
        ({"connector": "mesh", "network_ttl": 2, "label": "wide"}, "wide"),
    ])
    def test_label_derivation(self, mode: dict, label: str) -> None:
        """Labels come from the connector and network_ttl unless given."""
        (parsed,) = parse_scenario(doc(mode=[mode])).modes
        assert parsed.label == label
        assert parsed.connector == mode["connector"]

    def test_options_hold_only_what_was_given(self) -> None:
        """Mode.options keeps the validated options from the file, nothing defaulted."""
        modes = parse_scenario(BASE).modes
        assert modes == (Mode("tree", "tree", {}),
                         Mode("mesh-ttl2", "mesh", {"network_ttl": 2, "duplex": True}))

    def test_duplicate_label(self) -> None:
        """Two modes deriving the same label are refused, pointing at the second."""
        exc = error(doc(mode=[{"connector": "mesh"}, {"connector": "mesh", "duplex": True}]))
        assert exc.key == "mode[1].label" and "mesh-ttl1" in exc.problem

    @pytest.mark.parametrize("mode,key,problem", [
        ({"connector": "mesh", "network_tll": 2}, "mode[0].network_tll",
         'did you mean "network_ttl"'),
        ({"connector": "mesh", "network_ttl": "2"}, "mode[0].network_ttl", "integer"),
        ({"connector": "mesh", "uri": "static:(tcp://h:1)"}, "mode[0].uri", "unknown key"),
        ({"connector": "tree", "duplex": True}, "mode[0].duplex", "unknown key"),
        ({"connector": "ring"}, "mode[0].connector", '"tree", "mesh"'),
        ({"network_ttl": 1}, "mode[0].connector", "required"),
        ({"connector": "tree", "label": "a b"}, "mode[0].label", "letters"),
    ])
    def test_bad_mode(self, mode: dict, key: str, problem: str) -> None:
        """Mode options are checked like a broker config's connector options."""
        exc = error(doc(mode=[mode]))
        assert exc.key == key and problem in exc.problem

    def test_modes_required(self) -> None:
        """A scenario with no [[mode]] is refused."""
        assert error(doc(mode=None)).key == "mode"
        assert error(doc(mode=[])).key == "mode"


class TestValidation:
    @pytest.mark.parametrize("data,key,problem", [
        (doc(nmae="x"), "nmae", 'did you mean "name"'),
        (doc(name=None), "name", "required"),
        (doc(name="has space"), "name", "letters"),
        (doc(seed=-1), "seed", ">= 0"),
        (doc(topology=None), "topology", "required"),
        (doc(topology={"regions": 2}), "topology.stores_per_region", "required"),
        (doc(topology={"regions": 0, "stores_per_region": 1}), "topology.regions", ">= 1"),
        (doc(topology={"regions": 1, "stores_per_region": 1, "layers": [{"name": "country"}]}),
         "topology.layers[0].count", "required"),
        (doc(topology={"regions": 1, "stores_per_region": 1,
                       "layers": [{"name": "Country", "count": 2}]}),
         "topology.layers[0].name", "lowercase"),
        (doc(topology={"regions": 1, "stores_per_region": 1,
                       "layers": [{"name": "c", "count": 2}, {"name": "c", "count": 2}]}),
         "topology.layers[1].name", "duplicate"),
        (doc(topology={"regions": 1000, "stores_per_region": 1000}), "topology", "more than"),
        (doc(workload={"hq_to_stores": -1}), "workload.hq_to_stores", ">= 0"),
        (doc(workload={"store_queue_consumer": True}), "workload.store_queue_consumer",
         'did you mean "store_queue_consumers"'),
        (doc(workload={"region_consumers": ["queue://R.{regoin}"]}),
         "workload.region_consumers[0]", "unknown placeholder {regoin}"),
        (doc(workload={"hq_consumers": ["queue://HQ.{region}"]}), "workload.hq_consumers[0]",
         "unknown placeholder {region}"),
        (doc(workload={"hq_consumers": ["queue://A..B"]}), "workload.hq_consumers[0]",
         "invalid destination"),
        (doc(topology={"regions": 1, "stores_per_region": 1}),
         "workload.store_to_store", "two stores"),
    ])
    def test_bad_value_names_the_key(self, data: dict, key: str, problem: str) -> None:
        """Each kind of bad key or value raises ConfigError with the dotted key at fault."""
        exc = error(data)
        assert exc.key == key
        assert problem in exc.problem

    def test_load_reports_bad_toml(self, tmp_path: Path) -> None:
        """A syntax error in the file is a ConfigError."""
        path = tmp_path / "s.toml"
        path.write_text("name = \n")
        with pytest.raises(ConfigError, match="invalid TOML"):
            load_scenario(path)

    def test_defaults(self) -> None:
        """Workload, timeline, seed and description have defaults."""
        scenario = parse_scenario({"name": "x", "topology": {"regions": 1,
                                                             "stores_per_region": 1},
                                   "mode": [{"connector": "tree"}]})
        assert isinstance(scenario, Scenario)
        assert scenario.seed == 0 and scenario.timeline == () and scenario.description == ""
        assert scenario.workload.store_queue_consumers is True
        assert scenario.workload.hq_to_stores == 0


class TestTimeline:
    def test_every_action_parses(self) -> None:
        """A timeline using every action in a sensible order is accepted."""
        scenario = parse_scenario(timeline(
            {"action": "add_consumer", "target": "store-r1-*", "dst": "topic://P.>"},
            {"action": "cut_link", "target": "region-2"},
            {"action": "restore_link", "target": "region-2"},
            {"action": "kill_broker", "target": "store-r1-0001"},
            {"action": "restart_broker", "target": "store-r1-0001"},
            {"action": "remove_consumer", "target": "store-r1-0002", "consumer": "tl0"},
            {"action": "insert_layer", "name": "country", "count": 2},
            {"action": "send", "target": "country-1", "dst": "queue://X", "count": 3},
        ))
        assert [e.action for e in scenario.timeline] == [
            "add_consumer", "cut_link", "restore_link", "kill_broker", "restart_broker",
            "remove_consumer", "insert_layer", "send"]
        assert set(ACTIONS) == {e.action for e in scenario.timeline}
        assert scenario.timeline[0].consumer == "tl0"  # default consumer name
        assert scenario.timeline[6].target == "hq"     # insert_layer below the root
        assert scenario.timeline[7].count == 3

    @pytest.mark.parametrize("events,key,problem", [
        ([{"action": "cut_lnk", "target": "hq"}], "timeline[0].action", 'did you mean "cut_link"'),
        ([{"target": "hq"}], "timeline[0].action", "required"),
        ([{"action": "cut_link"}], "timeline[0].target", "required"),
        ([{"action": "cut_link", "target": "store-r9-*"}], "timeline[0].target", "no broker"),
        ([{"action": "cut_link", "target": "hq"}], "timeline[0].target", "root"),
        ([{"action": "restore_link", "target": "region-1"}], "timeline[0].target", "not cut"),
        ([{"action": "cut_link", "target": "region-1"}, {"action": "cut_link",
                                                         "target": "region-*"}],
         "timeline[1].target", "already cut"),
        ([{"action": "kill_broker", "target": "hq"}, {"action": "kill_broker", "target": "hq"}],
         "timeline[1].target", "already killed"),
        ([{"action": "kill_broker", "target": "hq", "dst": "queue://X"}], "timeline[0].dst",
         "not a key of kill_broker"),
        ([{"action": "send", "target": "hq", "dst": "queue://X.*"}], "timeline[0].dst",
         "wildcard"),
        ([{"action": "send", "target": "hq", "dst": "queue://X", "count": 0}],
         "timeline[0].count", ">= 1"),
        ([{"action": "send", "target": "hq", "dst": "queue://R.{region}"}], "timeline[0].dst",
         "not in a region"),
        ([{"action": "add_consumer", "target": "hq", "dst": "queue://X", "selector": "a >"}],
         "timeline[0].selector", "invalid selector"),
        ([{"action": "remove_consumer", "target": "hq", "consumer": "ghost"}],
         "timeline[0].consumer", "no consumer"),
        ([{"action": "remove_consumer", "target": "hq"}], "timeline[0].consumer",
         "exactly one"),
        ([{"action": "add_consumer", "target": "hq", "dst": "queue://X", "consumer": "c"},
          {"action": "add_consumer", "target": "hq", "dst": "queue://Y", "consumer": "c"}],
         "timeline[1].consumer", "already has"),
        ([{"action": "insert_layer", "name": "country", "count": 3}], "timeline[0].count",
         "between 1 and 2"),
        ([{"action": "insert_layer", "name": "country", "count": 1, "target": "nowhere"}],
         "timeline[0].target", "no broker"),
        ([{"action": "send", "target": "country-1", "dst": "queue://X"}],
         "timeline[0].target", "no broker"),
    ])
    def test_bad_event(self, events: list, key: str, problem: str) -> None:
        """Impossible or misspelt timeline events are refused with the key at fault."""
        exc = error(timeline(*events))
        assert exc.key == key
        assert problem in exc.problem

    def test_events_must_be_in_time_order(self) -> None:
        """An event earlier than its predecessor is refused."""
        data = doc(timeline=[{"at": 5.0, "action": "kill_broker", "target": "hq"},
                             {"at": 4.0, "action": "restart_broker", "target": "hq"}])
        exc = error(data)
        assert exc.key == "timeline[1].at" and "time order" in exc.problem

    def test_remove_consumer_by_destination(self) -> None:
        """remove_consumer may name a destination instead of a consumer."""
        (event,) = parse_scenario(timeline(
            {"action": "remove_consumer", "target": "store-r1-0001",
             "dst": "queue://Store.{broker}.Incoming"})).timeline
        assert event.dst == "queue://Store.{broker}.Incoming" and event.consumer is None


class TestExpandDestination:
    def test_placeholders(self) -> None:
        """{broker} and {region} are filled in from the broker."""
        topo = parse_scenario(BASE).build_topology()
        store = topo.broker("store-r2-0001")
        assert expand_destination("queue://R.{region}.S.{broker}", store) == (
            "queue://R.region-2.S.store-r2-0001")
        assert expand_destination("queue://HQ.Incoming", store) == "queue://HQ.Incoming"
