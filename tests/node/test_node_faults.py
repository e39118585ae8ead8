"""BrokerNode under faults (issue #7): a full message store, a silent parent, the
heartbeat a client learns from the hello, the replay delay, ``bye`` logging, the
master/slave lock wait of ``run_broker``, and duplicate detection of consumed messages
across a restart."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from treefed.client import connect
from treefed.errors import RemoteError
from treefed.node import BrokerNode
from treefed.node.run import wait_for_lock
from treefed.persistence import SqliteStore, acquire_lock, read_lock
from treefed.transport.framed import FramedStream
from treefed.transport.streams import serve_tcp
from treefed.wire.codec import encode
from treefed.wire.frames import (PROTOCOL_VERSION, Bye, Error, Forward, ForwardAck, Hello)

from tests.node.helpers import RawPeer, make_config, start_node, wait_for

BODY = b"x" * 2000


async def _fill(conn, dst: str = "queue://full") -> tuple[list[str], list[str]]:
    """Persistent sends until three are refused: (confirmed ids, refusal codes)."""
    confirmed, refused = [], []
    for _ in range(2000):
        try:
            confirmed.append(await conn.send(dst, BODY, persistent=True))
        except RemoteError as exc:
            refused.append(exc.code)
            if len(refused) == 3:
                break
    return confirmed, refused


class TestStoreFull:
    async def test_refuses_producers_keeps_serving_and_recovers(self, nursery, tmp_path):
        """At max_store_bytes persistent sends get store_full (the first from a failed
        commit, later ones at the door); nothing refused is ever delivered; acks free
        room and sends are confirmed again."""
        store = SqliteStore(tmp_path / "d", max_bytes=64 * 1024)
        node, uri = await start_node(nursery, make_config(tmp_path / "d"), store=store)
        with trio.fail_after(20):
            async with connect(uri) as conn:
                confirmed, refused = await _fill(conn)
                assert confirmed and refused == ["store_full"] * 3
                stats = await conn.stat()
                assert stats["store_full"] is True
                assert stats["destinations"]["queue://full"]["depth"] == len(confirmed)
                sub = await conn.subscribe("queue://full", prefetch=len(confirmed))
                got = []
                while len(got) < len(confirmed):
                    msg = await sub.receive()
                    got.append(msg.id)
                    await msg.ack()
                assert got == confirmed            # the refused ones never show up
                await conn.stat()                  # the acks are committed
                await conn.send("queue://other", BODY, persistent=True)
                assert (await conn.stat())["store_full"] is False

    async def test_forward_into_a_full_store_closes_the_link_unacked(self, nursery,
                                                                     tmp_path):
        """A peer's persistent forward that cannot be stored is not acked (the peer
        keeps it) and the link is closed with store_full, the broker serving on."""
        store = SqliteStore(tmp_path / "d", max_bytes=64 * 1024)
        node, uri = await start_node(nursery, make_config(tmp_path / "d"), store=store)
        with trio.fail_after(20):
            peer = await RawPeer.open(uri, hello=False)
            await peer.send_raw(encode(Hello(PROTOCOL_VERSION, "broker", broker_id="p",
                                             connector="mesh", link_name="m")))
            assert type((await peer.framed.receive_frames())[0]) is Hello
            acked: list[str] = []
            for i in range(200):
                await peer.send_raw(encode(Forward("queue://in", f"f{i}", ["p"], body=BODY,
                                                   persistent=True)))
                frames = await peer.framed.receive_frames()
                if any(type(f) is Error for f in frames):
                    break
                acked += [i for f in frames if type(f) is ForwardAck for i in f.ids]
            [err] = [f for f in frames if type(f) is Error]
            assert err.code == "store_full" and f"f{i}" not in acked
            assert acked == [f"f{n}" for n in range(i)]
            rest = await peer.frames_until_eof()
            assert not any(type(f) is ForwardAck for f in rest)
            async with connect(uri) as conn:      # still serving
                depth = (await conn.stat())["destinations"]["queue://in"]["depth"]
            assert depth == i
            await peer.aclose()


async def _silent_parent(stream: trio.abc.Stream) -> None:
    """A parent that completes the hello and then never says anything again."""
    framed = FramedStream(stream)
    await framed.receive_frames()
    await framed.send_frames([Hello(PROTOCOL_VERSION, "broker", broker_id="parent",
                                    connector="tree", node_type="root")])
    await trio.sleep_forever()


class TestLiveness:
    async def test_silent_parent_is_dropped_and_redialled(self, nursery, tmp_path):
        """A parent that goes silent after the hello is found dead by heartbeats: the
        connector says why and dials again."""
        port = await nursery.start(serve_tcp, _silent_parent, "127.0.0.1", 0)
        config = make_config(tmp_path, "kid", heartbeat_interval=0.05,
                             tree={"uri": f"failover:(tcp://127.0.0.1:{port})"
                                          "?initialReconnectDelay=10&maxReconnectDelay=50"})
        with capture_logs() as logs, trio.fail_after(10):
            node, _ = await start_node(nursery, config)
            [dialer] = node.dialers
            await wait_for(lambda: dialer.connects >= 2)
        [dead, *_] = [e for e in logs if e["event"] == "conn.dead"]
        assert dead["conn"] == "L:tree:parent" and dead["silent"] >= 0.05

    async def test_client_learns_the_heartbeat_from_the_hello(self, nursery, tmp_path):
        """The broker's hello tells a client its heartbeat interval (none when off)."""
        _, uri = await start_node(nursery, make_config(tmp_path / "a",
                                                       heartbeat_interval=2.5))
        _, quiet = await start_node(nursery, make_config(tmp_path / "b"))
        with trio.fail_after(10):
            async with connect(uri) as conn, connect(quiet) as other:
                assert conn.broker_hello.options == {"heartbeat_interval": 2.5}
                assert other.broker_hello.options == {}

    async def test_bye_is_logged(self, nursery, tmp_path):
        """A peer's bye is logged with its reason before the connection closes."""
        _, uri = await start_node(nursery, make_config(tmp_path))
        with capture_logs() as logs, trio.fail_after(10):
            peer = await RawPeer.open(uri)
            await peer.send_raw(encode(Bye("going home")))
            await peer.frames_until_eof()
            await peer.aclose()
        assert any(e["event"] == "conn.bye" and e["reason"] == "going home" for e in logs)

    def test_replay_delay_comes_from_the_tree_connector(self, tmp_path):
        """[tree_connector] replay_delay reaches the core broker; no tree, no delay."""
        leaf = BrokerNode(make_config(tmp_path, tree={"uri": "tcp://127.0.0.1:9",
                                                      "replay_delay": 3.0}))
        root = BrokerNode(make_config(tmp_path))
        assert (leaf.site.broker.replay_delay, root.site.broker.replay_delay) == (3.0, 0.0)


