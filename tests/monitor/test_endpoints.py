"""The HTTP monitor against running estates (tree and mesh): a real HTTP client (httpx)
and prometheus_client's own text parser."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from tests.monitor.helpers import monitored_config, start
from tests.node.helpers import wait_for
from treefed.client import connect
from treefed.errors import ConfigError
from treefed.config import parse_config
from treefed.security.passwords import hash_password

FAST = {"n": 2 ** 6, "r": 8, "p": 1}


def samples(text: str) -> dict[tuple, float]:
    """(sample name, sorted labels) -> value, parsed by prometheus_client."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(metrics: dict, name: str, **labels: str) -> float:
    return metrics[(name, tuple(sorted(labels.items())))]


async def get(url: str, **kwargs) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.get(url, **kwargs)


class TestTreeEstate:
    async def test_every_endpoint_on_a_three_level_tree(self, tmp_path: Path) -> None:
        """A consumer at a leaf shows up at the root with origin and broker path; a
        message sent at the root is counted produced/forwarded there and delivered at
        the leaf; every endpoint answers and /metrics parses."""
        async with trio.open_nursery() as nursery:
            root, ruri, rmon = await start(nursery, monitored_config(tmp_path, "root"))
            branch, buri, bmon = await start(nursery, monitored_config(
                tmp_path, "branch", tree={"uri": ruri, "node_type": "branch"}))
            leaf, luri, lmon = await start(nursery, monitored_config(
                tmp_path, "leaf", tree={"uri": buri}))
            async with connect(luri) as consumer:
                sub = await consumer.subscribe("queue://Orders", prefetch=10)
                await wait_for(lambda: root.site.statistics()["demand"] >= 1)

                demand = (await get(f"{rmon}/demandz", params={"dst": "Orders"})).json()
                assert demand["total"] == 1
                entry = demand["entries"][0]
                assert entry["origin"] == "leaf"
                assert entry["path"] == ["leaf", "branch", "root"]
                assert entry["peer"] == "branch" and entry["lane"] == "child"
                assert entry["active"] is True and entry["dst"] == "queue://Orders"
                assert (await get(f"{rmon}/demandz", params={"dst": "Other"})
                        ).json()["total"] == 0

                async with connect(ruri) as producer:
                    await producer.send("queue://Orders", b"x", persistent=True)
                msg = await sub.receive()
                await msg.ack()

            root_metrics = samples((await get(f"{rmon}/metrics")).text)
            assert value(root_metrics, "treefed_messages_total", event="produced") == 1
            assert value(root_metrics, "treefed_messages_total", event="forwarded") == 1
            assert value(root_metrics, "treefed_links", state="operational",
                         dialed="false") == 1
            assert value(root_metrics, "treefed_advisories_total",
                         direction="received", kind="any") >= 1
            leaf_metrics = samples((await get(f"{lmon}/metrics")).text)
            assert value(leaf_metrics, "treefed_messages_total", event="delivered") == 1
            assert value(leaf_metrics, "treefed_messages_total", event="received") == 1
            assert value(leaf_metrics, "treefed_links", state="operational",
                         dialed="true") == 1
            assert value(leaf_metrics, "treefed_broker_info", broker="leaf",
                         node_type="leaf", version=__import__("treefed").__version__) == 1
            assert ("treefed_event_loop_lag_seconds_count", ()) in leaf_metrics
            assert ("process_resident_memory_bytes", ()) in leaf_metrics

            varz = (await get(f"{bmon}/varz")).json()
            assert varz["broker"] == "branch" and varz["node_type"] == "branch"
            assert varz["uptime"] >= 0 and varz["mem_rss"] > 0
            assert varz["listeners"] == [buri]

            links = (await get(f"{bmon}/linkz")).json()["links"]
            by_peer = {link["peer"]: link for link in links}
            assert by_peer["root"]["dialed"] and by_peer["root"]["lane"] == "parent"
            assert by_peer["root"]["state"] == "operational"
            assert by_peer["leaf"]["lane"] == "child" and not by_peer["leaf"]["dialed"]
            # the leaf announced where it listens, so `treefed map` can walk down to it
            assert by_peer["leaf"]["listen"] == [luri]

            health = await get(f"{lmon}/healthz")
            assert health.status_code == 200 and health.json()["parent"] == "operational"
            nursery.cancel_scope.cancel()

    async def test_healthz_goes_503_when_the_parent_link_is_cut(self, tmp_path: Path) -> None:
        """A leaf whose parent stopped is not ready: 503 naming the link; /linkz shows
        it waiting."""
        async with trio.open_nursery() as nursery:
            root_cfg = monitored_config(tmp_path, "root")
            root, ruri, _ = await start(nursery, root_cfg)
            leaf, _, lmon = await start(nursery, monitored_config(
                tmp_path, "leaf", tree={"uri": ruri}))
            await wait_for(lambda: leaf.dialers[0].state == "operational")
            assert (await get(f"{lmon}/healthz")).status_code == 200
            await root.shutdown()
            await wait_for(lambda: leaf.dialers[0].state != "operational")
            health = await get(f"{lmon}/healthz")
            assert health.status_code == 503
            assert "parent link" in health.json()["problems"][0]
            link = (await get(f"{lmon}/linkz")).json()["links"][0]
            assert link["state"] in ("waiting", "connecting") and link["dialed"]
            nursery.cancel_scope.cancel()


