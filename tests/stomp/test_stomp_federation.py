"""STOMP clients as first-class citizens of the federation: a STOMP subscription at a
store is interest that travels the tree (and the mesh), and a STOMP persistent send at a
store survives the store broker's kill -9 on its way to a native consumer at HQ."""

from __future__ import annotations

import json

import pytest
import trio

from treefed.client import connect
from treefed.transport.ports import free_port

from tests.node.helpers import BrokerProcess
from tests.stomp.helpers import Client, start_stomp_node, stomp_doc, wait_for


def _settled(node, dst: str) -> bool:
    """Nothing pending or in flight for ``dst`` at ``node`` now."""
    figures = node.site.broker.statistics()["destinations"][dst]
    return figures["inflight"] == 0 and figures["depth"] == 0


def _fast(uri: str, scheme: str = "failover") -> str:
    return f"{scheme}:({uri})?initialReconnectDelay=20&maxReconnectDelay=100"


class TestThroughTheTree:
    @pytest.mark.parametrize("mode", ["tree", "mesh"])
    async def test_stomp_consumer_at_store_gets_native_send_from_hq(self, nursery,
                                                                    tmp_path, mode):
        """A STOMP SUBSCRIBE at a store creates demand at HQ like a native one; a native
        send at HQ is forwarded down and arrives as MESSAGE with its headers; an ACK
        settles it at both brokers."""
        with trio.fail_after(30):
            hq, hq_uri, _ = await start_stomp_node(nursery, stomp_doc(tmp_path / "hq", "hq"))
            store_doc = stomp_doc(tmp_path / "s1", "s1", accept_tree_children=False)
            if mode == "tree":
                store_doc["tree_connector"] = {"node_type": "leaf", "uri": _fast(hq_uri)}
            else:
                store_doc["network_connector"] = [{"name": "up", "duplex": True,
                                                   "uri": _fast(hq_uri, "static")}]
            store, _, port = await start_stomp_node(nursery, store_doc)
            await wait_for(lambda: store.dialers[0].state == "operational")
            till = await Client(port).connect()
            await till.subscribe("/queue/Store.s1.Prices", "p", ack="client-individual",
                                 receipt="r")
            await till.receipt("r")
            await wait_for(lambda: hq.site.statistics()["demand"] >= 1)
            async with connect(hq_uri) as pricing:
                await pricing.send("queue://Store.s1.Prices", b"EAN 123: 1.99",
                                   headers={"sku": "123"}, persistent=True)
            [m] = await till.messages(1)
            assert (m.body, m.headers["sku"], m.headers["destination"]) == (
                "EAN 123: 1.99", "123", "/queue/Store.s1.Prices")
            await till.call(till.conn.ack, m.headers["ack"], receipt="ra")
            await till.receipt("ra")
            for node in (hq, store):   # a fresh snapshot each poll: HQ settles when the
                #                          store's ForwardAck arrives, after the receipt
                await wait_for(lambda node=node: _settled(node, "queue://Store.s1.Prices"))
            await till.disconnect()


def _stomp_port(log_path) -> int | None:
    for line in log_path.read_text().splitlines():
        if '"broker.listening"' in line:
            uri = json.loads(line)["uri"]
            if uri.startswith("stomp://"):
                return int(uri.rsplit(":", 1)[1])
    return None


class TestKillDashNine:
    @pytest.mark.slow
    async def test_stomp_persistent_sends_survive_store_sigkill(self, nursery, tmp_path):
        """Persistent STOMP sends confirmed by RECEIPT at a store whose parent is down are
        all delivered, once each and in order, to a native consumer at HQ after the store
        broker was killed with -9 and restarted."""
        hq_port = free_port()
        config = tmp_path / "store.toml"
        config.write_text(
            f'[broker]\nid = "s1"\ndata_dir = "{tmp_path / "s1"}"\n'
            'listen = ["tcp://127.0.0.1:0", "stomp://127.0.0.1:0"]\n'
            'heartbeat_interval = 0.0\naccept_tree_children = false\n'
            '[tree_connector]\nnode_type = "leaf"\n'
            f'uri = "{_fast(f"tcp://127.0.0.1:{hq_port}")}"\n'
            '[logging]\nlevel = "info"\n', encoding="utf-8")
        store = BrokerProcess(config, tmp_path / "store.log")
        try:
            with trio.fail_after(60):
                await trio.to_thread.run_sync(store.start)
                await wait_for(lambda: _stomp_port(store.log_path), 10)
                till = await Client(_stomp_port(store.log_path)).connect()
                for i in range(20):
                    await till.send("/queue/HQ.Sales", f"sale {i}", persistent="true",
                                    receipt=f"r{i}", till="7")
                await till.receipt("r19")
                assert len(till.rec.receipts) == 20
                await trio.to_thread.run_sync(store.kill)
                await trio.to_thread.run_sync(store.start)   # same data_dir: restores
                hq_doc = stomp_doc(tmp_path / "hq", "hq",
                                   listen=[f"tcp://127.0.0.1:{hq_port}"])
                hq, hq_uri, _ = await _start_plain(nursery, hq_doc)
                async with connect(hq_uri) as sales:
                    sub = await sales.subscribe("queue://HQ.Sales")
                    got = []
                    while len(got) < 20:
                        msg = await sub.receive()
                        assert msg.headers["till"] == "7"
                        got.append(msg.body.decode())
                        await msg.ack()
                    assert got == [f"sale {i}" for i in range(20)]
                    await trio.sleep(0.3)
                    assert sub.queued == 0
        finally:
            store.cleanup()


async def _start_plain(nursery, doc):
    from treefed.config import parse_config
    from treefed.node import BrokerNode
    node = BrokerNode(parse_config(doc))
    (host, port), *_ = await nursery.start(node.serve)
    return node, f"tcp://{host}:{port}", None
