"""`treefed map` and `treefed wait` against running estates (real sockets; the CLI as a
subprocess)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

from tests.node.helpers import child_env, make_config, start_node, wait_for
from treefed.client import connect
from treefed.ops.estate_map import discover, render_dot, render_html, render_text
from treefed.ops.wait import wait_ready


async def client_stat(uri: str) -> dict:
    async with connect(uri) as conn:
        return await conn.stat()


async def three_levels(nursery: trio.Nursery, tmp_path: Path) -> dict:
    """root <- b1 <- (l1, l2), root <- b2 <- l3; returns id -> (node, uri)."""
    nodes = {}
    nodes["root"] = await start_node(nursery, make_config(tmp_path / "root", "root"))
    for branch in ("b1", "b2"):
        nodes[branch] = await start_node(nursery, make_config(
            tmp_path / branch, branch, tree={"uri": nodes["root"][1], "node_type": "branch"}))
    for leaf, branch in (("l1", "b1"), ("l2", "b1"), ("l3", "b2")):
        nodes[leaf] = await start_node(nursery, make_config(
            tmp_path / leaf, leaf, tree={"uri": nodes[branch][1]}))
    for name, (node, _) in nodes.items():
        if name != "root":
            await wait_for(lambda node=node: node.dialers[0].state == "operational")
    return nodes


async def run_cli(*args: str) -> tuple[int, str, str]:
    result = await trio.run_process([sys.executable, "-m", "treefed.cli", *args],
                                    capture_stdout=True, capture_stderr=True, check=False,
                                    env=child_env())
    return result.returncode, result.stdout.decode(), result.stderr.decode()


class TestMap:
    async def test_whole_tree_with_demand_counts(self, tmp_path: Path) -> None:
        """Every broker is found from the root, each under its parent, with the link
        state and demand counts as the brokers see them."""
        async with trio.open_nursery() as nursery:
            nodes = await three_levels(nursery, tmp_path)
            async with connect(nodes["l2"][1]) as c:
                await c.subscribe("queue://X")
                await wait_for(lambda: nodes["root"][0].site.statistics()["demand"] >= 1)
                found = await discover(nodes["root"][1], client_stat)
            assert set(found.brokers) == {"root", "b1", "b2", "l1", "l2", "l3"}
            assert all(v.reachable for v in found.brokers.values())
            root_links = {l["peer"]: l for l in found.brokers["root"].links}
            assert root_links["b1"]["demand"] == 1 and root_links["b2"]["demand"] == 0
            text = render_text(found)
            lines = text.splitlines()
            assert lines[0].startswith("root (root,")
            assert any(line.startswith("    l2 (leaf") for line in lines), text
            assert any(line.startswith("  b1 (branch") and "demand=1" in line
                       for line in lines), text
            assert "6 brokers, 0 unreachable" in lines[-1]
            dot = render_dot(found)
            assert '"b1" -> "l2"' in dot and dot.startswith("digraph")
            page = render_html(found)
            assert "<script" not in page and "l3" in page
            nursery.cancel_scope.cancel()

    async def test_cut_link_and_silent_broker_are_shown_not_waited_for(
            self, tmp_path: Path) -> None:
        """A leaf that went away shows as a down link under its branch and as
        unreachable; a broker that accepts and never answers is shown unreachable
        after the timeout instead of hanging the walk."""
        async with trio.open_nursery() as nursery:
            nodes = await three_levels(nursery, tmp_path)
            l1, l1_uri = nodes["l1"]
            await l1.shutdown()
            await wait_for(lambda: "l1" in nodes["b1"][0].lost_links)
            found = await discover(nodes["root"][1], client_stat, timeout=2)
            b1_links = {l["peer"]: l for l in found.brokers["b1"].links}
            assert b1_links["l1"]["state"] == "down"
            assert b1_links["l1"]["reach"] == l1_uri
            assert not found.brokers["l1"].reachable
            text = render_text(found)
            assert "[down]" in text and "l1 UNREACHABLE" in text, text

            # a silent listener where l3 used to be: accepted, never answered
            l3, l3_uri = nodes["l3"]
            port = int(l3_uri.rsplit(":", 1)[1])
            await l3.shutdown()
            await wait_for(lambda: "l3" in nodes["b2"][0].lost_links)
            listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
            held = []

            async def swallow(stream: trio.abc.Stream) -> None:
                held.append(stream)
                await trio.sleep_forever()

            nursery.start_soon(trio.serve_listeners, swallow, listeners)
            with trio.fail_after(10):
                found = await discover(nodes["root"][1], client_stat, timeout=1)
            assert held, "the walk never reached the silent broker"
            assert not found.brokers["l3"].reachable
            assert "no answer within 1 s" in found.brokers["l3"].error
            assert found.brokers["l2"].reachable
            nursery.cancel_scope.cancel()

    async def test_mesh_is_walked_both_ways(self, tmp_path: Path) -> None:
        """Mesh peers are found through dialed and accepted links alike."""
        async with trio.open_nursery() as nursery:
            a, a_uri = await start_node(nursery, make_config(tmp_path / "a", "a"))
            b, b_uri = await start_node(nursery, make_config(
                tmp_path / "b", "b", mesh=[{"name": "ab", "uri": a_uri}]))
            c, _ = await start_node(nursery, make_config(
                tmp_path / "c", "c", mesh=[{"name": "ca", "uri": a_uri}]))
            await wait_for(lambda: b.dialers[0].state == c.dialers[0].state == "operational")
            found = await discover(b_uri, client_stat)
            assert set(found.brokers) == {"a", "b", "c"}
            assert "~ a mesh ab [operational]" in render_text(found)
            nursery.cancel_scope.cancel()

    async def test_cli_map_json_and_unreachable_root(self, tmp_path: Path) -> None:
        """`treefed map --json` prints the estate; an unreachable root exits 1."""
        async with trio.open_nursery() as nursery:
            nodes = await three_levels(nursery, tmp_path)
            code, out, err = await run_cli("map", nodes["root"][1], "--json")
            assert code == 0, err
            data = json.loads(out)
            assert data["brokers"] == 6 and data["unreachable"] == 0
            assert data["estate"]["b2"]["links"][0]["peer"] in ("root", "l3")
            code, out, _ = await run_cli("map", "tcp://127.0.0.1:1", "--timeout", "2")
            assert code == 1 and "UNREACHABLE" in out
            nursery.cancel_scope.cancel()


class TestWait:
    async def test_waits_for_the_broker_then_its_parent_link(self, tmp_path: Path) -> None:
        """wait returns once the broker answers; --link-up only once its parent link is
        operational; a timeout says why."""
        async with trio.open_nursery() as nursery:
            root_config = make_config(tmp_path / "root", "root")
            leaf, leaf_uri = await start_node(nursery, make_config(
                tmp_path / "leaf", "leaf", tree={"uri": "tcp://127.0.0.1:1"}))
            ok, why = await wait_ready(leaf_uri, client_stat, timeout=5)
            assert ok and why == ""
            ok, why = await wait_ready(leaf_uri, client_stat, timeout=0.5, link_up=True)
            assert not ok and "link tree to tcp://127.0.0.1:1 is" in why
            root, root_uri = await start_node(nursery, root_config)
            leaf2, leaf2_uri = await start_node(nursery, make_config(
                tmp_path / "leaf2", "leaf2", tree={"uri": root_uri}))
            ok, _ = await wait_ready(leaf2_uri, client_stat, timeout=5, link_up=True)
            assert ok and leaf2.dialers[0].state == "operational"
            nursery.cancel_scope.cancel()

    async def test_cli_wait_for_a_broker_that_starts_later(self, tmp_path: Path) -> None:
        """`treefed wait` started before the broker returns 0 once it is up; against
        nothing it exits 1 with the reason."""
        port_holder = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = port_holder[0].socket.getsockname()[1]
        await port_holder[0].aclose()
        uri = f"tcp://127.0.0.1:{port}"
        async with trio.open_nursery() as nursery:
            done: list = []

            async def waiter() -> None:
                done.append(await run_cli("wait", uri, "--timeout", "20"))

            nursery.start_soon(waiter)
            await trio.sleep(1.0)   # the waiter is polling a closed port meanwhile
            await start_node(nursery, make_config(tmp_path / "late", "late",
                                                  listen=[uri]))
            await wait_for(lambda: done, timeout=20)
            assert done[0][0] == 0, done[0]
            code, _, err = await run_cli("wait", "tcp://127.0.0.1:1", "--timeout", "0.5")
            assert code == 1 and "not ready after 0.5 s" in err
            nursery.cancel_scope.cancel()


class TestCli:
    async def test_version_and_help_list_every_sub_command(self) -> None:
        """--version prints the version; --help shows each sub-command's options."""
        import treefed

        code, out, _ = await run_cli("--version")
        assert code == 0 and out.strip() == f"treefed {treefed.__version__}"
        code, out, _ = await run_cli("--help")
        assert code == 0
        for usage in ("treefed map", "--link-up", "treefed send", "--persistent",
                      "treefed consume", "--selector", "treefed wait", "treefed stat"):
            assert usage in out