class TestMeshEstate:
    async def test_mesh_pair_links_demand_and_connz_paging(self, tmp_path: Path) -> None:
        """On a mesh link both ends show the link; the dialing side holds demand for a
        consumer on the far side, with path [far, near]; /connz pages."""
        async with trio.open_nursery() as nursery:
            far, furi, fmon = await start(nursery, monitored_config(tmp_path, "far"))
            near, nuri, nmon = await start(nursery, monitored_config(
                tmp_path, "near", mesh=[{"name": "m1", "uri": furi, "duplex": True}]))
            await wait_for(lambda: near.dialers[0].state == "operational")
            async with connect(furi) as c1, connect(furi) as c2:
                await c1.subscribe("queue://A")
                await c2.subscribe("queue://B")
                await wait_for(lambda: near.site.statistics()["demand"] >= 2)
                demand = (await get(f"{nmon}/demandz")).json()
                assert demand["total"] == 2
                assert {e["dst"] for e in demand["entries"]} == {"queue://A", "queue://B"}
                assert all(e["path"] == ["far", "near"] and e["lane"] == "mesh"
                           for e in demand["entries"])
                page = (await get(f"{nmon}/demandz", params={"limit": 1, "offset": 1})).json()
                assert page["total"] == 2 and len(page["entries"]) == 1

                conns = (await get(f"{fmon}/connz")).json()
                assert conns["total"] == 3   # two clients and the mesh link
                clients = (await get(f"{fmon}/connz",
                                     params={"kind": "client", "limit": 1})).json()
                assert clients["total"] == 2 and len(clients["conns"]) == 1
                metrics = samples((await get(f"{nmon}/metrics")).text)
                assert value(metrics, "treefed_link_demand", link="m1", peer="far",
                             lane="mesh") == 2
                links = (await get(f"{fmon}/linkz")).json()["links"]
                assert links[0]["peer"] == "near" and links[0]["connector"] == "mesh"
            nursery.cancel_scope.cancel()


