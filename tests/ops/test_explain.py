"""`treefed explain`: the replay over the brokers' views, checked against what the
brokers then actually do with the message (live estates, real sockets)."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from tests.node.helpers import make_config, start_node, wait_for
from tests.ops.test_map_wait import run_cli
from treefed.client import connect
from treefed.ops.explain import trace


async def delivered(sub, timeout: float = 1.5) -> bool:
    with trio.move_on_after(timeout):
        msg = await sub.receive()
        await msg.ack()
        return True
    return False


async def chain(nursery, tmp_path: Path, ttl: int, **link):
    """A - B - C, mesh, duplex links A->B and B->C."""
    c, c_uri = await start_node(nursery, make_config(tmp_path / "c", "c"))
    b, b_uri = await start_node(nursery, make_config(
        tmp_path / "b", "b", mesh=[{"name": "bc", "uri": c_uri, "duplex": True,
                                    "network_ttl": ttl}]))
    a, a_uri = await start_node(nursery, make_config(
        tmp_path / "a", "a", mesh=[{"name": "ab", "uri": b_uri, "duplex": True,
                                    "network_ttl": ttl, **link}]))
    await wait_for(lambda: a.dialers[0].state == b.dialers[0].state == "operational")
    return (a, a_uri), (b, b_uri), (c, c_uri)


async def explain(a_uri: str, dst: str, frm: str) -> dict:
    code, out, err = await run_cli("explain", dst, "--from", frm, "--root", a_uri,
                                   "--json")
    assert code == 0, err
    return json.loads(out)


class TestLive:
    async def test_ttl_then_the_message_stops_where_predicted(self, tmp_path: Path) -> None:
        """network_ttl=1: a consumer two hops away is refused as ttl (its advisory
        stopped at B); one hop away is reached over ab with its demand entry; sending
        then delivers exactly as explained."""
        async with trio.open_nursery() as nursery:
            (a, a_uri), (b, b_uri), (c, c_uri) = await chain(nursery, tmp_path, 1)
            async with connect(c_uri) as cc:
                far = await cc.subscribe("queue://T")
                await wait_for(lambda: b.site.statistics()["demand"] >= 1)
                result = await explain(a_uri, "T", "a")
                assert result["reached"] == {}
                (why,) = result["unreached"]
                assert why["broker"] == "c" and why["reason"] == "ttl", why
                async with connect(a_uri) as producer:
                    await producer.send("queue://T", b"1", persistent=True)
                assert not await delivered(far)

                async with connect(b_uri) as bc:
                    near = await bc.subscribe("queue://T")
                    await wait_for(lambda: a.site.statistics()["demand"] >= 1)
                    result = await explain(a_uri, "queue://T", "a")
                    assert len(result["reached"]) == 1, result
                    (consumer, route), = result["reached"].items()
                    assert route["broker"] == "b"
                    (hop,) = route["hops"]
                    assert hop["from"] == "a" and hop["to"] == "b" and hop["link"] == "ab"
                    assert hop["demand"][0]["path"] == ["b", "a"]
                    assert [u["broker"] for u in result["unreached"]] == ["c"]
                    assert await delivered(near)      # the held message, then
                    async with connect(a_uri) as producer:
                        await producer.send("queue://T", b"2", persistent=True)
                    assert await delivered(near)
                    assert not await delivered(far, 0.5)
            nursery.cancel_scope.cancel()

    async def test_two_hops_with_ttl_2_and_the_filter(self, tmp_path: Path) -> None:
        """network_ttl=2 reaches C through B (two hops, each with its demand entry); a
        destination excluded on link ab is refused as filter and never sent."""
        async with trio.open_nursery() as nursery:
            (a, a_uri), (b, _), (c, c_uri) = await chain(nursery, tmp_path, 2,
                                                         excluded=["queue://Secret"])
            async with connect(c_uri) as cc:
                t = await cc.subscribe("queue://T")
                s = await cc.subscribe("queue://Secret")
                await wait_for(lambda: a.site.statistics()["demand"] >= 1)
                result = await explain(a_uri, "T", "a")
                (route,) = result["reached"].values()
                assert [h["to"] for h in route["hops"]] == ["b", "c"]
                assert route["hops"][1]["demand"][0]["path"] == ["c", "b"]
                secret = await explain(a_uri, "Secret", "a")
                assert secret["reached"] == {}
                assert secret["unreached"][0]["reason"] == "filter", secret
                async with connect(a_uri) as producer:
                    await producer.send("queue://T", b"t", persistent=True)
                    await producer.send("queue://Secret", b"s", persistent=True)
                assert await delivered(t)
                assert not await delivered(s)
            nursery.cancel_scope.cancel()

    async def test_tree_sibling_goes_up_then_down(self, tmp_path: Path) -> None:
        """In a tree a store's message for its sibling's consumer climbs by
        route_unknown_up (tree_rule) and comes down along the root's demand."""
        async with trio.open_nursery() as nursery:
            root, root_uri = await start_node(nursery, make_config(tmp_path / "r", "root"))
            s1, s1_uri = await start_node(nursery, make_config(
                tmp_path / "s1", "s1", tree={"uri": root_uri}))
            s2, s2_uri = await start_node(nursery, make_config(
                tmp_path / "s2", "s2", tree={"uri": root_uri}))
            await wait_for(lambda: s1.dialers[0].state == s2.dialers[0].state
                           == "operational")
            async with connect(s2_uri) as c2:
                sub = await c2.subscribe("queue://Store.s2.In")
                await wait_for(lambda: root.site.statistics()["demand"] >= 1)
                result = await explain(root_uri, "Store.s2.In", "s1")
                (route,) = result["reached"].values()
                assert route["broker"] == "s2"
                first, second = route["hops"]
                assert first["to"] == "root" and "tree_rule" in first["rule"]
                assert second["to"] == "s2" and second["demand"][0]["path"] == ["s2", "root"]
                code, out, _ = await run_cli("explain", "Store.s2.In", "--from", "s1",
                                             "--root", root_uri)
                assert "REACHES s2/" in out and "route_unknown_up" in out
                async with connect(s1_uri) as producer:
                    await producer.send("queue://Store.s2.In", b"x", persistent=True)
                assert await delivered(sub)
            nursery.cancel_scope.cancel()


