"""The procs engine runs scenarios on estates from `treefed estate generate`: real broker
processes from the generated TLS configs, links over mutual TLS, the workload through
authenticated TLS clients -- and the same deliveries as the memory engine on that plan."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from treefed.errors import ConfigError, RemoteError
from treefed.estate.generate import generate, parse_description
from treefed.estate.scenario import estate_mode, estate_scenario, estate_topology
from treefed.scenario.engines import engine_class
from treefed.scenario.results import Recorder
from treefed.scenario.spec import parse_scenario
from treefed.scenario.workload import build_plan

STORES = ["region-1-s1", "region-1-s2", "region-2-s1", "region-2-s2"]


def estate(mode: str = "tree", **over) -> dict:
    """HQ -> 2 regions -> 2 stores each on 127.0.0.1, mutual TLS between brokers, an
    application user per tier with generated passwords and per-tier permissions."""
    data = {
        "name": "run", "mode": mode,
        "hq": {"id": "hq", "host": "127.0.0.1", "port": 40000},   # ports: the run's own
        "layer": [{"name": "region", "count": 2, "id": "region-{i}", "host": "127.0.0.1",
                   "base_port": 40010},
                  {"name": "store", "count": 2, "id": "{parent}-s{n}", "host": "127.0.0.1",
                   "base_port": 40020}],
        "tls": {"enabled": True}, "security": {"authentication": True},
        "user": [{"name": "hq-app", "groups": ["hq-apps"], "sites": ["hq"]},
                 {"name": "ops", "groups": ["ops"], "sites": ["region"]},
                 {"name": "till", "groups": ["tills"], "sites": ["store"]}],
        "permission": [
            {"principal": "group:hq-apps", "sites": ["hq"], "read": ["queue://HQ.>"],
             "write": ["queue://HQ.>", "queue://Store.>", "topic://Broadcast.>"]},
            {"principal": "group:ops", "sites": ["region"], "read": ["queue://Region.{id}.>"],
             "write": ["queue://HQ.>"]},
            {"principal": "group:tills", "sites": ["store"],
             "read": ["queue://Store.{id}.>", "topic://Broadcast.>"],
             "write": ["queue://HQ.>", "queue://Store.>"]}],
    }
    if mode == "mesh":
        data["connector"] = {"network_ttl": 2, "duplex": True}
    data.update(over)
    return data


SCENARIO = parse_scenario({
    "name": "estate-run", "seed": 7, "topology": {"regions": 1, "stores_per_region": 2},
    "mode": [{"connector": "tree"}],
    "workload": {"store_topic_subscribers": True, "hq_consumers": ["queue://HQ.Incoming"],
                 "region_consumers": ["queue://Region.{region}.Incoming"],
                 "hq_to_stores": 1, "stores_to_hq": 1, "store_to_store": 6,
                 "topic_broadcasts": 1}})


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(folder: Path, engine: str, **options):
    sc = estate_scenario(SCENARIO, folder)
    plan = build_plan(sc)
    rec = Recorder(plan)
    figures = engine_class(engine)(plan, sc.modes[0], rec, **options).run()["outcome"]
    return rec.delivery_map(), figures


class TestEstateScenario:
    def test_topology_and_mode_come_from_the_configs(self, tmp_path):
        """Roles, kinds and regions from who dials whom; the mode from the uplinks."""
        generate(parse_description(estate("mesh")), tmp_path)
        topo = estate_topology(tmp_path)
        assert [b.id for b in topo.brokers] == ["hq", "region-1", "region-2", *STORES]
        assert [(b.role, b.kind) for b in topo.brokers][:2] == [("root", "hq"),
                                                               ("branch", "region")]
        store = topo.broker("region-2-s1")
        assert (store.role, store.kind, store.parent, store.region) == \
            ("leaf", "store", "region-2", "region-2")
        mode = estate_mode(tmp_path)
        assert (mode.label, mode.connector) == ("mesh-ttl2", "mesh")
        assert mode.options["duplex"] is True

    def test_timeline_is_checked_against_the_estate(self, tmp_path):
        """A timeline naming a broker the estate does not have, or inserting a layer, is
        refused before anything runs."""
        generate(parse_description(estate()), tmp_path)
        bad = parse_scenario({"name": "x", "topology": {"regions": 1, "stores_per_region": 2},
                              "mode": [{"connector": "tree"}],
                              "timeline": [{"at": 2.0, "action": "kill_broker",
                                            "target": "region-1"}]})
        estate_scenario(bad, tmp_path)                # region-1 exists there
        gone = parse_scenario({"name": "x", "topology": {"regions": 1, "stores_per_region": 2},
                               "mode": [{"connector": "tree"}],
                               "timeline": [{"at": 2.0, "action": "kill_broker",
                                             "target": "store-r1-0001"}]})
        with pytest.raises(ConfigError, match="timeline"):
            estate_scenario(gone, tmp_path)
        grow = parse_scenario({"name": "x", "topology": {"regions": 1, "stores_per_region": 2},
                               "mode": [{"connector": "tree"}],
                               "timeline": [{"at": 2.0, "action": "insert_layer",
                                             "name": "area", "count": 1}]})
        with pytest.raises(ConfigError, match="insert_layer"):
            estate_scenario(grow, tmp_path)

    def test_a_used_site_without_an_application_user_is_refused(self, tmp_path):
        """The workload consumes at the regions but the estate has no region user: a
        ConfigError naming the site before any process starts."""
        data = estate()
        data["user"] = [u for u in data["user"] if u["name"] != "ops"]
        data["permission"] = [p for p in data["permission"] if p["principal"] != "group:ops"]
        generate(parse_description(data), tmp_path)
        with pytest.raises(ConfigError, match="region-1.*no application user"):
            run(tmp_path, "procs", estate=tmp_path)


    def test_tls_sites_must_listen_on_loopback_for_a_local_run(self, tmp_path):
        """A TLS estate generated for real hosts cannot run on this machine with its
        certificates (they name those hosts): refused up front, saying what to change."""
        data = estate()
        data["layer"] = [dict(layer, host="{id}.shop.example") for layer in data["layer"]]
        generate(parse_description(data), tmp_path)
        with pytest.raises(ConfigError, match='region-1 listens on ssl://region-1.shop.'
                                              'example:40010.*host = "127.0.0.1"'):
            run(tmp_path, "procs", estate=tmp_path)


class TestProcsOnGeneratedEstate:
    def test_tls_estate_runs_the_workload_like_the_memory_engine(self, tmp_path):
        """Seven `treefed broker` processes from the generated configs: every link is mutual
        TLS authenticated by the child's certificate, every workload client logs in over
        TLS with its tier's generated password (and at HQ and the regions, whose listeners
        require certificates, with its user certificate); all 18 deliveries happen, the
        same as the memory engine's on the same plan, advisories and demand included."""
        folder, work = tmp_path / "estate", tmp_path / "run"
        generate(parse_description(estate()), folder)
        mem_map, mem = run(folder, "memory")
        procs_map, got = run(folder, "procs", estate=folder, workdir=work)
        assert got["delivered"] == got["expected"] == mem["delivered"] == 18
        assert procs_map == mem_map
        for key in ("advisory_frames", "demand_created", "stranded", "duplicates"):
            assert got[key] == mem[key], key
        topo = estate_topology(folder)
        for b in topo.brokers:
            config = (work / b.id / "broker.toml").read_text()
            assert re.search(r'listen = \["ssl://127\.0\.0\.1:\d+"\]', config)
            ok = [e for e in events(work / b.id / "events.jsonl") if e["event"] == "auth.ok"]
            links = {(e["user"], e["method"]) for e in ok if e["role"] == "broker"}
            assert links == {(c, "certificate") for c in topo.children(b.id)}, b.id
            app = {"hq": "hq-app", "region": "ops", "store": "till"}[b.kind]
            assert {(e["user"], e["method"]) for e in ok if e["role"] == "client"} == \
                {(app, "password")}, b.id
        assert "verify_peer = true" in (work / "region-1" / "broker.toml").read_text()

    @pytest.mark.slow
    def test_mesh_tls_estate_matches_the_memory_engine(self, tmp_path):
        """The same with duplex mesh connectors, TTL 2 (3 store-to-store messages strand
        there as in the memory run)."""
        folder = tmp_path / "estate"
        generate(parse_description(estate("mesh")), folder)
        mem_map, mem = run(folder, "memory")
        procs_map, got = run(folder, "procs", estate=folder)
        assert procs_map == mem_map and got["delivered"] == mem["delivered"] > 0
        for key in ("advisory_frames", "demand_created", "stranded"):
            assert got[key] == mem[key], key

    def test_wrong_or_missing_certificate_is_refused(self, tmp_path):
        """One store dials its region with a certificate from another CA, another with no
        certificate at all (their own listeners plain TCP, so only the link is at stake):
        both regions refuse the handshake and the run stops naming both links and what
        the regions logged, instead of running on a half-linked estate."""
        folder = tmp_path / "estate"
        generate(parse_description(estate()), folder)
        generate(parse_description(estate(name="other")), tmp_path / "other")
        for ext in ("pem", "key"):
            shutil.copy(tmp_path / "other" / "certs" / f"region-1-s1.{ext}",
                        folder / "certs" / f"region-1-s1.{ext}")
        for site in ("region-1-s1", "region-2-s1"):
            cfg = folder / f"{site}.toml"
            text = cfg.read_text().replace('listen = ["ssl://', 'listen = ["tcp://')
            if site == "region-2-s1":
                text = text.replace(f'cert = "certs/{site}.pem"\n', "").replace(
                    f'key = "certs/{site}.key"\n', "")
            cfg.write_text(text)
        with pytest.raises(RuntimeError) as err:
            run(folder, "procs", estate=folder, link_timeout=5)
        text = str(err.value)
        assert "region-1-s1 -> region-1 never came up; region-1 logged " \
               "tls.handshake_failed: unable to get local issuer certificate" in text
        assert "region-2-s1 -> region-2 never came up; region-2 logged " \
               "tls.handshake_failed: peer did not return a certificate" in text
        assert "region-1-s2" not in text

    def test_client_without_certificate_is_refused_where_required(self, tmp_path):
        """HQ's listener requires client certificates: without hq-app's certificate the
        workload client's handshake fails and the run says so."""
        folder = tmp_path / "estate"
        generate(parse_description(estate()), folder)
        (folder / "certs" / "users" / "hq-app.pem").unlink()
        with pytest.raises(RemoteError, match="hq: the broker closed the workload "
                                              "client's connection before its hello"):
            run(folder, "procs", estate=folder, workdir=tmp_path / "run")
        refused = [e for e in events(tmp_path / "run" / "hq" / "events.jsonl")
                   if e["event"] == "tls.handshake_failed"]
        # (links cut mid-handshake as the run stops may add "unexpected eof" lines)
        assert "peer did not return a certificate" in [e["reason"] for e in refused]