class TestCardinalityCap:
    async def test_destinations_beyond_the_cap_are_summed(self, tmp_path: Path) -> None:
        """With more destinations than the cap, the deepest are exported one series
        each and the rest summed under _other; totals still add up."""
        from treefed.monitor.metrics import node_registry, render

        async with trio.open_nursery() as nursery:
            node, uri, _ = await start(nursery, monitored_config(tmp_path, "b"))
            async with connect(uri) as producer:
                for i in range(6):
                    for _ in range(i + 1):
                        await producer.send(f"queue://Q{i}", b"x")
                await producer.flush()
                await wait_for(lambda: len(node.site.broker.destination_sizes()) == 6)
            registry, _ = node_registry(node, max_series=3)
            metrics = samples(render(registry).decode())
            depths = {dict(k[1])["dst"]: v for k, v in metrics.items()
                      if k[0] == "treefed_destination_depth"}
            assert depths == {"queue://Q5": 6, "queue://Q4": 5, "queue://Q3": 4,
                              "_other": 1 + 2 + 3}
            assert metrics[("treefed_messages_stranded", ())] == 21
            nursery.cancel_scope.cancel()


class TestRequests:
    async def test_unknown_paths_methods_and_bad_queries(self, tmp_path: Path) -> None:
        """404 lists the endpoints, 405 for POST, 400 for a bad limit or destination;
        HTTP garbage gets 400 and the monitor keeps serving others."""
        async with trio.open_nursery() as nursery:
            node, _, mon = await start(nursery, monitored_config(tmp_path, "b"))
            r = await get(f"{mon}/nope")
            assert r.status_code == 404 and "/metrics" in r.json()["endpoints"]
            async with httpx.AsyncClient() as client:
                assert (await client.post(f"{mon}/varz", content=b"x")).status_code == 405
            assert (await get(f"{mon}/connz", params={"limit": "x"})).status_code == 400
            assert (await get(f"{mon}/demandz", params={"dst": "queue://a b"})
                    ).status_code == 400
            host, port = node.monitor.address
            stream = await trio.open_tcp_stream(host, port)
            await stream.send_all(b"NOT HTTP AT ALL\r\n\r\n")
            reply = b""
            with trio.fail_after(5):
                while chunk := await stream.receive_some(4096):
                    reply += chunk
            assert reply.startswith(b"HTTP/1.1 400")
            await stream.aclose()
            assert (await get(f"{mon}/varz")).status_code == 200
            # keep-alive: several requests on one connection
            async with httpx.AsyncClient() as client:
                for _ in range(3):
                    assert (await client.get(f"{mon}/healthz")).status_code == 200
            nursery.cancel_scope.cancel()


class TestBasicAuth:
    async def test_only_admins_get_in_and_healthz_stays_open(self, tmp_path: Path) -> None:
        """With basic_auth: no or wrong credentials 401 (with a challenge), a user
        without admin on > 403, an admin 200; /healthz needs none."""
        security = {
            "authentication": True, "failure_delay": 0.01, "max_failure_delay": 0.01,
            "user": [{"name": "ops", "password_hash": hash_password("ops-pw", **FAST)},
                     {"name": "app", "password_hash": hash_password("app-pw", **FAST)}],
            "permission": [{"principal": "ops", "admin": [">"]},
                           {"principal": "app", "read": [">"], "write": [">"]}]}
        async with trio.open_nursery() as nursery:
            _, _, mon = await start(nursery, monitored_config(
                tmp_path, "b", monitor={"basic_auth": True}, security=security))
            r = await get(f"{mon}/metrics")
            assert r.status_code == 401 and "basic" in r.headers["www-authenticate"].lower()
            assert (await get(f"{mon}/varz", auth=("ops", "nope"))).status_code == 401
            assert (await get(f"{mon}/varz", auth=("app", "app-pw"))).status_code == 403
            for _ in range(2):   # the second time from the cache of good credentials
                assert (await get(f"{mon}/varz", auth=("ops", "ops-pw"))).status_code == 200
            assert (await get(f"{mon}/healthz")).status_code == 200
            nursery.cancel_scope.cancel()


