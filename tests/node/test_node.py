"""BrokerNode over real sockets on 127.0.0.1: messaging, group commit, flow control,
slow consumers, shutdown, restore, and broker links (tree and mesh)."""

from __future__ import annotations

import threading

import pytest
import trio
from structlog.testing import capture_logs

from treefed.client import ConnectionClosed, connect
from treefed.node import node as node_mod
from treefed.persistence import MemoryStore, SqliteStore
from treefed.wire.codec import encode
from treefed.wire.frames import PROTOCOL_VERSION, Bye, Deliver, Error, Hello, Ping, Subscribe

from tests.node.helpers import RawPeer, make_config, port_of, start_node, wait_for


class GatedStore:
    """A store whose commits block until ``gate`` is set (runs in the node's worker
    thread, so the node's event loop keeps going)."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def load(self):
        return self.inner.load()

    def apply(self, stores, deletes, redelivered=()):
        self.entered.set()
        self.gate.wait(10)
        self.inner.apply(stores, deletes, redelivered)

    def close(self):
        self.inner.close()


class TestBrokerNode:
    async def test_send_and_receive(self, nursery, tmp_path):
        """A message sent by one client reaches another client's subscription."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path))
            async with connect(uri) as consumer, connect(uri) as producer:
                sub = await consumer.subscribe("queue://orders")
                msg_id = await producer.send("queue://orders", b"hello",
                                             headers={"kind": "test"})
                msg = await sub.receive()
                assert (msg.id, msg.body, msg.headers) == (msg_id, b"hello", {"kind": "test"})
                await msg.ack()

    async def test_queue_competing_consumers(self, nursery, tmp_path):
        """Two consumers of one queue share its messages: each message goes to exactly
        one of them and both get some."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path))
            async with connect(uri) as a, connect(uri) as b, connect(uri) as producer:
                sub_a = await a.subscribe("queue://work", prefetch=1)
                sub_b = await b.subscribe("queue://work", prefetch=1)
                got: dict[str, list[str]] = {"a": [], "b": []}

                async def drain(name, sub):
                    async for msg in sub:
                        got[name].append(msg.body.decode())
                        await msg.ack()

                async with trio.open_nursery() as inner:
                    inner.start_soon(drain, "a", sub_a)
                    inner.start_soon(drain, "b", sub_b)
                    for i in range(40):
                        await producer.send("queue://work", str(i).encode())
                    await wait_for(lambda: len(got["a"]) + len(got["b"]) == 40)
                    inner.cancel_scope.cancel()
                assert sorted(got["a"] + got["b"], key=int) == [str(i) for i in range(40)]
                assert got["a"] and got["b"]

    async def test_topic_fan_out(self, nursery, tmp_path):
        """Every subscriber of a topic (wildcards included) gets every message."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path))
            async with connect(uri) as a, connect(uri) as b, connect(uri) as producer:
                sub_a = await a.subscribe("topic://PRICE.>")
                sub_b = await b.subscribe("topic://PRICE.STOCK.IBM")
                for i in range(5):
                    await producer.send("topic://PRICE.STOCK.IBM", str(i).encode())
                for sub in (sub_a, sub_b):
                    bodies = []
                    for _ in range(5):
                        msg = await sub.receive()
                        bodies.append(msg.body)
                        await msg.ack()
                    assert bodies == [b"0", b"1", b"2", b"3", b"4"]

    async def test_persistent_receipt_only_after_commit(self, nursery, tmp_path):
        """A persistent send is confirmed only once the store transaction committed (or
        its consumer acked it first: tests/node/test_early_dispatch.py).  Its delivery to
        a local consumer may leave before the commit (concurrent store and dispatch)."""
        store = GatedStore()
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path), store=store)
            async with connect(uri) as consumer, connect(uri) as producer:
                sub = await consumer.subscribe("queue://durable")
                done = trio.Event()

                async def send():
                    await producer.send("queue://durable", b"keep", persistent=True)
                    done.set()

                nursery.start_soon(send)
                await wait_for(store.entered.is_set)
                await trio.sleep(0.05)   # give a wrongly early receipt time to arrive
                assert not done.is_set()
                assert len(producer.unconfirmed()) == 1
                store.gate.set()
                await done.wait()
                assert [m.body for m in store.inner.load()] == [b"keep"]
                msg = await sub.receive()
                assert msg.persistent and msg.body == b"keep"

    async def test_group_commit_batches_many_messages(self, nursery, tmp_path):
        """Pipelined persistent sends share transactions: far fewer commits than
        messages, every one confirmed."""
        store = SqliteStore(tmp_path / "db")
        try:
            with trio.fail_after(20):
                node, uri = await start_node(nursery, make_config(tmp_path), store=store)
                async with connect(uri) as producer:
                    for i in range(2000):
                        await producer.send("queue://gc", b"m", persistent=True,
                                            confirm=False)
                    await producer.wait_confirmed()
                    assert producer.confirmed_total == 2000
                assert node.commits < 500
                assert len(store.load()) == 2000
        finally:
            store.close()

    async def test_stat_reports_node_and_destinations(self, nursery, tmp_path):
        """stat returns listeners, connections and per-destination depth/enqueued."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path, "statbroker"))
            async with connect(uri) as conn:
                for _ in range(3):
                    await conn.send("queue://depth", b"x")
                stats = await conn.stat()
            assert stats["broker"] == "statbroker"
            assert stats["listeners"] == [uri]
            assert stats["destinations"]["queue://depth"]["depth"] == 3
            assert stats["destinations"]["queue://depth"]["enqueued"] == 3
            assert any(c["kind"] == "client" for c in stats["conns"])

    async def test_blocked_producer_paused_then_resumed(self, nursery, tmp_path):
        """A full destination with limit_behaviour=block pauses its producer; when a
        consumer makes room every message arrives, in order."""
        config = make_config(tmp_path, policies=[
            {"pattern": "queue://fc.>", "max_messages": 5, "limit_behaviour": "block"}])
        with trio.fail_after(10):
            node, uri = await start_node(nursery, config)
            async with connect(uri) as producer, connect(uri) as consumer:
                for i in range(20):
                    await producer.send("queue://fc.a", str(i).encode())
                await wait_for(lambda: any(c["paused"] for c in node.statistics()["conns"]))
                assert node.statistics()["destinations"]["queue://fc.a"]["depth"] == 5
                sub = await consumer.subscribe("queue://fc.a", prefetch=2)
                bodies = []
                for _ in range(20):
                    msg = await sub.receive()
                    bodies.append(msg.body.decode())
                    await msg.ack()
                assert bodies == [str(i) for i in range(20)]
                await wait_for(lambda: not any(c["paused"]
                                               for c in node.statistics()["conns"]))

    async def test_slow_consumer_closed_on_overflow(self, nursery, tmp_path, monkeypatch):
        """A client that stops reading is closed with an overflow error once its queue
        passes the high-water mark; other clients keep working."""
        monkeypatch.setattr(node_mod, "CLIENT_HIGH_WATER", 20)
        with trio.fail_after(20):
            node, uri = await start_node(nursery, make_config(tmp_path))
            slow = await RawPeer.open(uri)
            await slow.send_raw(encode(Subscribe("s1", "queue://flood", None, 100_000)))
            async with connect(uri) as producer:
                body = b"z" * 65536
                for _ in range(400):
                    await producer.send("queue://flood", body)
                    await producer.flush()
                    if "c1" not in {c["conn"] for c in node.statistics()["conns"]}:
                        break
                await wait_for(lambda: "c1" not in {c["conn"]
                                                    for c in node.statistics()["conns"]})
                error = await slow.error_and_close(timeout=15)
                assert error.code == "overflow"
                assert (await producer.stat())["broker"] == "t1"
            await slow.aclose()

    async def test_shutdown_says_bye_and_serve_returns(self, tmp_path):
        """shutdown() sends bye to every client, closes them and ends serve()."""
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                node, uri = await start_node(nursery, make_config(tmp_path))
                peer = await RawPeer.open(uri)
                await node.shutdown()
                frames = await peer.frames_until_eof()
                assert any(type(f) is Bye for f in frames)
                await peer.aclose()
            # leaving the nursery proves serve() returned by itself

    async def test_restore_after_restart(self, tmp_path):
        """Confirmed persistent messages are back on their queue after the node is
        stopped abruptly and a new one restores from the same SQLite store."""
        with trio.fail_after(15):
            store = SqliteStore(tmp_path / "data")
            async with trio.open_nursery() as nursery:
                node, uri = await start_node(nursery, make_config(tmp_path / "data"),
                                             store=store)
                async with connect(uri) as producer:
                    for i in range(3):
                        await producer.send("queue://keep", str(i).encode(),
                                            persistent=True)
                nursery.cancel_scope.cancel()
            store.close()
            store = SqliteStore(tmp_path / "data")
            try:
                async with trio.open_nursery() as nursery:
                    config = make_config(tmp_path / "data")
                    node = node_mod.BrokerNode(config, store=store)
                    assert node.restore() == 3
                    addresses = await nursery.start(node.serve)
                    uri = f"tcp://127.0.0.1:{addresses[0][1]}"
                    async with connect(uri) as consumer:
                        sub = await consumer.subscribe("queue://keep")
                        bodies = []
                        for _ in range(3):
                            msg = await sub.receive()
                            bodies.append(msg.body)
                            await msg.ack()
                        assert bodies == [b"0", b"1", b"2"]
                    nursery.cancel_scope.cancel()
            finally:
                store.close()


def _fast(uri: str, scheme: str = "failover") -> str:
    return f"{scheme}:({uri})?initialReconnectDelay=20&maxReconnectDelay=100"


class TestLinks:
    async def test_tree_leaf_message_climbs_to_root_consumer(self, nursery, tmp_path):
        """A message sent at a leaf with no local consumer goes up to the root's."""
        with trio.fail_after(10):
            root, root_uri = await start_node(nursery, make_config(tmp_path / "r", "root"))
            leaf, leaf_uri = await start_node(nursery, make_config(
                tmp_path / "l", "leaf", accept_tree_children=False,
                tree={"node_type": "leaf", "uri": _fast(root_uri)}))
            await wait_for(lambda: leaf.dialers[0].state == "operational")
            async with connect(root_uri) as consumer, connect(leaf_uri) as producer:
                sub = await consumer.subscribe("queue://HQ.inbox")
                await producer.send("queue://HQ.inbox", b"from-store")
                msg = await sub.receive()
                assert msg.body == b"from-store"
                await msg.ack()

    async def test_tree_root_message_reaches_leaf_consumer(self, nursery, tmp_path):
        """A leaf consumer's interest travels up, so a message sent at the root is
        forwarded down to it."""
        with trio.fail_after(10):
            root, root_uri = await start_node(nursery, make_config(tmp_path / "r", "root"))
            leaf, leaf_uri = await start_node(nursery, make_config(
                tmp_path / "l", "leaf", accept_tree_children=False,
                tree={"node_type": "leaf", "uri": _fast(root_uri)}))
            await wait_for(lambda: leaf.dialers[0].state == "operational")
            async with connect(leaf_uri) as consumer, connect(root_uri) as producer:
                sub = await consumer.subscribe("queue://Store.leaf.in")
                await wait_for(lambda: root.site.statistics()["demand"] >= 1)
                await producer.send("queue://Store.leaf.in", b"to-store")
                msg = await sub.receive()
                assert msg.body == b"to-store"
                await msg.ack()
                stats = await consumer.stat()
                assert stats["connectors"][0]["state"] == "operational"
                assert stats["connectors"][0]["peer"] == "root"

    async def test_tree_refusal_recorded_and_retried(self, nursery, tmp_path):
        """A leaf dialing another leaf is refused with an error on both sides; the
        dialer keeps retrying and shows the refusal as its last error."""
        with trio.fail_after(10):
            leaf1, uri1 = await start_node(nursery, make_config(
                tmp_path / "a", "leaf1", accept_tree_children=False))
            leaf2, _ = await start_node(nursery, make_config(
                tmp_path / "b", "leaf2", accept_tree_children=False,
                tree={"node_type": "leaf", "uri": _fast(uri1)}))
            dialer = leaf2.dialers[0]
            await wait_for(lambda: dialer.last_error and dialer.attempts >= 3)
            assert dialer.last_error.startswith("tree_refused: ")
            assert "not a branch or root" in dialer.last_error
            assert dialer.state != "operational"
            assert leaf1.site.links() == [] and leaf2.site.links() == []
            # the accepting side refuses too, with its own reason, in an error frame
            peer = await RawPeer.open(uri1, hello=False)
            await peer.send_raw(encode(Hello(PROTOCOL_VERSION, "broker", broker_id="leaf3",
                                             connector="tree", node_type="leaf",
                                             link_name="tree")))
            error = await peer.error_and_close()
            assert error.code == "tree_refused"
            assert "does not accept tree children" in error.message
            await peer.aclose()

    async def test_tree_link_comes_back_after_parent_restart(self, nursery, tmp_path):
        """When the parent goes away and returns on the same port, the leaf reconnects
        and its consumer's interest is replayed."""
        with trio.fail_after(15):
            async with trio.open_nursery() as root_nursery:
                root, root_uri = await start_node(root_nursery,
                                                  make_config(tmp_path / "r", "root"))
                leaf, leaf_uri = await start_node(nursery, make_config(
                    tmp_path / "l", "leaf", accept_tree_children=False,
                    tree={"node_type": "leaf", "uri": _fast(root_uri)}))
                await wait_for(lambda: leaf.dialers[0].state == "operational")
                root_nursery.cancel_scope.cancel()
            await wait_for(lambda: leaf.dialers[0].state != "operational")
            async with connect(leaf_uri) as consumer:
                sub = await consumer.subscribe("queue://Store.leaf.back")
                root, _ = await start_node(nursery, make_config(
                    tmp_path / "r", "root", listen=[f"tcp://127.0.0.1:{port_of(root_uri)}"]))
                await wait_for(lambda: leaf.dialers[0].connects == 2)
                await wait_for(lambda: root.site.statistics()["demand"] >= 1)
                async with connect(root_uri) as producer:
                    await producer.send("queue://Store.leaf.back", b"again")
                msg = await sub.receive()
                assert msg.body == b"again"

    async def test_mesh_duplex_link_carries_both_ways(self, nursery, tmp_path):
        """A duplex network connector forwards to consumers on either side."""
        with trio.fail_after(10):
            b, b_uri = await start_node(nursery, make_config(tmp_path / "b", "b"))
            a, a_uri = await start_node(nursery, make_config(tmp_path / "a", "a", mesh=[
                {"name": "ab", "uri": _fast(b_uri, "static"), "duplex": True}]))
            await wait_for(lambda: a.dialers[0].state == "operational" and b.site.links())
            async with connect(a_uri) as at_a, connect(b_uri) as at_b:
                sub_b = await at_b.subscribe("queue://mesh.q")
                sub_a = await at_a.subscribe("queue://mesh.r")
                await wait_for(lambda: a.site.statistics()["demand"] >= 1
                               and b.site.statistics()["demand"] >= 1)
                await at_a.send("queue://mesh.q", b"a->b")
                await at_b.send("queue://mesh.r", b"b->a")
                assert (await sub_b.receive()).body == b"a->b"
                assert (await sub_a.receive()).body == b"b->a"

    async def test_link_peer_error_frame_closes_link(self, nursery, tmp_path):
        """A peer that sends a non-hello first frame on a link gets an error and the
        dialer records it (the link never comes up)."""
        with trio.fail_after(10):
            async def fake_parent(stream):
                await stream.send_all(encode(Error("nope", "go away")))
                await stream.aclose()

            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            port = listeners[0].socket.getsockname()[1]
            nursery.start_soon(trio.serve_listeners, fake_parent, listeners)
            leaf, _ = await start_node(nursery, make_config(
                tmp_path, "leaf", accept_tree_children=False,
                tree={"node_type": "leaf", "uri": _fast(f"tcp://127.0.0.1:{port}")}))
            dialer = leaf.dialers[0]
            await wait_for(lambda: dialer.last_error and "go away" in dialer.last_error)
            assert dialer.connects == 0


