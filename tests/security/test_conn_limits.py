"""Per-connection limits (issue #12, defect 7): one client connection may hold only so
many subscriptions, so much prefetch (what it may have in flight) and so many bytes
queued to it, at the broker it is attached to; and at a parent, one client behind a
child link may take only a share of that link's interest cap.  The attack: one client
with 100,000 subscriptions filled the region's per-child cap, so every other consumer at
that store was refused."""

from __future__ import annotations

import pytest
import trio

from treefed.client import connect
from treefed.core.broker import Broker
from treefed.errors import LimitError
from treefed.federation import LinkSettings
from treefed.federation.bridge import client_share
from treefed.federation.testing import Estate
from treefed.wire.codec import encode
from treefed.wire.frames import Advisory, Error, Receipt, Subscribe, Deliver

from tests.node.helpers import RawPeer, make_config, start_node, wait_for

T = 0.0


class TestCoreLimits:
    def test_subscriptions_per_connection(self):
        b = Broker("b", max_subscriptions_per_conn=3)
        for i in range(3):
            b.add_consumer("c1", f"s{i}", f"queue://Q{i}", T)
        with pytest.raises(LimitError) as err:
            b.add_consumer("c1", "s3", "queue://Q3", T)
        assert "max_subscriptions_per_connection" in err.value.message
        b.add_consumer("c2", "s0", "queue://Q3", T)        # another client: unaffected
        b.remove_consumer("c1", "s0", T)
        b.add_consumer("c1", "s3", "queue://Q3", T)        # room again
        # network demand is capped per link by the federation, not here
        for i in range(10):
            b.add_consumer("L:x", f"d{i}", f"queue://Q{i}", T, peer="x")

    def test_prefetch_per_connection_bounds_inflight(self):
        b = Broker("b", max_inflight_per_conn=150)
        b.add_consumer("c1", "a", "queue://A", T, prefetch=100)
        with pytest.raises(LimitError):
            b.add_consumer("c1", "b", "queue://B", T, prefetch=100)
        b.add_consumer("c1", "b", "queue://B", T, prefetch=50)
        b.remove_consumer("c1", "a", T)
        b.add_consumer("c1", "c", "queue://C", T, prefetch=100)


class TestParentShare:
    def test_one_client_cannot_fill_a_childs_cap(self):
        """A child link with cap 8,000: one client gets its share (2,000); another client
        of the same store still registers interest."""
        cap = 8000
        share = client_share(cap)
        assert share == 2000
        e = Estate()
        e.add("A")
        e.add("B")
        assert e.link("A", "B", LinkSettings(duplex=True, max_demand_per_link=cap))
        conn = e.conn_to("B", "A")
        for i in range(share + 50):
            e.inject("B", conn, Advisory("add", f"A/c1/{i}", f"queue://F{i}", "A",
                                         None, 0, []))
        bridge = e.sites["B"].bridge(conn)
        assert len(bridge.remote) == share
        e.inject("B", conn, Advisory("add", "A/c2/x", "queue://Other", "A", None, 0, []))
        assert len(bridge.remote) == share + 1
        e.inject("B", conn, Advisory("remove", "A/c1/0", "queue://F0", "A", None, 0, []))
        e.inject("B", conn, Advisory("add", "A/c1/new", "queue://New", "A", None, 0, []))
        assert ("A/c1/new", ("A",)) in {(k[0], k[1]) for k in bridge.remote}


async def flood(uri: str, n: int) -> tuple[int, int, RawPeer]:
    """One raw client pipelines ``n`` subscriptions: (accepted, refused, the client)."""
    peer = await RawPeer.open(uri)
    data = b"".join(encode(Subscribe(f"s{i}", f"queue://Flood.{i}", prefetch=1))
                    for i in range(n))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer.send_raw, data)
        ok = refused = 0
        while ok + refused < n:
            for frame in await peer.framed.receive_frames():
                if type(frame) is Receipt:
                    ok += 1
                elif type(frame) is Error:
                    refused += 1
    return ok, refused, peer


