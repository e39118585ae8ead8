"""The broker's bounded fsync of ack-only commits (issue #14, node/acksync.py): acks
committed without an fsync are synced within ACK_SYNC_S, off the receipt path; an idle
broker does not wake for it; ``[store] ack_sync = "full"`` turns the deferral off."""

from __future__ import annotations

import time

import trio

from treefed.client import connect
from treefed.core.message import Message
from treefed.config import parse_config
from treefed.node import BrokerNode
from treefed.node.acksync import ACK_SYNC_S, AckSyncer
from treefed.persistence import MemoryStore, SqliteStore

from tests.node.helpers import make_config, start_node, wait_for


async def test_consumed_messages_acks_are_synced_within_the_bound(nursery, tmp_path):
    store = SqliteStore(tmp_path / "d", reserve_bytes=0)
    node, uri = await start_node(nursery, make_config(tmp_path / "d"), store=store)
    assert node._ack_syncer is not None
    async with connect(uri) as conn:
        sub = await conn.subscribe("queue://acks", prefetch=10)
        for i in range(5):
            await conn.send("queue://acks", f"m{i}".encode(), persistent=True)
        for _ in range(5):
            msg = await sub.receive()
            await msg.ack()
        await wait_for(lambda: store.stats()["rows"] == 0)
        # the acks' commits were ack-only: written, and fsynced by the syncer soon after
        began = trio.current_time()
        await wait_for(lambda: node._ack_syncer.syncs and not store.sync_pending(),
                       timeout=5 * ACK_SYNC_S + 2)
        assert trio.current_time() - began <= ACK_SYNC_S + 1.0
        synced = node._ack_syncer.syncs
        await trio.sleep(3 * ACK_SYNC_S)   # nothing new: no further sync
        assert node._ack_syncer.syncs == synced


async def test_syncer_waits_the_interval_and_skips_what_a_storing_commit_covered(tmp_path):
    syncs: list[float] = []

    class Store(SqliteStore):
        __slots__ = ()

        def sync(self) -> None:
            syncs.append(time.monotonic())
            super().sync()

    store = Store(tmp_path, reserve_bytes=0)
    syncs.clear()   # the one at opening (what an earlier process left unsynced)
    syncer = AckSyncer(store, log=None, interval=0.05)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(syncer.run)
        await trio.sleep(0.2)
        assert syncs == []                       # idle: asleep on its event
        store.apply([Message("a", "queue://Q", body=b"", persistent=True)], [])
        store.apply([], [("a", "queue://Q")])
        poked = time.monotonic()
        syncer.poke()
        await wait_for(lambda: syncer.syncs, timeout=2)
        assert syncs[0] - poked >= 0.05 - 0.01   # the interval, not at once
        assert not store.sync_pending() and syncer.syncs == 1
        # an ack followed by a storing commit (its fsync covers the ack): nothing to do
        store.apply([Message("b", "queue://Q", body=b"", persistent=True)], [])
        store.apply([], [("b", "queue://Q")])
        store.apply([Message("c", "queue://Q", body=b"", persistent=True)], [])
        syncer.poke()
        await trio.sleep(0.2)
        assert syncer.syncs == 1 and len(syncs) == 1
        nursery.cancel_scope.cancel()
    store.close()


async def test_ack_sync_full_and_memory_store_run_no_syncer(tmp_path):
    config = parse_config({"broker": {"id": "t1", "data_dir": str(tmp_path / "d")},
                           "store": {"ack_sync": "full"}})
    store = SqliteStore(tmp_path / "d", ack_sync=config.store.ack_sync, reserve_bytes=0)
    try:
        assert BrokerNode(config, store=store)._ack_syncer is None
    finally:
        store.close()
    assert BrokerNode(make_config(tmp_path / "m"), store=MemoryStore())._ack_syncer is None


def test_store_section_is_validated_and_dumped(tmp_path):
    import pytest

    from treefed.config import dump_config
    from treefed.errors import ConfigError

    base = {"broker": {"id": "t1", "data_dir": str(tmp_path)}}
    assert parse_config(base).store.ack_sync == "normal"
    with pytest.raises(ConfigError) as info:
        parse_config({**base, "store": {"ack_sync": "sometimes"}})
    assert info.value.key == "store.ack_sync" and '"full"' in str(info.value)
    with pytest.raises(ConfigError):
        parse_config({**base, "store": {"acksync": "full"}})
    full = parse_config({**base, "store": {"ack_sync": "full"}})
    assert '[store]\nack_sync = "full"' in dump_config(full)
    assert "[store]" not in dump_config(parse_config(base))