def view(broker, *, local=(), entries=(), links=(), local_only=False, up=False):
    return {"broker": broker, "local_only": local_only, "route_unknown_up": up,
            "local_consumers": [{"consumer": c, "pattern": "queue://Q", "selector": None}
                                for c in local],
            "entries": list(entries), "links": list(links)}


def link(name, peer, state="operational", **rules):
    return {"link": name, "peer": peer, "lane": "mesh", "state": state,
            "message_ttl": rules.get("message_ttl", -1),
            "consumer_ttl": rules.get("consumer_ttl", -1), "filter": rules.get("filter")}


def entry(linkname, peer, consumer, path):
    return {"link": linkname, "peer": peer, "consumer": consumer, "origin": path[0],
            "pattern": "queue://Q", "path": path, "selector": None, "active": True}


class TestTrace:
    def test_link_down_loop_and_unreachable(self) -> None:
        """The replay names link_down, loop and an unreachable broker."""
        views = {
            "a": view("a", entries=[entry("ab", "b", "b/c1/s", ["b", "a"]),
                                    entry("ax", "x", "x/c1/s", ["x", "a"])],
                      links=[link("ab", "b", state="waiting"), link("ax", "x")]),
            "b": view("b", local=["b/c1/s"]),
            "x": None,
        }
        result = trace(views, "a")
        assert result["unreached"] == [{"consumer": "b/c1/s", "broker": "b",
                                        "reason": "link_down",
                                        "detail": "at a towards b over link ab"}]
        assert any(r["reason"] == "unreachable" and r["to"] == "x"
                   for r in result["refused"])
        looping = {"a": view("a", entries=[entry("ab", "b", "b/c/s", ["b", "a"])],
                             links=[link("ab", "b")]),
                   "b": view("b", entries=[entry("ba", "a", "b/c/s", ["b", "a", "b"])],
                             links=[link("ba", "a")])}
        refused = trace(looping, "a")["refused"]
        assert [r["reason"] for r in refused] == ["loop"]


class TestPermission:
    async def test_forward_refused_by_the_next_brokers_permissions(self, tmp_path: Path,
                                                                  monkeypatch) -> None:
        """B lets A's user advertise (read >) but write only queue://Allowed.>: a
        message for B's consumer of queue://T is explained as permission (A holds the
        demand, B's screen refuses the forward) and is indeed not delivered, while
        queue://Allowed.T is reached and delivered."""
        from treefed.config import parse_config
        from treefed.node import BrokerNode
        from treefed.security.passwords import hash_password

        fast = {"n": 2 ** 6, "r": 8, "p": 1}
        security = {
            "authentication": True, "failure_delay": 0.01, "max_failure_delay": 0.01,
            "user": [{"name": "a", "password_hash": hash_password("a-pw", **fast)},
                     {"name": "ops", "password_hash": hash_password("ops-pw", **fast)}],
            "permission": [{"principal": "a", "read": [">"],
                            "write": ["queue://Allowed.>"]},
                           {"principal": "ops", "read": [">"], "write": [">"],
                            "admin": [">"]}]}
        b = BrokerNode(parse_config({
            "broker": {"id": "b", "data_dir": str(tmp_path / "b"),
                       "listen": ["tcp://127.0.0.1:0"], "heartbeat_interval": 0.0},
            "logging": {"level": "warning"}, "security": security}))
        async with trio.open_nursery() as nursery:
            (host, port), = await nursery.start(b.serve)
            b_uri = f"tcp://{host}:{port}"
            a, a_uri = await start_node(nursery, make_config(
                tmp_path / "a", "a", mesh=[{"name": "ab", "uri": b_uri, "username": "a",
                                            "password": "a-pw"}]))
            await wait_for(lambda: a.dialers[0].state == "operational")
            async with connect(b_uri, username="ops", password="ops-pw") as bc:
                t = await bc.subscribe("queue://T")
                ok = await bc.subscribe("queue://Allowed.T")
                await wait_for(lambda: a.site.statistics()["demand"] >= 2)
                monkeypatch.setenv("TREEFED_PASSWORD", "ops-pw")
                code, out, err = await run_cli("explain", "T", "--from", "a", "--root",
                                               a_uri, "--json", "--user", "ops")
                assert code == 0, err
                result = json.loads(out)
                assert result["reached"] == {}
                assert result["unreached"][0]["reason"] == "permission", result
                code, out, err = await run_cli("explain", "Allowed.T", "--from", "a",
                                               "--root", a_uri, "--json", "--user", "ops")
                assert len(json.loads(out)["reached"]) == 1, out
                async with connect(a_uri) as producer:
                    await producer.send("queue://T", b"t", persistent=True)
                    await producer.send("queue://Allowed.T", b"ok", persistent=True)
                assert await delivered(ok)
                assert not await delivered(t)
            nursery.cancel_scope.cancel()
