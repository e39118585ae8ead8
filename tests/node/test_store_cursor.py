"""The store cursor on a real broker and a real SQLite store (issue #14: broker RSS).

A queue holds ``broker.max_page_messages`` waiting persistent messages in memory; the rest
of its backlog is in the store only and is paged back in as consumers take the page.
Every confirmed message is delivered exactly once, in order -- across the page boundary,
after a consumer leaves without acking (redelivery) and after a restart.  Non-persistent
sends wait (producer flow control) while the queue's memory is over
``broker.max_queue_memory_bytes``.  The pure core's side: tests/core/test_store_cursor.py.
"""

from __future__ import annotations

import trio

from treefed.client import connect
from treefed.node import node as node_mod
from treefed.persistence import SqliteStore

from tests.node.helpers import make_config, start_node, wait_for

Q = "queue://cursor"


async def _send(uri: str, first: int, n: int, persistent: bool = True) -> None:
    async with connect(uri, client_id="cursor-producer") as producer:
        for i in range(first, first + n):
            await producer.send(Q, str(i).encode(), persistent=persistent, confirm=False)
        if persistent:
            await producer.wait_confirmed()
        await producer.flush()


async def _take(uri: str, n: int, prefetch: int, ack: bool = True) -> list[int]:
    got = []
    async with connect(uri, client_id="cursor-consumer") as consumer:
        sub = await consumer.subscribe(Q, prefetch=prefetch)
        for _ in range(n):
            msg = await sub.receive()
            got.append(int(msg.body))
            if ack:
                await msg.ack()
    return got


class TestStoreCursor:
    async def test_backlog_past_the_page_is_in_the_store_only_and_comes_back_in_order(
            self, tmp_path):
        with trio.fail_after(30):
            store = SqliteStore(tmp_path / "data")
            try:
                async with trio.open_nursery() as nursery:
                    node, uri = await start_node(
                        nursery, make_config(tmp_path / "data", max_page_messages=20),
                        store=store)
                    await _send(uri, 0, 300)
                    broker = node.site.broker
                    stats = broker.statistics()
                    assert stats["destinations"][Q]["depth"] == 300
                    assert stats["stored_only"] == 280
                    assert len(broker._dests[Q].pending) == 20
                    # redelivery: a consumer takes 30 without acking and leaves
                    assert await _take(uri, 30, prefetch=30, ack=False) == list(range(30))
                    await wait_for(lambda: broker._dests[Q].inflight == 0)
                    assert await _take(uri, 300, prefetch=7) == list(range(300))
                    await wait_for(lambda: broker.statistics()["destinations"][Q]["depth"]
                                   == 0 and broker._dests[Q].inflight == 0)
                    assert broker.statistics()["stored_only"] == 0
                    await wait_for(lambda: store.load() == [])
                    nursery.cancel_scope.cancel()
            finally:
                store.close()

    async def test_restart_in_the_middle_of_a_paged_backlog(self, tmp_path):
        with trio.fail_after(30):
            store = SqliteStore(tmp_path / "data")
            async with trio.open_nursery() as nursery:
                node, uri = await start_node(
                    nursery, make_config(tmp_path / "data", max_page_messages=10),
                    store=store)
                await _send(uri, 0, 100)
                assert await _take(uri, 35, prefetch=5) == list(range(35))
                await wait_for(lambda: node.site.broker._dests[Q].inflight == 0)
                nursery.cancel_scope.cancel()
            store.close()
            store = SqliteStore(tmp_path / "data")
            try:
                async with trio.open_nursery() as nursery:
                    config = make_config(tmp_path / "data", max_page_messages=10)
                    node = node_mod.BrokerNode(config, store=store)
                    assert node.restore() == 65
                    addresses = await nursery.start(node.serve)
                    uri = f"tcp://127.0.0.1:{addresses[0][1]}"
                    await _send(uri, 100, 20)          # behind the restored ones
                    assert await _take(uri, 85, prefetch=4) == list(range(35, 120))
                    nursery.cancel_scope.cancel()
            finally:
                store.close()

    async def test_non_persistent_producer_waits_for_room(self, tmp_path):
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                node, uri = await start_node(
                    nursery, make_config(tmp_path / "data",
                                         max_queue_memory_bytes=20_000))
                broker = node.site.broker
                done = trio.Event()

                async def produce() -> None:
                    # bodies the kernel's socket buffers cannot hold all of: 2,000 short
                    # ones (~140 KB) fit in them, so the producer could "finish" while
                    # parked and the check below raced the kernel (issue #14, session 8)
                    async with connect(uri, client_id="cursor-producer") as producer:
                        for i in range(2000):
                            await producer.send(Q, str(i).encode().ljust(4096),
                                                confirm=False)
                        await producer.flush()
                    done.set()

                async with connect(uri, client_id="cursor-consumer") as consumer:
                    sub = await consumer.subscribe(Q, prefetch=50)
                    nursery.start_soon(produce)
                    await wait_for(lambda: broker.statistics()["parked"])   # it waits
                    d = broker._dests[Q]
                    assert sum(m.nbytes for m in d.pending) <= 20_000 + 100
                    assert not done.is_set()
                    got = []
                    for _ in range(2000):
                        msg = await sub.receive()
                        got.append(int(msg.body))
                        await msg.ack()
                    assert got == list(range(2000))
                await done.wait()
                nursery.cancel_scope.cancel()

    async def test_a_waiting_producer_keeps_its_connection_through_heartbeats(
            self, tmp_path):
        # the broker does not read a paused producer, so it cannot answer its pings: it
        # pings the producer instead, each interval, and the client sees it alive
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                node, uri = await start_node(
                    nursery, make_config(tmp_path / "data", heartbeat_interval=0.2,
                                         max_queue_memory_bytes=5_000))
                broker = node.site.broker
                async with connect(uri, client_id="cursor-consumer") as consumer:
                    sub = await consumer.subscribe(Q, prefetch=1)
                    async with connect(uri, client_id="cursor-producer") as producer:
                        for i in range(300):
                            await producer.send(Q, str(i).encode(), confirm=False)
                        await wait_for(lambda: broker.statistics()["parked"])
                        await trio.sleep(1.5)          # > 2 heartbeat intervals paused
                        got = []
                        for _ in range(300):
                            msg = await sub.receive()
                            got.append(int(msg.body))
                            await msg.ack()
                        assert got == list(range(300))
                        await producer.flush()
                        assert await producer.stat()   # still connected
                nursery.cancel_scope.cancel()
