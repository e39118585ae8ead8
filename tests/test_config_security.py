"""Tests for the [security] section of treefed.config: parsing, validation, adapters."""

from __future__ import annotations

import copy
import dataclasses
import runpy
import ssl
import tomllib
from pathlib import Path

import pytest
import trustme

from treefed.config import SecurityConfig, dump_config, load_config, parse_config
from treefed.errors import ConfigError
from treefed.security.passwords import hash_password
from treefed.wire.frames import PROTOCOL_VERSION, Hello

HASH = hash_password("till-pw", n=2 ** 6)

SECURE = {
    "broker": {"id": "region-uk", "listen": ["ssl://127.0.0.1:0", "tcp://127.0.0.1:0"]},
    "tree_connector": {"node_type": "branch", "uri": "ssl://hq.example:61616",
                       "username": "region-uk", "password": "region-pw"},
    "network_connector": [{"name": "dr", "uri": "static:(ssl://127.0.0.1:61700)",
                           "username": "region-uk", "password": "pw2", "duplex": True}],
    "security": {
        "authentication": True,
        "failure_delay": 0.5,
        "max_failure_delay": 8.0,
        "user": [
            {"name": "store-uk-0001", "password_hash": HASH, "groups": ["stores"]},
            {"name": "store-uk-0002", "password_hash": HASH, "groups": ["stores"]},
            {"name": "hq", "groups": ["brokers", "admins"], "brokers": ["hq-standby"]},
            {"name": "ops@example.org", "password_hash": HASH},
        ],
        "permission": [
            {"principal": "group:stores", "read": ["queue://Store.{user}.>",
                                                   "topic://Broadcast.>"],
             "write": ["queue://HQ.>", "queue://Store.{user}.>"]},
            {"principal": "group:admins", "read": [">"], "write": [">"], "admin": [">"]},
            {"principal": "*", "read": ["topic://Public.>"]},
            {"principal": "ops@example.org", "admin": [">"]},
        ],
        "tls": {"cert": "certs/region.pem", "key": "certs/region.key", "ca": "certs/ca.pem",
                "verify_peer": True, "min_version": "1.3", "check_hostname": False,
                "handshake_timeout": 2.5},
        "tree": {"confine_children": True, "child_patterns": ["queue://Store.{child}.>"],
                 "broadcast": ["topic://Broadcast.>"], "upward": ["queue://HQ.>"]},
    },
}


def with_(doc: dict, path: str, value: object) -> dict:
    """Copy of ``doc`` with dotted ``path`` (list indexes as numbers) set to ``value``."""
    doc = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    node[last] = value
    return doc


def without(doc: dict, path: str) -> dict:
    doc = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    del node[last]
    return doc


class TestSecurityParsing:
    def test_absent_section_means_open_broker(self):
        """No [security]: authentication off, no authorizer, children unconfined."""
        config = parse_config({"broker": {"id": "b1"}})
        assert config.security == SecurityConfig()
        assert config.security.authorizer() is None
        assert config.security.tree.tree_scope() is None
        assert not config.security.authenticator().required

    def test_full_section(self):
        """Every key lands in its dataclass; patterns are canonical."""
        sec = parse_config(SECURE).security
        assert sec.authentication and sec.failure_delay == 0.5
        assert [u.name for u in sec.users] == ["store-uk-0001", "store-uk-0002", "hq",
                                               "ops@example.org"]
        assert sec.users[2].password_hash == "" and sec.users[2].brokers == ("hq-standby",)
        assert sec.permissions[0].read == ("queue://Store.{user}.>", "topic://Broadcast.>")
        assert sec.tls.verify_peer and sec.tls.min_version == "1.3"
        assert sec.tree.child_patterns == ("queue://Store.{child}.>",)

    def test_connector_credentials_and_ssl_uris(self):
        """Connectors take ssl:// URIs and credentials; credentials stay out of the
        bridge's LinkSettings."""
        config = parse_config(SECURE)
        assert config.tree_connector.uri.startswith("ssl://")
        assert config.tree_connector.username == "region-uk"
        mesh = config.network_connectors[0]
        assert mesh.password == "pw2"
        settings = mesh.link_settings()
        assert settings.duplex and not hasattr(settings, "password")
        assert parse_config(with_(SECURE, "tree_connector.uri",
                                  "failover:(ssl://a.example:1,ssl://b.example:2)"))

    def test_tls_paths_resolve_against_the_config_folder(self, tmp_path: Path):
        """Relative certificate paths are relative to the config file."""
        path = tmp_path / "site.toml"
        path.write_text(dump_config(parse_config(SECURE)))  # paths stay relative
        tls = load_config(path).security.tls
        assert tls.ca == str(tmp_path / "certs" / "ca.pem")
        assert tls.cert == str(tmp_path / "certs" / "region.pem")

    def test_round_trip(self):
        """dump_config then parse_config gives back the same security section."""
        config = parse_config(SECURE)
        assert parse_config(tomllib.loads(dump_config(config))) == config

    def test_default_security_is_not_dumped(self):
        """A config without [security] dumps without one."""
        assert "[security" not in dump_config(parse_config({"broker": {"id": "b1"}}))


