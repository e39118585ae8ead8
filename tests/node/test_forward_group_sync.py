"""Forwards synced in groups (issue #14): a broker that receives forwarded persistent
messages commits them without an fsync and sends their ForwardAcks only once an fsync of
its WAL covers them — so the upstream keeps its copy until the downstream's is durable
against power loss, and the downstream's fsyncs are shared by the forwards of a moment.
A client's Receipt is never held: its commit (or an explicit sync) fsyncs first."""

from __future__ import annotations

import threading

import trio

from treefed.client import connect
from treefed.persistence import SqliteStore

from tests.node.helpers import make_config, start_node, wait_for


def _fast(uri: str) -> str:
    return f"failover:({uri})?initialReconnectDelay=20&maxReconnectDelay=100"


class GatedStore(SqliteStore):
    """A SqliteStore whose ``sync()`` (the syncer's fdatasync of the WAL) waits for a
    gate; counts the syncs that ran."""

    __slots__ = ("gate", "syncs_done")

    def __init__(self, *args, **kwargs) -> None:
        self.gate = threading.Event()
        self.gate.set()   # open for the sync at opening
        self.syncs_done = 0
        super().__init__(*args, **kwargs)
        self.gate.clear()
        self.syncs_done = 0

    def sync(self) -> None:
        self.gate.wait(10)
        super().sync()
        self.syncs_done += 1


def _rows(store: SqliteStore, dst: str) -> int:
    return sum(m.dst == dst for m in store.load())


async def _root_and_leaf(nursery, tmp_path, leaf_store):
    root_store = SqliteStore(tmp_path / "r", reserve_bytes=0)
    root, root_uri = await start_node(nursery, make_config(tmp_path / "r", "root"),
                                      store=root_store)
    leaf, leaf_uri = await start_node(nursery, make_config(
        tmp_path / "l", "leaf", accept_tree_children=False,
        tree={"node_type": "leaf", "uri": _fast(root_uri)}), store=leaf_store)
    await wait_for(lambda: leaf.dialers[0].state == "operational")
    return root, root_store, root_uri, leaf, leaf_uri


async def test_forward_ack_waits_for_the_downstream_fsync(nursery, tmp_path):
    leaf_store = GatedStore(tmp_path / "l", reserve_bytes=0)
    with trio.fail_after(20):
        root, root_store, root_uri, leaf, leaf_uri = await _root_and_leaf(
            nursery, tmp_path, leaf_store)
        async with connect(leaf_uri) as consumer, connect(root_uri) as producer:
            sub = await consumer.subscribe("queue://Store.leaf.in", prefetch=10)
            await wait_for(lambda: root.site.statistics()["demand"] >= 1)
            for i in range(3):
                await producer.send("queue://Store.leaf.in", f"m{i}".encode(),
                                    persistent=True)
            # the leaf committed them (no fsync) and delivers them at once ...
            for i in range(3):
                msg = await sub.receive()
                assert msg.body == f"m{i}".encode()
            assert leaf_store.stores_mark() > 0
            assert not leaf_store.synced_past(leaf_store.stores_mark())
            # ... but the root keeps its copies: no ForwardAck before the fsync
            await trio.sleep(0.3)
            assert root_store.stats()["rows"] == 3
            assert leaf._sync_held
            leaf_store.gate.set()   # the group fsync runs: the acks go, the root deletes
            await wait_for(lambda: root_store.stats()["rows"] == 0)
            assert leaf_store.syncs_done >= 1 and not leaf._sync_held
    leaf_store.gate.set()


async def test_a_receipt_is_never_held_and_its_fsync_releases_the_acks(nursery, tmp_path):
    leaf_store = GatedStore(tmp_path / "l", reserve_bytes=0)
    with trio.fail_after(20):
        root, root_store, root_uri, leaf, leaf_uri = await _root_and_leaf(
            nursery, tmp_path, leaf_store)
        async with connect(leaf_uri) as consumer, connect(root_uri) as producer, \
                connect(leaf_uri) as local:
            sub = await consumer.subscribe("queue://Store.leaf.in", prefetch=10)
            await wait_for(lambda: root.site.statistics()["demand"] >= 1)
            await producer.send("queue://Store.leaf.in", b"forwarded", persistent=True)
            assert (await sub.receive()).body == b"forwarded"
            await trio.sleep(0.2)
            assert _rows(root_store, "queue://Store.leaf.in") == 1 and leaf._sync_held  # shut
            # a local client's persistent send is confirmed without the syncer: its
            # commit fsyncs the WAL, which covers the forward too -> its ack goes
            with trio.fail_after(5):
                await local.send("queue://Store.leaf.local", b"mine", persistent=True)
            assert leaf_store.synced_past(leaf_store.stores_mark())
            # (the local message itself climbs to the root: only the forward's row counts)
            await wait_for(lambda: not _rows(root_store, "queue://Store.leaf.in"))
            assert not leaf._sync_held
    leaf_store.gate.set()


async def test_memory_store_and_ack_sync_full_ack_at_once(nursery, tmp_path):
    """No grouping where every commit fsyncs (ack_sync="full"): the ForwardAck leaves
    right after the commit, as before."""
    leaf_store = SqliteStore(tmp_path / "l", reserve_bytes=0, ack_sync="full")
    with trio.fail_after(20):
        root, root_store, root_uri, leaf, leaf_uri = await _root_and_leaf(
            nursery, tmp_path, leaf_store)
        assert not leaf._group_forwards
        async with connect(leaf_uri) as consumer, connect(root_uri) as producer:
            sub = await consumer.subscribe("queue://Store.leaf.in", prefetch=10)
            await wait_for(lambda: root.site.statistics()["demand"] >= 1)
            await producer.send("queue://Store.leaf.in", b"x", persistent=True)
            assert (await sub.receive()).body == b"x"
            await wait_for(lambda: root_store.stats()["rows"] == 0)
            assert leaf_store.stores_mark() == 0


async def test_syncer_waits_the_group_window_unless_many_acks_wait(tmp_path):
    from treefed.core.message import Message
    from treefed.node.acksync import AckSyncer

    store = SqliteStore(tmp_path, reserve_bytes=0)
    synced: list[int] = []
    syncer = AckSyncer(store, log=None, interval=30, urgent_interval=0.5,
                       on_synced=lambda: synced.append(store.stores_mark()))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(syncer.run)
        store.apply([Message("a", "queue://Q", body=b"", persistent=True)], [],
                    durable=False)
        syncer.poke(urgent=True)        # the group window (0.5 s here), not the interval
        await trio.sleep(0.2)
        assert synced == []
        await wait_for(lambda: synced, timeout=2)
        assert store.synced_past(synced[0])
        store.apply([Message("b", "queue://Q", body=b"", persistent=True)], [],
                    durable=False)
        syncer.poke(urgent=True, now=True)   # many acks held: no window
        with trio.fail_after(0.4):
            await wait_for(lambda: len(synced) == 2, timeout=0.4)
        assert store.synced_past(store.stores_mark())
        nursery.cancel_scope.cancel()
    store.close()
