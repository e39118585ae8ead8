"""Tests for treefed.config: loading, validation messages, dump round trip, adapters."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import pytest

from treefed.config import (
    BrokerConfig, NetworkConnectorConfig, dump_config, load_config, parse_config,
    parse_mesh_options,
)
from treefed.errors import ConfigError

CONFIGS = Path(__file__).resolve().parent.parent / "configs"

MINIMAL = {"broker": {"id": "b1"}}

FULL = {
    "broker": {"id": "store-uk-0001", "name": 'UK "store" 1 — Öxford', "data_dir": "/var/x",
               "listen": ["tcp://127.0.0.1:61618", "tcp://127.0.0.1:0"],
               "max_frame_bytes": 65536, "max_redeliveries": 2, "dlq": "queue://Dead",
               "heartbeat_interval": 2.5, "hello_timeout": 5.0,
               "accept_tree_children": False, "accept_mesh": False},
    "logging": {"level": "DEBUG", "file": "/tmp/x.log", "message_events": True},
    "policy": [{"pattern": "queue://Store.>", "max_messages": 10, "max_bytes": 1000,
                "limit_behaviour": "drop_oldest", "max_message_bytes": 100,
                "local_only": True, "on_expiry": "discard"},
               {"pattern": "topic://*.Prices"}],
    "tree_connector": {"node_type": "leaf", "uri": "tcp://127.0.0.1:61617",
                       "route_unknown_up": False, "max_interest_per_child": 50},
    "network_connector": [
        {"name": "to-region", "uri": "static:(tcp://127.0.0.1:61617)?initialReconnectDelay=1000",
         "network_ttl": 2, "message_ttl": 3, "duplex": True, "conduit_subscriptions": False,
         "dynamically_included": ["queue://Store.>"], "excluded": ["topic://Secret.*"],
         "statically_included": ["queue://Static.One"],
         "decrease_network_consumer_priority": True,
         "suppress_duplicate_queue_subscriptions": True,
         "suppress_duplicate_topic_subscriptions": False, "bridge_temp_destinations": False,
         "prefetch": 10, "static_bridge": True, "max_demand_per_link": 7},
        {"name": "second", "uri": "static:(tcp://127.0.0.1:61620)"},
    ],
}


def with_(doc: dict, path: str, value: object) -> dict:
    """Copy of ``doc`` with the dotted ``path`` (list indexes as numbers) set to value."""
    doc = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    node[last] = value
    return doc


class TestLoadConfig:
    @pytest.mark.parametrize("name", ["hq", "region-uk", "store-uk-0001", "store-uk-0002"])
    def test_shipped_configs_load(self, name: str) -> None:
        """Every shipped site config loads, its id matching its file name."""
        config = load_config(CONFIGS / f"{name}.toml")
        assert config.broker.id == name
        assert config.source_path == str(CONFIGS / f"{name}.toml")

    def test_shipped_configs_form_a_three_level_tree(self) -> None:
        """hq is the root, region-uk a branch under it, the stores leaves under the region."""
        configs = {p.stem: load_config(p) for p in CONFIGS.glob("*.toml")}
        port = {k: c.broker.listen[0].rsplit(":", 1)[1] for k, c in configs.items()}
        assert configs["hq"].tree_connector is None
        region = configs["region-uk"].tree_connector
        assert (region.node_type, region.uri.rsplit(":", 1)[1]) == ("branch", port["hq"])
        for store in ("store-uk-0001", "store-uk-0002"):
            tree = configs[store].tree_connector
            assert (tree.node_type, tree.uri.rsplit(":", 1)[1]) == ("leaf", port["region-uk"])
            assert configs[store].broker.accept_tree_children is False
        assert sorted(port.values()) == ["61616", "61617", "61618", "61619"]

    def test_relative_data_dir_resolves_against_the_config_folder(self) -> None:
        """data_dir "../data/hq" in configs/hq.toml means <repo>/data/hq."""
        config = load_config(CONFIGS / "hq.toml")
        assert Path(config.broker.data_dir).resolve() == CONFIGS.parent / "data" / "hq"

    def test_defaults(self) -> None:
        """A config with only broker.id gets every documented default."""
        config = parse_config(MINIMAL)
        assert config.broker.name == "b1"
        assert config.broker.data_dir == "data/b1"
        assert config.broker.listen == ()
        assert config.broker.max_frame_bytes == 4 * 1024 * 1024
        assert config.broker.dlq == "queue://DLQ"
        assert config.logging.level == "info" and config.logging.file == ""
        assert config.policies == () and config.network_connectors == ()
        assert config.tree_connector is None and config.source_path is None

    def test_connector_ttls_default_to_network_ttl(self) -> None:
        """consumer_ttl and message_ttl follow network_ttl unless given."""
        config = parse_config(FULL)
        first, second = config.network_connectors
        assert (first.network_ttl, first.consumer_ttl, first.message_ttl) == (2, 2, 3)
        assert (second.network_ttl, second.consumer_ttl, second.message_ttl) == (1, 1, 1)
        assert second.duplex is False and second.prefetch == 1000

    def test_level_is_case_insensitive(self) -> None:
        """logging.level "DEBUG" is stored as "debug"."""
        assert parse_config(FULL).logging.level == "debug"

    def test_missing_file(self, tmp_path: Path) -> None:
        """A missing file is a ConfigError naming the path."""
        with pytest.raises(ConfigError, match="cannot read"):
            load_config(tmp_path / "nope.toml")

    def test_invalid_toml(self, tmp_path: Path) -> None:
        """A TOML syntax error is a ConfigError, not a tomllib exception."""
        path = tmp_path / "bad.toml"
        path.write_text("[broker\nid = 1\n")
        with pytest.raises(ConfigError, match="invalid TOML"):
            load_config(path)


BAD = [
    (with_(FULL, "network_connector.1.network_ttl", "two"), "network_connector[1].network_ttl",
     'must be an integer >= -1, got "two"'),
    (with_(MINIMAL, "broker.lsten", []), "broker.lsten", 'did you mean "listen"'),
    ({**MINIMAL, "netwrok_connector": []}, "netwrok_connector",
     'did you mean "network_connector"'),
    ({"broker": {"name": "x"}}, "broker.id", "required"),
    ({}, "broker", "required section"),
    (with_(MINIMAL, "broker.id", "bad id!"), "broker.id", "letters, digits"),
    (with_(MINIMAL, "broker.max_redeliveries", True), "broker.max_redeliveries",
     "got true"),
    (with_(MINIMAL, "broker.heartbeat_interval", -1), "broker.heartbeat_interval", ">= 0"),
    (with_(MINIMAL, "broker.hello_timeout", 0), "broker.hello_timeout", ">= 0.1"),
    (with_(MINIMAL, "broker.max_frame_bytes", 10), "broker.max_frame_bytes", "integer"),
    (with_(MINIMAL, "broker.listen", "tcp://127.0.0.1:1"), "broker.listen", "must be a list"),
    (with_(MINIMAL, "broker.listen", ["udp://127.0.0.1:1"]), "broker.listen[0]", "tcp://"),
    (with_(MINIMAL, "broker.listen", ["tcp://127.0.0.1:notaport"]), "broker.listen[0]",
     "notaport"),
    (with_(FULL, "network_connector.0.uri", "static:(tcp://127.0.0.1:1)?bogus=1"),
     "network_connector[0].uri", "bogus"),
    (with_(MINIMAL, "broker.dlq", "topic://DLQ"), "broker.dlq", "must be a queue"),
    (with_(MINIMAL, "logging.level", "verbose"), "logging.level", "must be one of"),
    (with_(FULL, "policy.0.limit_behaviour", "spill"), "policy[0].limit_behaviour",
     '"block", "reject_newest", "drop_oldest"'),
    (with_(FULL, "policy.1.pattern", "queue://A..B"), "policy[1].pattern",
     "invalid destination"),
    (with_(FULL, "policy.1.pattern", 7), "policy[1].pattern", "must be a string"),
    ({**MINIMAL, "policy": {"pattern": ">"}}, "policy", "array of tables"),
    ({**MINIMAL, "tree_connector": [{"uri": "tcp://127.0.0.1:1"}]}, "tree_connector",
     "at most one"),
    (with_(FULL, "tree_connector.node_type", "root"), "tree_connector.node_type",
     '"leaf", "branch"'),
    ({**MINIMAL, "tree_connector": {}}, "tree_connector.uri", "required"),
    (with_(FULL, "tree_connector.uri", "static:(tcp://127.0.0.1:1)"), "tree_connector.uri",
     "failover:"),
    (with_(FULL, "network_connector.1.name", "to-region"), "network_connector[1].name",
     "duplicate"),
    (with_(FULL, "network_connector.0.statically_included", ["queue://A.>"]),
     "network_connector[0].statically_included[0]", "wildcards are not allowed"),
    (with_(FULL, "network_connector.0.excluded", [3]), "network_connector[0].excluded[0]",
     "must be a string"),
    (with_(FULL, "network_connector.0.prefetch", 0), "network_connector[0].prefetch",
     ">= 1"),
    (with_(FULL, "network_connector.0.dupelx", True), "network_connector[0].dupelx",
     'did you mean "duplex"'),
    ({**MINIMAL, "network_connector": [{"name": "x"}]}, "network_connector[0].uri",
     "required"),
]


class TestValidation:
    @pytest.mark.parametrize("doc,key,problem", BAD, ids=[b[1] for b in BAD])
    def test_bad_value_names_the_key(self, doc: dict, key: str, problem: str) -> None:
        """Each kind of bad key or value raises ConfigError with the dotted key at fault."""
        with pytest.raises(ConfigError) as info:
            parse_config(doc)
        assert info.value.key == key
        assert problem in info.value.problem
        assert str(info.value).startswith(f"{key}: ")

    def test_source_is_attached_as_a_note(self) -> None:
        """The error says which file it came from."""
        with pytest.raises(ConfigError) as info:
            parse_config({}, source="sites/x.toml")
        assert "in sites/x.toml" in info.value.__notes__

    def test_mesh_options_alone(self) -> None:
        """parse_mesh_options validates and returns only the keys given."""
        assert parse_mesh_options({"network_ttl": 2, "duplex": True}) == {
            "network_ttl": 2, "duplex": True}
        with pytest.raises(ConfigError) as info:
            parse_mesh_options({"uri": "tcp://x:1"}, "mode[0]")
        assert info.value.key == "mode[0].uri"


class TestDumpConfig:
    @pytest.mark.parametrize("doc", [MINIMAL, FULL], ids=["minimal", "full"])
    def test_round_trip(self, doc: dict) -> None:
        """dump_config then parse_config gives back the same config."""
        config = parse_config(doc)
        assert parse_config(tomllib.loads(dump_config(config))) == config

    def test_shipped_config_round_trips_through_a_file(self, tmp_path: Path) -> None:
        """A loaded config dumped to another folder loads to the same values (paths absolute)."""
        config = load_config(CONFIGS / "store-uk-0001.toml")
        out = tmp_path / "site.toml"
        out.write_text(dump_config(config))
        again = load_config(out)
        assert again.broker == config.broker and again.tree_connector == config.tree_connector
        assert again.policies == config.policies

    def test_escapes_strings(self) -> None:
        """Quotes, backslashes, control characters and non-ASCII survive the TOML writer."""
        name = 'a "q" \\ \t\n\x7f é'
        config = parse_config(with_(MINIMAL, "broker.name", name))
        assert tomllib.loads(dump_config(config))["broker"]["name"] == name


class TestAdapters:
    def test_network_connector_link_settings(self) -> None:
        """link_settings() carries every connector option over to a mesh LinkSettings."""
        nc: NetworkConnectorConfig = parse_config(FULL).network_connectors[0]
        settings = nc.link_settings()
        assert settings.kind == "mesh" and settings.name == "to-region"
        assert (settings.consumer_ttl, settings.message_ttl) == (2, 3)
        assert settings.statically_included == ("queue://Static.One",)
        assert settings.static_bridge is True and settings.max_demand_per_link == 7

    def test_tree_connector_link_settings(self) -> None:
        """The tree connector becomes a tree LinkSettings and this site's TreeSettings."""
        tree = parse_config(FULL).tree_connector
        settings = tree.link_settings()
        assert (settings.kind, settings.node_type, settings.route_unknown_up) == (
            "tree", "leaf", False)
        assert settings.max_demand_per_link == 50
        assert tree.tree_settings().node_type == "leaf"

    def test_policy_set_first_match_wins(self) -> None:
        """policy_set() keeps the order of [[policy]]: the first matching pattern applies."""
        config: BrokerConfig = parse_config(FULL)
        policies = config.policy_set()
        store = policies.for_destination("queue://Store.X")
        assert store.max_messages == 10 and store.limit_behaviour == "drop_oldest"
        assert policies.for_destination("topic://Shop.Prices").max_messages == 0