class TestEstateRunCommand:
    def test_example_estate_runs_the_example_workload(self, tmp_path):
        """treefed estate run on the shipped example (memory engine: the command's
        plumbing; the procs engine on generated TLS estates is tested above): every
        planned delivery happens and the run directory has its summary."""
        from tests.estate.test_activemq import cli
        from tests.estate.test_generate import EXAMPLE

        workload = EXAMPLE.parent / "workload.toml"
        assert cli("estate", "generate", str(EXAMPLE), "--out", str(tmp_path / "e")
                   ).returncode == 0
        done = cli("estate", "run", str(tmp_path / "e"), str(workload), "--engine", "memory",
                   "--out", str(tmp_path / "runs"))
        assert done.returncode == 0, done.stderr
        assert "9 brokers (tree, memory): 24 of 24 delivered, 0 stranded" in done.stderr
        (run_dir,) = (tmp_path / "runs").iterdir()
        assert json.loads((run_dir / "summary.json").read_text())["delivered"] == 24
        # a workload with region consumers: the example has no region user -> exit 2
        scenario = tmp_path / "regions.toml"
        scenario.write_text(workload.read_text().replace(
            "[workload]", '[workload]\nregion_consumers = ["queue://Region.{region}.In"]'))
        bad = cli("estate", "run", str(tmp_path / "e"), str(scenario), "--out",
                  str(tmp_path / "runs"))
        assert bad.returncode == 2 and "region-1, but its config has no application user" \
            in bad.stderr, bad.stderr