BAD = [
    (with_(SECURE, "security.user.0.password_hash", "plaintext"),
     "security.user[0].password_hash", "invalid password hash"),
    (with_(SECURE, "security.permission.0.principal", "group:storez"),
     "security.permission[0].principal", 'did you mean "stores"'),
    (with_(SECURE, "security.permission.2.principal", "nobody"),
     "security.permission[2].principal", 'no user named "nobody"'),
    (with_(SECURE, "security.permission.0.read", ["queue://Store.{child}.>"]),
     "security.permission[0].read[0]", "unknown placeholder"),
    (with_(SECURE, "security.permission.0.write", ["queue://A..B"]),
     "security.permission[0].write[0]", "invalid pattern"),
    (with_(SECURE, "security.tree.child_patterns", ["queue://Store.{user}.>"]),
     "security.tree.child_patterns[0]", "unknown placeholder"),
    (with_(SECURE, "security.tree.broadcast", ["topic://X.{child}"]),
     "security.tree.broadcast[0]", "unknown placeholder"),
    (without(SECURE, "security.tls.ca"), "security.tls.ca", "verify_peer needs"),
    (without(SECURE, "security.tls.cert"), "security.tls.cert", "required when"),
    (with_(without(without(SECURE, "security.tls.cert"), "security.tls.key"),
           "security.tls.verify_peer", False),
     "security.tls.cert", "ssl:// listener broker.listen[0]"),
    (with_(SECURE, "security.tls.min_version", "1.1"), "security.tls.min_version",
     '"1.2", "1.3"'),
    (with_(SECURE, "security.tls.handshake_timeout", 0), "security.tls.handshake_timeout",
     "number"),
    (with_(SECURE, "security.authentcation", True), "security.authentcation",
     'did you mean "authentication"'),
    (with_(SECURE, "security.user.1.name", "store-uk-0001"), "security.user[1].name",
     "duplicate user"),
    (with_(SECURE, "security.user.1.name", "group:x"), "security.user[1].name",
     "printable name"),
    (with_(SECURE, "security.user.1.groups", ["bad group"]), "security.user[1].groups[0]",
     "letters, digits"),
    (with_(SECURE, "security.user.1.pasword_hash", "x"), "security.user[1].pasword_hash",
     'did you mean "password_hash"'),
    (with_(with_(SECURE, "security.user", []), "security.permission", []), "security.user",
     "no user is configured"),
    (with_(SECURE, "security.max_failure_delay", 0.1), "security.max_failure_delay",
     ">= failure_delay"),
    ({**SECURE, "security": ["x"]}, "security", "must be a table"),
    (with_(SECURE, "security.tree.confine_children", "yes"),
     "security.tree.confine_children", "true or false"),
    (with_(SECURE, "tree_connector.password", 42), "tree_connector.password",
     "must be a string"),
    (with_(SECURE, "broker.listen", ["tls://127.0.0.1:1"]), "broker.listen[0]", "ssl://"),
]


class TestSecurityValidation:
    @pytest.mark.parametrize("doc,key,problem", BAD, ids=[b[1] for b in BAD])
    def test_bad_value_names_the_key(self, doc, key, problem):
        """Each bad security key or value raises ConfigError naming the dotted key."""
        with pytest.raises(ConfigError) as info:
            parse_config(doc)
        assert info.value.key == key
        assert problem in info.value.problem

    def test_hash_errors_do_not_echo_the_hash(self):
        """A malformed hash is reported without quoting it."""
        with pytest.raises(ConfigError) as info:
            parse_config(with_(SECURE, "security.user.0.password_hash",
                               "scrypt$64$8$1$c2VjcmV0c2FsdA$!!!"))
        assert "c2VjcmV0c2FsdA" not in str(info.value)