class TestHttps:
    async def test_https_monitor_uses_the_broker_certificate(self, tmp_path: Path) -> None:
        """``https://`` serves the endpoints over TLS with [security.tls]."""
        import ssl

        import trustme

        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1")
        cert_path, key_path = tmp_path / "c.pem", tmp_path / "c.key"
        cert_path.write_bytes(b"".join(p.bytes() for p in cert.cert_chain_pems))
        cert.private_key_pem.write_to_path(str(key_path))
        security = {"tls": {"cert": str(cert_path), "key": str(key_path)}}
        async with trio.open_nursery() as nursery:
            node, _, mon = await start(nursery, monitored_config(
                tmp_path, "b", monitor={"listen": "https://127.0.0.1:0"}, security=security))
            assert mon.startswith("https://")
            context = ssl.create_default_context()
            ca.configure_trust(context)
            async with httpx.AsyncClient(verify=context) as client:
                r = await client.get(f"{mon}/varz")
            assert r.status_code == 200 and r.json()["broker"] == "b"
            nursery.cancel_scope.cancel()


class TestConfig:
    @pytest.mark.parametrize("monitor, security, key", [
        ({"listen": "ftp://x:1"}, {}, "monitor.listen"),
        ({"listen": "127.0.0.1"}, {}, "monitor.listen"),
        ({"listen": "https://127.0.0.1:0"}, {}, "security.tls.cert"),
        ({"listen": "127.0.0.1:0", "basic_auth": True}, {}, "monitor.basic_auth"),
        ({"listn": "127.0.0.1:0"}, {}, "monitor.listn"),
    ])
    def test_bad_monitor_sections_name_the_key(self, monitor, security, key) -> None:
        """Each bad [monitor] table is refused with the key at fault."""
        doc = {"broker": {"id": "b"}, "monitor": monitor}
        if security:
            doc["security"] = security
        with pytest.raises(ConfigError) as info:
            parse_config(doc)
        assert info.value.message.startswith(key + ":")

    def test_monitor_is_off_by_default_and_round_trips(self) -> None:
        """No [monitor]: off; a set one survives dump_config."""
        import tomllib

        from treefed.config import dump_config

        assert parse_config({"broker": {"id": "b"}}).monitor.listen == ""
        config = parse_config({"broker": {"id": "b"},
                               "monitor": {"listen": "127.0.0.1:8161"}})
        again = parse_config(tomllib.loads(dump_config(config)))
        assert again.monitor == config.monitor


class TestIdlePollMetrics:
    async def test_a_polling_broker_exports_its_window_and_polls(self, tmp_path: Path) -> None:
        """``[broker] idle_poll_us``: /metrics carries the window and the polls that
        caught a read or gave up, as prometheus_client parses them; a broker that does
        not poll exports neither."""
        async with trio.open_nursery() as nursery:
            node, uri, mon = await start(nursery, monitored_config(
                tmp_path, "polled", idle_poll_us=10_000))
            plain, _, plain_mon = await start(nursery, monitored_config(tmp_path, "plain"))
            async with connect(uri) as conn:
                sub = await conn.subscribe("queue://Polled", prefetch=10)
                # one at a time, the broker's reads come in turns: until one poll caught
                # a read (a loaded machine's gaps may all exceed 10 ms for a while)
                for i in range(2000):
                    await conn.send("queue://Polled", b"x", persistent=True)
                    await (await sub.receive()).ack()
                    if i >= 60 and node.statistics()["idle_poll"]["hits"]:
                        break
            stats = node.statistics()["idle_poll"]   # first: the counters only grow
            assert stats["hits"] > 0, stats
            metrics = samples((await get(f"{mon}/metrics")).text)
            assert value(metrics, "treefed_idle_polls_total", result="hit") >= stats["hits"]
            assert ("treefed_idle_polls_total", (("result", "miss"),)) in metrics
            window = value(metrics, "treefed_idle_poll_window_seconds")
            assert 0 <= window <= 0.010
            plain_metrics = samples((await get(f"{plain_mon}/metrics")).text)
            assert not any(name.startswith("treefed_idle_poll")
                           for name, _ in plain_metrics)
            nursery.cancel_scope.cancel()
