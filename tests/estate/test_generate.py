"""treefed estate generate: one description -> validated configs, certificates, users."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.estate.test_activemq import cli
from treefed.config import load_config
from treefed.errors import ConfigError
from treefed.estate.forecast import forecast, load_estate
from treefed.estate.generate import generate, parse_description
from treefed.estate.start import start_estate
from treefed.transport.ports import free_ports
from treefed.security.passwords import parse_password_hash, verify_password

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "configs" / "estate" / "retail.toml"
HASH = ("scrypt$16384$8$1$56pmODVVL30/IgcHCI7UFQ$"
        "bP95fHzJ1QXiv5CO4LpTuKL4aCHRiOMwv8fha72hR1Q")   # ops-demo (configs/secure)


def description(**over) -> dict:
    data = {
        "name": "t", "mode": "tree",
        "hq": {"id": "hq", "host": "hq.shop.example", "port": 61616},
        "layer": [{"name": "region", "count": 2, "host": "{id}.shop.example", "port": 61616},
                  {"name": "store", "count": 3, "host": "{id}.shop.example", "port": 61616}],
        "user": [{"name": "ops", "groups": ["admins"], "password_hash": HASH}],
        "permission": [{"principal": "group:admins", "read": [">"], "admin": [">"]}],
        "policy": [{"sites": ["store"], "pattern": "queue://Store.{id}.>",
                    "max_messages": 10}],
        "tls": {"enabled": True},
    }
    data.update(over)
    return data


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


class TestGenerate:
    def test_every_config_validates_ids_and_addresses_unique(self, tmp_path):
        """2 regions x 3 stores: 9 configs that load, unique ids and (host, port), each
        child dialing its parent over ssl://, users with their scrypt hash."""
        report = generate(parse_description(description()), tmp_path)
        assert report["sites"] == report["configs"] == 9
        configs = [load_config(p) for p in sorted(tmp_path.glob("*.toml"))
                   if p.name != "users.toml"]
        ids = [c.broker.id for c in configs]
        assert len(ids) == len(set(ids)) == 9
        listen = [c.broker.listen[0] for c in configs]
        assert len(set(listen)) == 9 and all(u.startswith("ssl://") for u in listen)
        store = load_config(tmp_path / "region-1-0001.toml")
        assert store.tree_connector.uri == "ssl://region-1.shop.example:61616"
        assert store.tree_connector.node_type == "leaf"
        assert store.policies[0].pattern == "queue://Store.region-1-0001.>"
        region = load_config(tmp_path / "region-1.toml")
        assert region.tree_connector.node_type == "branch"
        assert {u.name for u in region.security.users} == \
            {"ops", "region-1-0001", "region-1-0002", "region-1-0003"}
        assert region.security.tls.verify_peer and not store.security.tls.verify_peer
        assert load_config(tmp_path / "hq.toml").tree_connector is None

    def test_keys_are_private_and_ignored(self, tmp_path):
        """Private keys are 0600, the CA key lives in secrets/ (0700), a .gitignore keeps
        both out of a repository."""
        generate(parse_description(description()), tmp_path)
        keys = list((tmp_path / "certs").rglob("*.key"))
        assert len(keys) == 10          # 9 sites and the user ops
        assert all(os.stat(k).st_mode & 0o777 == 0o600 for k in keys)
        assert os.stat(tmp_path / "secrets" / "ca.key").st_mode & 0o777 == 0o600
        assert os.stat(tmp_path / "secrets").st_mode & 0o777 == 0o700
        ignored = (tmp_path / ".gitignore").read_text().split()
        assert "certs/*.key" in ignored and "certs/users/*.key" in ignored and "secrets/" in ignored

    def test_generated_passwords(self, tmp_path):
        """A user without a hash gets a random password (secrets/, 0600) whose hash is in
        users.toml and in the configs of the sites it is on."""
        data = description(user=[{"name": "till", "groups": ["tills"], "sites": ["store"]}],
                           permission=[])
        generate(parse_description(data), tmp_path)
        import tomllib
        pw = tomllib.loads((tmp_path / "secrets" / "passwords.toml").read_text())["users"]
        hashes = tomllib.loads((tmp_path / "users.toml").read_text())["users"]
        assert verify_password(pw["till"], hashes["till"])
        parse_password_hash(hashes["till"])
        store = load_config(tmp_path / "region-2-0003.toml")
        assert [u.password_hash for u in store.security.users] == [hashes["till"]]
        assert "till" not in {u.name for u in load_config(tmp_path / "hq.toml").security.users}
        assert os.stat(tmp_path / "secrets" / "passwords.toml").st_mode & 0o777 == 0o600

    def test_same_input_same_bytes(self, tmp_path):
        """Two fresh runs: every config and users.toml byte-identical (only keys and
        certificates, random by nature, differ)."""
        a, b = tmp_path / "a", tmp_path / "b"
        generate(parse_description(description()), a)
        generate(parse_description(description()), b)
        fa, fb = files(a), files(b)
        assert fa.keys() == fb.keys()
        differ = {k for k in fa if fa[k] != fb[k]}
        assert differ and all(k.startswith(("certs/", "secrets/")) for k in differ)

    def test_rerun_keeps_keys_rotate_replaces_them(self, tmp_path):
        """Re-running keeps every key, certificate and file as it was; --rotate issues
        new ones."""
        desc = parse_description(description())
        generate(desc, tmp_path)
        before = files(tmp_path)
        assert generate(desc, tmp_path)["new_keys"] == 0
        assert files(tmp_path) == before
        assert generate(desc, tmp_path, rotate=True)["new_keys"] == 11
        after = files(tmp_path)
        assert after["certs/hq.key"] != before["certs/hq.key"]
        assert after["hq.toml"] == before["hq.toml"]

    def test_mesh_mode_forecasts_the_spill(self, tmp_path):
        """mode = "mesh", network_ttl 2: duplex uplinks; the forecast of the generated
        estate shows spilled demand that its proposed tree does not have."""
        data = description(mode="mesh", connector={"network_ttl": 2}, tls={"enabled": False},
                           user=[], permission=[])
        generate(parse_description(data), tmp_path)
        store = load_config(tmp_path / "region-1-0002.toml")
        (nc,) = store.network_connectors
        assert (nc.duplex, nc.network_ttl, nc.uri) == \
            (True, 2, "static:(tcp://region-1.shop.example:61616)")
        r = forecast(load_estate([tmp_path]))
        assert r["estate"]["unresolved"] == [] and r["estate"]["links"] == 8
        assert r["current"]["totals"]["spilled"] > r["proposed_tree"]["totals"]["spilled"]

    def test_explicit_site_list(self, tmp_path):
        """Stores may be listed one by one with their parent and port."""
        data = description(layer=[
            {"name": "region", "sites": [{"id": "uk"}, {"id": "fr"}], "base_port": 7000},
            {"name": "store", "sites": [{"id": "uk-1", "parent": "uk"},
                                        {"id": "fr-1", "parent": "fr", "port": 7100}],
             "base_port": 7010}],
            hq={"port": 6999})
        generate(parse_description(data), tmp_path)
        assert load_config(tmp_path / "fr-1.toml").broker.listen == ("ssl://127.0.0.1:7100",)
        assert load_config(tmp_path / "uk-1.toml").tree_connector.uri == \
            "ssl://127.0.0.1:7000"

    @pytest.mark.parametrize("change, key, words", [
        ({"layer": [{"name": "store", "count": 2, "port": 61616}],
          "hq": {"port": 61616}}, "layer", "both listen on 127.0.0.1:61616"),
        ({"layer": [{"name": "store", "count": 2, "id": "s-{x}", "base_port": 9000}]},
         "layer[0].id", "unknown placeholder {x}"),
        ({"tls": {"enabled": False}}, "security.authentication", "needs [tls]"),
        ({"layer": [{"name": "store", "count": 2}]}, "layer[0].port", "base_port"),
        ({"policy": [{"sites": ["shop"], "pattern": "queue://A"}]}, "policy[0].sites",
         "no layer 'shop'"),
    ])
    def test_bad_descriptions_name_the_key(self, change, key, words):
        """Mistakes are refused up front with the key at fault."""
        with pytest.raises(ConfigError) as info:
            parse_description(description(**change))
        assert info.value.key == key and words in info.value.problem

    def test_example_generates_with_the_cli(self, tmp_path):
        """configs/estate/retail.toml through the command line."""
        done = cli("estate", "generate", str(EXAMPLE), "--out", str(tmp_path))
        assert done.returncode == 0, done.stderr
        assert "9 sites" in done.stderr
        assert load_config(tmp_path / "region-2-store-0003.toml").broker.id == \
            "region-2-store-0003"



