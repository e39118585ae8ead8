"""Runtime changes without restart: `treefed link add|del|list`, reload (Admin frame and
SIGHUP), log file reopen — with messages in flight, nothing lost, nothing doubled."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from tests.node.helpers import REPO_ROOT, child_env, make_config, start_node, wait_for
from tests.ops.test_map_wait import client_stat, run_cli
from treefed.client import connect
from treefed.config import load_config
from treefed.errors import RemoteError, TreefedError
from treefed.node import BrokerNode
from treefed.ops.wait import wait_ready
from treefed.transport.ports import free_port


def write(path: Path, broker_id: str, port: int, extra: str = "",
          data_dir: str | None = None, level: str = "info") -> Path:
    path.write_text(
        f'[broker]\nid = "{broker_id}"\ndata_dir = "{data_dir or path.parent / broker_id}"\n'
        f'listen = ["tcp://127.0.0.1:{port}"]\nheartbeat_interval = 0.0\n'
        f'[logging]\nlevel = "{level}"\n' + extra, encoding="utf-8")
    return path


class TestLinkAddDel:
    async def test_link_add_del_add_with_messages_in_flight(self, tmp_path: Path) -> None:
        """Messages held at A reach B's consumer once `link add` creates the route;
        `link del` in the middle of the flow and a second `link add` lose nothing and
        deliver nothing twice."""
        total = 600
        async with trio.open_nursery() as nursery:
            a, a_uri = await start_node(nursery, make_config(tmp_path / "a", "a"))
            b, b_uri = await start_node(nursery, make_config(tmp_path / "b", "b"))
            async with connect(a_uri) as producer, connect(b_uri) as consumer:
                sub = await consumer.subscribe("queue://Q", prefetch=20)
                sent = [await producer.send("queue://Q", str(i).encode(), persistent=True,
                                            confirm=False) for i in range(total)]
                await producer.wait_confirmed()
                # prefetch=1: one forward in flight at a time, so the flow lasts
                result = await producer.admin("link.add", name="ab", uri=b_uri, prefetch=1)
                assert result["added"][0]["uri"] == b_uri
                got: list[str] = []
                while len(got) < total // 3:
                    msg = await sub.receive()
                    got.append(msg.id)
                    await msg.ack()
                removed = await producer.admin("link.del", name="ab")
                assert len(removed["removed"]) == 1
                await wait_for(lambda: not any(l["peer"] == "a"
                                               for l in b.site.statistics()["links"]))
                left = dict((n, d) for n, d, *_ in a.site.broker.destination_sizes())
                assert left["queue://Q"] > 0, "everything crossed before the link went"
                # drain what had already crossed; nothing more comes from A
                with trio.move_on_after(1.0):
                    while True:
                        msg = await sub.receive()
                        got.append(msg.id)
                        await msg.ack()
                # at most the one forward in flight (prefetch=1) reached B unacked: A
                # took it back and will send it again; B must drop that copy
                assert 0 <= len(got) - (total - left["queue://Q"]) <= 1
                listed = await producer.admin("link.list")
                assert listed["links"] == []
                await producer.admin("link.add", name="ab", uri=b_uri, prefetch=1)
                with trio.fail_after(20):
                    while len(got) < total:
                        msg = await sub.receive()
                        got.append(msg.id)
                        await msg.ack()
                with trio.move_on_after(0.5):
                    got.append((await sub.receive()).id)
            assert sorted(got) == sorted(sent), "lost or duplicated messages"
            nursery.cancel_scope.cancel()

    async def test_bad_link_requests_change_nothing(self, tmp_path: Path) -> None:
        """A bad option, a duplicate name or an unknown link is refused with the reason;
        the broker's connectors stay as they were."""
        async with trio.open_nursery() as nursery:
            a, a_uri = await start_node(nursery, make_config(tmp_path / "a", "a"))
            async with connect(a_uri) as conn:
                with pytest.raises(RemoteError, match="network_ttl"):
                    await conn.admin("link.add", name="x", uri="tcp://127.0.0.1:1",
                                     network_ttl="two")
                with pytest.raises(RemoteError, match="no network connector named 'nope'"):
                    await conn.admin("link.del", name="nope")
                await conn.admin("link.add", name="x", uri="tcp://127.0.0.1:1")
                with pytest.raises(RemoteError, match="exists already"):
                    await conn.admin("link.add", name="x", uri="tcp://127.0.0.1:2")
                with pytest.raises(RemoteError, match="unknown admin command"):
                    await conn.admin("shutdown")
                assert [d["name"] for d in (await conn.admin("link.list"))["links"]] == \
                    ["x"]
                assert (await conn.stat())["broker"] == "a"   # the connection lives on
            nursery.cancel_scope.cancel()

    async def test_static_include_added_live(self, tmp_path: Path) -> None:
        """A link added with statically_included forwards that queue with no consumer
        advisory at all (the CLI's --option list form)."""
        async with trio.open_nursery() as nursery:
            a, a_uri = await start_node(nursery, make_config(tmp_path / "a", "a"))
            b, b_uri = await start_node(nursery, make_config(tmp_path / "b", "b"))
            code, out, err = await run_cli("link", "add", a_uri, "st", b_uri, "--option",
                                           "statically_included=queue://Static")
            assert code == 0, err
            assert json.loads(out)["added"][0]["connector"] == "mesh"
            await wait_for(lambda: a.dialers and a.dialers[0].state == "operational")
            async with connect(a_uri) as producer:
                await producer.send("queue://Static", b"s", persistent=True)
            await wait_for(lambda: b.site.broker.destination_sizes()
                           and b.site.broker.destination_sizes()[0][1] == 1)
            code, out, _ = await run_cli("link", "list", a_uri)
            assert code == 0 and json.loads(out)["links"][0]["state"] == "operational"
            code, out, _ = await run_cli("link", "del", a_uri, "st")
            assert code == 0 and json.loads(out)["removed"]
            code, _, err = await run_cli("link", "del", a_uri, "st")
            assert code == 1 and "no network connector named 'st'" in err
            nursery.cancel_scope.cancel()