class TestSecurityAdapters:
    def test_authenticator_checks_configured_users(self):
        """authenticator() verifies configured hashes and binds broker ids."""
        auth = parse_config(SECURE).security.authenticator()
        hello = Hello(PROTOCOL_VERSION, "client", username="store-uk-0001",
                      password="till-pw")
        assert auth.authenticate(hello, 0.0).user == "store-uk-0001"
        bad = Hello(PROTOCOL_VERSION, "client", username="store-uk-0001", password="x")
        result = auth.authenticate(bad, 0.0)
        assert not result.ok and result.delay == 0.5

    def test_authorizer_applies_group_and_user_rules(self):
        """authorizer() grants by group with {user}, and '*' to everyone."""
        authz = parse_config(SECURE).security.authorizer()
        assert authz.check("store-uk-0001", "read", "queue://Store.store-uk-0001.Orders")
        assert not authz.check("store-uk-0001", "read", "queue://Store.store-uk-0002.Orders")
        assert authz.check("store-uk-0002", "read", "topic://Public.News")
        assert authz.is_admin("hq") and authz.is_admin("ops@example.org")
        assert not authz.is_admin("store-uk-0001")

    def test_tree_scope(self):
        """tree.tree_scope() confines a child to {child} patterns plus broadcast."""
        scope = parse_config(SECURE).security.tree.tree_scope().for_child("s1", leaf=True)
        assert scope.may_advertise("queue://Store.s1.A")
        assert not scope.may_advertise("queue://Store.s2.A")
        assert scope.may_send("queue://HQ.Sales")

    def test_tls_contexts_from_files(self, tmp_path: Path):
        """server_context()/client_context() load the configured files."""
        ca = trustme.CA()
        leaf = ca.issue_cert("127.0.0.1", common_name="region-uk")
        (tmp_path / "certs").mkdir()
        ca.cert_pem.write_to_path(str(tmp_path / "certs/ca.pem"))
        leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "certs/region.pem"))
        leaf.private_key_pem.write_to_path(str(tmp_path / "certs/region.key"))
        path = tmp_path / "region.toml"
        path.write_text(dump_config(parse_config(SECURE)).replace(
            '"certs/', f'"{tmp_path}/certs/'))
        tls = load_config(path).security.tls
        server = tls.server_context()
        assert server.verify_mode == ssl.CERT_REQUIRED
        assert server.minimum_version == ssl.TLSVersion.TLSv1_3
        client = tls.client_context()
        assert client.verify_mode == ssl.CERT_REQUIRED and not client.check_hostname

    def test_missing_tls_file_names_the_key(self, tmp_path: Path):
        """A certificate file that is not there is a ConfigError on security.tls.cert."""
        tls = parse_config(with_(SECURE, "security.tls.cert",
                                 str(tmp_path / "gone.pem"))).security.tls
        with pytest.raises(ConfigError) as info:
            tls.server_context()
        assert info.value.key == "security.tls.cert"


SECURE_DIR = Path(__file__).resolve().parent.parent / "configs" / "secure"
SECURE_SITES = ("hq", "region-uk", "store-uk-0001", "store-uk-0002")


class TestSecureEstate:
    def test_configs_load_as_a_tls_tree(self):
        """configs/secure: four sites, ssl:// everywhere, authentication on, a tree."""
        configs = {n: load_config(SECURE_DIR / f"{n}.toml") for n in SECURE_SITES}
        for name, config in configs.items():
            assert config.broker.id == name
            assert all(uri.startswith("ssl://") for uri in config.broker.listen)
            assert config.security.authentication
        assert configs["hq"].tree_connector is None
        region_port = configs["region-uk"].broker.listen[0].rsplit(":", 1)[1]
        for store in ("store-uk-0001", "store-uk-0002"):
            assert configs[store].tree_connector.uri.endswith(f":{region_port}")
        assert configs["region-uk"].security.tree.confine_children

    def test_make_certs_script_feeds_the_configs(self, tmp_path: Path):
        """make-certs.py writes a CA and per-broker certificates the TLS contexts load,
        with private keys readable by their owner only."""
        script = runpy.run_path(str(SECURE_DIR / "make-certs.py"))
        script["make_certs"](tmp_path)
        assert (tmp_path / "store-uk-0001.key").stat().st_mode & 0o077 == 0
        for name in SECURE_SITES:
            tls = load_config(SECURE_DIR / f"{name}.toml").security.tls
            moved = {k: str(tmp_path / Path(getattr(tls, k)).name)
                     for k in ("cert", "key", "ca")}
            tls = dataclasses.replace(tls, **moved)
            assert tls.server_context() and tls.client_context()

    def test_demo_passwords_match_the_shipped_hashes(self):
        """The documented demo passwords log in at the sites that list them."""
        cases = {"hq": [("hq-app", "hq-app-demo"), ("ops", "ops-demo")],
                 "store-uk-0001": [("till-0001", "till-0001-demo")],
                 "store-uk-0002": [("till-0002", "till-0002-demo")]}
        for site, users in cases.items():
            auth = load_config(SECURE_DIR / f"{site}.toml").security.authenticator()
            for user, password in users:
                hello = Hello(PROTOCOL_VERSION, "client", username=user, password=password)
                assert auth.check(hello).ok, (site, user)