async def _upstream(uri: str) -> RawPeer:
    """A raw peer that says hello as broker "up" on a mesh link."""
    peer = await RawPeer.open(uri, hello=False)
    await peer.send_raw(encode(Hello(PROTOCOL_VERSION, "broker", broker_id="up",
                                     connector="mesh", link_name="m")))
    assert type((await peer.framed.receive_frames())[0]) is Hello
    return peer


async def _until_forward_ack(peer: RawPeer, msg_id: str) -> None:
    """Read what the broker sends (advisories...) until it acks ``msg_id``."""
    while True:
        for f in await peer.framed.receive_frames():
            if type(f) is ForwardAck and msg_id in f.ids:
                return


class TestConsumedAcrossRestart:
    async def test_reforward_after_restart_is_acked_and_not_delivered_again(self,
                                                                           tmp_path):
        """An upstream broker forwards a persistent message, the local consumer takes
        and acks it; the node stops abruptly and a new one starts on the same data dir;
        the upstream re-sends the same Forward (our ForwardAck "was lost"): it is acked
        and dropped as a duplicate, and the consumer does not get it a second time."""
        data = tmp_path / "data"
        forward = encode(Forward("queue://in", "up-1", ["up"], body=b"once", persistent=True))
        with trio.fail_after(20):
            store = SqliteStore(data)
            try:
                async with trio.open_nursery() as nursery:
                    _, uri = await start_node(nursery, make_config(data), store=store)
                    async with connect(uri) as consumer:
                        sub = await consumer.subscribe("queue://in")
                        peer = await _upstream(uri)
                        await peer.send_raw(forward)
                        msg = await sub.receive()
                        assert (msg.id, msg.body) == ("up-1", b"once")
                        await msg.ack()
                        await consumer.stat()          # the ack's batch is committed
                    await peer.aclose()
                    nursery.cancel_scope.cancel()      # no orderly shutdown
                assert store.load_consumed() == ["up-1"] and store.load() == []
            finally:
                store.close()

            store = SqliteStore(data)
            try:
                async with trio.open_nursery() as nursery:
                    node = BrokerNode(make_config(data), store=store)
                    assert node.restore() == 0
                    addresses = await nursery.start(node.serve)
                    uri = f"tcp://127.0.0.1:{addresses[0][1]}"
                    async with connect(uri) as consumer:
                        sub = await consumer.subscribe("queue://in")
                        peer = await _upstream(uri)
                        await peer.send_raw(forward)
                        await _until_forward_ack(peer, "up-1")
                        # A Deliver of it would have left in the ForwardAck's batch, so
                        # it would be here before the stat reply on the same connection.
                        stats = await consumer.stat()
                        assert sub.queued == 0
                        assert stats["dropped"] == {"duplicate": 1}
                        await peer.aclose()
                    nursery.cancel_scope.cancel()
                assert store.load() == []
            finally:
                store.close()


class TestSlaveLockWait:
    async def test_slave_gets_the_lock_when_the_master_lets_go(self, tmp_path):
        """wait_for_lock polls while the master holds the directory and returns the
        lock (recording the new owner) the moment it is free."""
        master = acquire_lock(tmp_path, owner="hq")
        assert read_lock(tmp_path)[1] == "hq"
        got: list = []

        async def slave() -> None:
            got.append(await wait_for_lock(str(tmp_path), "hq", poll=0.01))

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(slave)
                await trio.testing.wait_all_tasks_blocked()
                assert got == []                      # still waiting
                master.release()
                await wait_for(lambda: got)
        assert got[0].held
        pid, owner = read_lock(tmp_path)
        assert owner == "hq" and pid is not None
        got[0].release()

    @pytest.mark.parametrize("text", ["", "garbage", "12"])
    def test_read_lock_tolerates_any_record(self, tmp_path, text):
        """A missing, foreign or old (pid-only) record reads as unknown owner."""
        if text:
            (tmp_path / "lock").write_text(text)
        pid, owner = read_lock(tmp_path)
        assert owner == "" and pid == (12 if text == "12" else None)