class TestReload:
    async def test_reload_applies_connectors_policies_and_level(self, tmp_path: Path) -> None:
        """Re-reading the file adds a mesh connector (routing changes live), replaces
        policies on existing destinations and changes the log level."""
        async with trio.open_nursery() as nursery:
            b, b_uri = await start_node(nursery, make_config(tmp_path / "b", "b"))
            path = write(tmp_path / "a.toml", "a", 0)
            a = BrokerNode(load_config(path))
            await nursery.start(a.serve)
            a_uri = a.listen_uris()[0]
            async with connect(a_uri) as producer:
                await producer.send("queue://P", b"1", persistent=True)
            write(path, "a", 0, f'[[policy]]\npattern = "queue://P"\nlocal_only = true\n'
                                   f'[[network_connector]]\nname = "ab"\nuri = "{b_uri}"\n',
                  level="warning")
            result = await a.reload()
            assert "network_connector ab added" in result["changed"]
            assert "policies" in result["changed"] and "logging" in result["changed"]
            await wait_for(lambda: a.dialers and a.dialers[0].state == "operational")
            policy = a.site.broker.policies.for_destination("queue://P")
            assert policy.local_only

            async with connect(b_uri) as consumer:
                sub = await consumer.subscribe("queue://R")
                async with connect(a_uri) as producer:
                    await producer.send("queue://R", b"routed", persistent=True)
                with trio.fail_after(5):
                    assert (await sub.receive()).body == b"routed"
            nursery.cancel_scope.cancel()

    async def test_refused_reloads_leave_the_broker_as_it_was(self, tmp_path: Path) -> None:
        """Malformed TOML, a bad value, or a change of id / data_dir / listeners is
        refused naming the problem, and nothing else in that file is applied."""
        async with trio.open_nursery() as nursery:
            path = write(tmp_path / "a.toml", "a", 0)
            a = BrokerNode(load_config(path))
            await nursery.start(a.serve)
            assert (await a.reload())["changed"] == []
            before = a.config
            mesh = '[[network_connector]]\nname = "m"\nuri = "tcp://127.0.0.1:1"\n'
            cases = [
                ("this is [not toml", "invalid TOML"),
                ('[broker]\nid = "a"\nheartbeat_interval = -1\n', "heartbeat_interval"),
            ]
            for text, why in cases:
                path.write_text(text)
                with pytest.raises(TreefedError, match=why):
                    await a.reload()
                assert a.config == before and a.dialers == []
            write(path, "a2", 0, mesh, data_dir=str(tmp_path / "elsewhere"))
            with pytest.raises(TreefedError, match="broker.id, broker.name, broker.data_dir"):
                await a.reload()
            write(path, "a", free_port(), mesh)
            with pytest.raises(TreefedError, match="broker.listen"):
                await a.reload()
            assert a.config == before and a.dialers == []
            # the same over the wire: Error with the reason, the connection lives on
            async with connect(a.listen_uris()[0]) as conn:
                with pytest.raises(RemoteError, match="cannot change while the broker "
                                                      "runs"):
                    await conn.admin("reload")
                assert (await conn.stat())["connectors"] == []
            nursery.cancel_scope.cancel()


class TestSighup:
    async def test_sighup_reloads_and_reopens_the_log_file(self, tmp_path: Path) -> None:
        """A real `treefed broker` process: SIGHUP after logrotate moved its log makes
        it write a new log file and apply the edited config (a new connector); a bad
        edit is refused and logged, and the broker keeps serving; `treefed reload`
        does the same over the wire."""
        port = free_port()
        log = tmp_path / "broker.log"
        extra = f'file = "{log}"\n'
        path = write(tmp_path / "a.toml", "a", port, extra)
        uri = f"tcp://127.0.0.1:{port}"
        proc = subprocess.Popen([sys.executable, "-m", "treefed.cli", "broker", "--config",
                                 str(path)], env=child_env(), cwd=str(REPO_ROOT),
                                stderr=subprocess.PIPE)
        try:
            ok, why = await wait_ready(uri, client_stat, timeout=20)
            assert ok, why
            log.rename(tmp_path / "broker.log.1")
            write(path, "a", port, extra + '[[network_connector]]\nname = "m"\n'
                                           'uri = "tcp://127.0.0.1:1"\n')
            proc.send_signal(signal.SIGHUP)

            async def has_connector() -> bool:
                return bool((await client_stat(uri))["connectors"])

            with trio.fail_after(10):
                while not await has_connector():
                    await trio.sleep(0.05)
            await wait_for(lambda: log.exists() and "admin.reloaded" in log.read_text())
            assert "broker.listening" in (tmp_path / "broker.log.1").read_text()

            path.write_text("garbage = [")
            proc.send_signal(signal.SIGHUP)
            await wait_for(lambda: "broker.reload_refused" in log.read_text())
            assert (await client_stat(uri))["broker"] == "a"

            write(path, "a", port, extra)
            code, out, err = await run_cli("reload", uri)
            assert code == 0, err
            assert json.loads(out)["changed"] == ["network_connector m removed"]
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(10) == 0, proc.stderr.read().decode()