async def other_consumer_still_served(store_uri: str, region_uri: str, region) -> None:
    async with connect(store_uri) as till, connect(region_uri) as hq:
        sub = await till.subscribe("queue://Store.s1.Orders")
        await wait_for(lambda: region.site.broker.consumers_for("queue://Store.s1.Orders"),
                       timeout=30)
        await hq.send("queue://Store.s1.Orders", b"order-1")
        with trio.fail_after(10):
            assert (await sub.receive()).body == b"order-1"


@pytest.mark.slow
async def test_100k_subscriptions_from_one_client_do_not_refuse_others(nursery,
                                                                       tmp_path):
    """Default limits: the store refuses the flooding client past its own cap, the
    region keeps room, and another client's consumer at that store is served."""
    with trio.fail_after(240):
        region, region_uri = await start_node(nursery, make_config(tmp_path / "r", "region"))
        store, store_uri = await start_node(nursery, make_config(
            tmp_path / "s1", "s1", accept_tree_children=False,
            tree={"node_type": "leaf", "uri": region_uri}))
        await wait_for(lambda: len(region.site.links()) == 1)
        ok, refused, peer = await flood(store_uri, 100_000)
        assert ok == 10_000   # the default max_subscriptions_per_connection
        assert refused == 100_000 - ok
        await other_consumer_still_served(store_uri, region_uri, region)
        await peer.aclose()


@pytest.mark.slow
async def test_store_without_limits_cannot_starve_others_at_the_parent(nursery, tmp_path):
    """The store's own per-connection limit is off; the region's per-child cap (8,000)
    still leaves room: the flooding client gets its share only."""
    with trio.fail_after(120):
        region, region_uri = await start_node(nursery, make_config(tmp_path / "r", "region"))
        store, store_uri = await start_node(nursery, make_config(
            tmp_path / "s1", "s1", accept_tree_children=False,
            max_subscriptions_per_connection=0,
            tree={"node_type": "leaf", "uri": region_uri, "max_interest_per_child": 8000}))
        await wait_for(lambda: len(region.site.links()) == 1)
        ok, refused, peer = await flood(store_uri, 10_000)
        assert (ok, refused) == (10_000, 0)     # the store took them all
        link = region.site.links()[0]
        await wait_for(lambda: region.site.dropped["limit"] >= 10_000 - client_share(8000),
                       timeout=30)
        assert len(link.remote) == client_share(8000)
        await other_consumer_still_served(store_uri, region_uri, region)
        await peer.aclose()


async def test_pending_bytes_per_connection(nursery, tmp_path):
    """A client that stops reading is cut off once 1 MiB of messages is queued to it;
    the producer and other consumers carry on."""
    with trio.fail_after(30):
        node, uri = await start_node(nursery, make_config(
            tmp_path / "b", "b", max_pending_bytes_per_connection=1024 * 1024))
        peer = await RawPeer.open(uri)
        await peer.send_raw(encode(Subscribe("s", "topic://Big", prefetch=100_000)))
        async with connect(uri) as producer, connect(uri) as other:
            sub = await other.subscribe("topic://Big", prefetch=1000)
            await wait_for(lambda: len(node.site.broker.consumers_for("topic://Big")) == 2)
            # the raw peer never reads; its socket buffers fill, then our queue does
            for i in range(200):
                await producer.send("topic://Big", b"x" * 64 * 1024)
            for _ in range(200):
                msg = await sub.receive()
                await msg.ack()
            await wait_for(lambda: len(node.site.broker.consumers_for("topic://Big")) == 1)
        frames = await peer.frames_until_eof(timeout=10)
        errors = [f for f in frames if type(f) is Error]
        assert errors and errors[-1].code == "overflow"
        assert "max_pending_bytes_per_connection" in errors[-1].message