class TestClientsAfterClose:
    async def test_client_sees_closed_after_broker_bye(self, nursery, tmp_path):
        """A plain tcp:// client whose broker shuts down fails later calls with
        ConnectionClosed instead of hanging."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path))
            async with connect(uri) as conn:
                await node.shutdown()
                await wait_for(lambda: not conn.connected)
                with pytest.raises(ConnectionClosed):
                    await conn.stat()

    async def test_deliver_to_raw_subscriber(self, nursery, tmp_path):
        """The wire contract seen by a raw peer: Receipt for the subscribe, then a
        Deliver frame carrying the message."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path))
            peer = await RawPeer.open(uri)
            await peer.send_raw(encode(Subscribe("s9", "queue://raw")))
            async with connect(uri) as producer:
                await producer.send("queue://raw", b"r")
            frames: list = []
            while not any(type(f) is Deliver for f in frames):
                frames += await peer.framed.receive_frames()
            deliver = next(f for f in frames if type(f) is Deliver)
            assert (deliver.sub, deliver.body, deliver.dst) == ("s9", b"r", "queue://raw")
            await peer.aclose()


class TestHeartbeatsAndLogs:
    async def test_silent_link_pinged_then_closed(self, nursery, tmp_path):
        """An idle broker link is pinged every heartbeat interval and closed after
        two silent intervals."""
        with trio.fail_after(10):
            root, uri = await start_node(nursery, make_config(tmp_path, "root",
                                                              heartbeat_interval=0.05))
            child = await RawPeer.open(uri, hello=False)
            await child.send_raw(encode(Hello(PROTOCOL_VERSION, "broker", broker_id="kid",
                                              connector="tree", node_type="leaf",
                                              link_name="tree")))
            await wait_for(lambda: root.site.links())
            frames = await child.frames_until_eof()
            assert type(frames[0]) is Hello and frames[0].broker_id == "root"
            assert any(type(f) is Ping for f in frames)
            await wait_for(lambda: not root.site.links())
            await child.aclose()

    async def test_silent_client_dropped_answering_client_kept(self, nursery, tmp_path):
        """Clients are pinged too: one that never answers is torn down after two
        intervals, while a library client (which answers pings) stays connected."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path,
                                                              heartbeat_interval=0.05))
            async with connect(uri) as live:
                silent = await RawPeer.open(uri)
                frames = await silent.frames_until_eof()
                assert any(type(f) is Ping for f in frames)
                await silent.aclose()
                assert live.connected
                assert (await live.stat())["broker"] == "t1"

    @pytest.mark.parametrize("message_events", [False, True])
    async def test_log_lines_bind_broker_and_gate_message_events(self, message_events,
                                                                 nursery, tmp_path):
        """Every log line carries the broker id; per-message events appear only with
        logging.message_events."""
        with capture_logs() as logs, trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(
                tmp_path, "logbroker", message_events=message_events))
            async with connect(uri) as conn:
                sub = await conn.subscribe("queue://logged")
                await conn.send("queue://logged", b"x")
                await (await sub.receive()).ack()
                await conn.stat()
        events = {line["event"] for line in logs}
        assert {"broker.listening", "consumer.added"} <= events
        assert all(line.get("broker") == "logbroker" for line in logs)
        assert ("message.produced" in events) is message_events
        assert ("message.delivered" in events) is message_events