def _start(config: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "treefed.cli", "broker", "--config",
                             str(config)], stdout=subprocess.DEVNULL,
                            stderr=log.open("wb"), cwd=config.parent,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def _wait_for(predicate, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


class TestTlsEstateStarts:
    def test_generated_tls_estate_links_with_mutual_tls(self, tmp_path):
        """HQ, a region and a store from generated configs, one process each: both tree
        links come up over mutual TLS (the region requires and authenticates the store's
        certificate); a store with a certificate from another CA is refused."""
        hq, region, store, rogue = free_ports(4)
        data = description(hq={"host": "127.0.0.1", "port": hq}, layer=[
            {"name": "region", "sites": [{"id": "region-1", "port": region}]},
            {"name": "store", "sites": [{"id": "store-1", "port": store}]}])
        generate(parse_description(data), tmp_path / "estate")
        other = description(name="other", hq={"host": "127.0.0.1", "port": rogue}, layer=[
            {"name": "store", "sites": [{"id": "store-9", "port": store + 0}]}])
        generate(parse_description(other), tmp_path / "other")
        # the rogue store dials our region with its own CA's certificate
        rogue_cfg = tmp_path / "other" / "store-9.toml"
        rogue_cfg.write_text(rogue_cfg.read_text().replace(f"127.0.0.1:{store}",
                                                           "127.0.0.1:0").replace(
            f'uri = "ssl://127.0.0.1:{rogue}"', f'uri = "ssl://127.0.0.1:{region}"').replace(
            'ca = "certs/ca.pem"', f'ca = "{tmp_path / "estate" / "certs" / "ca.pem"}"'))
        # (it trusts our CA, so only the region's check of its certificate can stop it)
        running = start_estate(tmp_path / "estate")
        rogue_log = tmp_path / "store-9.log"
        procs = [_start(rogue_cfg, rogue_log)]
        try:
            assert sorted(running.procs) == ["hq", "region-1", "store-1"]
            assert running.wait_linked(60) == [], \
                "\n".join(running.log(s).read_text()[-1500:] for s in running.procs)
            up = running.links_up()
            assert {("region-1", "hq"), ("region-1", "store-1"), ("store-1", "region-1"),
                    ("hq", "region-1")} <= up
            region_log = running.log("region-1")
            text = region_log.read_text()
            assert '"method":"certificate"' in text and '"user":"store-1"' in text

            def refused() -> bool:
                return any('"tls.handshake_failed"' in line and "certificate" in line
                           for line in region_log.read_text().splitlines())

            assert _wait_for(refused), region_log.read_text()[-2000:]
            assert ("region-1", "store-9") not in running.links_up()
        finally:
            running.stop()
            for p in procs:
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()

    def test_estate_start_command(self, tmp_path):
        """treefed estate start DIR: every broker of a generated estate up and linked,
        SIGTERM stops them all (exit 0)."""
        ports = free_ports(3)
        data = description(hq={"host": "127.0.0.1", "port": ports[0]}, tls={"enabled": False},
                           user=[], permission=[], layer=[
            {"name": "region", "sites": [{"id": "r1", "port": ports[1]}]},
            {"name": "store", "sites": [{"id": "s1", "port": ports[2]}]}])
        generate(parse_description(data), tmp_path)
        proc = subprocess.Popen([sys.executable, "-m", "treefed.cli", "estate", "start",
                                 str(tmp_path)], stderr=subprocess.PIPE, text=True,
                                env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
        try:
            line = proc.stderr.readline()
            assert "3 brokers running, every link up" in line, line
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0
        assert all('"broker.stopped"' in (tmp_path / "logs" / f"{s}.log").read_text()
                   for s in ("hq", "r1", "s1"))
