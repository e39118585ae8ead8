"""MessageStore contract (run against SqliteStore and MemoryStore), then per-store specifics."""

from __future__ import annotations

import dataclasses
import sqlite3
import tempfile

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from treefed.core.message import Message
from treefed.errors import ConfigError, StoreError
from treefed.persistence import MemoryStore, MessageStore, SqliteStore
from treefed.persistence.sqlite import PRUNE_EVERY

Q = "queue://Store1.Incoming"


def fields(m: Message) -> tuple:
    return tuple(getattr(m, f.name) for f in dataclasses.fields(m))


def msgs(n: int, dst: str = Q, prefix: str = "m") -> list[Message]:
    return [Message(f"{prefix}{i}", dst, body=b"x" * 16, persistent=True) for i in range(n)]


def ids(store: MessageStore) -> list[tuple[str, str]]:
    return [(m.id, m.dst) for m in store.load()]


@pytest.fixture(params=["sqlite", "memory"])
def store(request, tmp_path):
    s = SqliteStore(tmp_path / "data") if request.param == "sqlite" else MemoryStore()
    yield s
    s.close()


class TestMessageStore:
    def test_every_field_round_trips(self, store):
        """Headers, body, expiry, timestamp, reply_to, priority, path, redelivered survive."""
        full = Message(
            id="id-ü-1",
            dst="topic://PRICE.STOCK.IBM",
            headers={"s": "käse", "i": -7, "big": 2**40, "f": 1.25, "t": True, "n": None,
                     "b": b"\x00\xff"},
            body=bytes(range(256)),
            persistent=True,
            priority=9,
            timestamp=1_700_000_000.123456,
            expires=1_700_000_060.5,
            reply_to="temp-queue://c1-reply",
            path=("hq", "region-eu"),
            redelivered=3,
        )
        bare = Message("id-2", Q)
        store.apply([full, bare], [])
        loaded = store.load()
        assert [fields(m) for m in loaded] == [fields(full), fields(bare)]
        assert type(loaded[0].path) is tuple and loaded[0] is not full

    def test_load_is_arrival_order_across_batches_and_deletes(self, store):
        """load() lists rows in first-insert order, unaffected by ids or deleting the newest."""
        store.apply([Message("z", Q), Message("a", Q)], [])
        store.apply([Message("m", Q)], [("m", Q)])
        store.apply([Message("b", Q), Message("c", "queue://Other")], [])
        assert ids(store) == [("z", Q), ("a", Q), ("b", Q), ("c", "queue://Other")]

    def test_group_commit_of_10000_messages(self, store):
        """One apply stores 10,000 messages and loads them all back in order."""
        batch = msgs(10_000)
        store.apply(batch, [])
        assert [m.id for m in store.load()] == [m.id for m in batch]
        assert store.stats()["rows"] == 10_000

    def test_duplicate_insert_is_ignored_and_first_copy_wins(self, store):
        """Re-inserting a stored (id, dst) keeps the batch going and the original row."""
        store.apply([Message("a", Q, body=b"first")], [])
        store.apply([Message("a", Q, body=b"second"), Message("b", Q), Message("b", Q)], [])
        loaded = store.load()
        assert [(m.id, m.body) for m in loaded] == [("a", b"first"), ("b", b"")]

    def test_same_id_on_two_destinations_is_two_rows(self, store):
        """A message fanned out to two destinations is stored and deleted per destination."""
        store.apply([Message("a", Q), Message("a", "topic://T")], [])
        store.apply([], [("a", Q)])
        assert ids(store) == [("a", "topic://T")]

    def test_deletes_remove_only_named_rows_and_absent_rows_are_fine(self, store):
        """Deleting stored rows removes exactly them; deleting unknown rows is a no-op."""
        store.apply(msgs(5), [])
        store.apply([], [("m1", Q), ("m3", Q), ("nope", Q), ("m0", "queue://Other")])
        assert ids(store) == [("m0", Q), ("m2", Q), ("m4", Q)]

    def test_store_and_delete_in_one_batch_leaves_nothing(self, store):
        """Inserts apply before deletes, so a message acked within its own batch is gone."""
        store.apply([Message("a", Q), Message("b", Q)], [("a", Q)])
        assert ids(store) == [("b", Q)]

    def test_redelivered_updates_are_kept(self, store):
        """A redelivery count set through apply() is what load() reports; absent rows ignored."""
        store.apply([Message("a", Q), Message("b", Q, redelivered=1)], [])
        store.apply([], [], redelivered=[("a", Q, 2), ("ghost", Q, 9)])
        store.apply([Message("c", Q)], [("b", Q)], redelivered=[("c", Q, 4)])
        assert [(m.id, m.redelivered) for m in store.load()] == [("a", 2), ("c", 4)]

    def test_load_snapshot_ignores_later_mutation(self, store):
        """Changing a Message's redelivered in memory after storing does not change load()."""
        m = Message("a", Q)
        store.apply([m], [])
        m.redelivered = 5
        assert store.load()[0].redelivered == 0

    def test_empty_apply_changes_nothing(self, store):
        """apply with nothing to do leaves the store as it was."""
        store.apply(msgs(2), [])
        store.apply([], [], redelivered=[])
        assert store.stats()["rows"] == 2

    def test_closed_store_refuses_use(self, store):
        """After close(), calls raise StoreError(code='store_closed'); close is idempotent."""
        store.close()
        store.close()
        with pytest.raises(StoreError) as info:
            store.apply(msgs(1), [])
        assert info.value.code == "store_closed"
        with pytest.raises(StoreError):
            store.load()


class TestConsumedIds:
    """The consumed-id memory (duplicate detection across restarts), both stores."""

    @pytest.fixture(params=["sqlite", "memory"])
    def small(self, request, tmp_path):
        """A store that keeps only the newest 5 consumed ids."""
        s = (SqliteStore(tmp_path / "data", dedup_window=5) if request.param == "sqlite"
             else MemoryStore(dedup_window=5))
        yield s
        s.close()

    def test_consumed_ids_are_kept_oldest_first_with_their_deletes(self, store):
        """Ids given with a batch's deletes are returned by load_consumed in order; a
        batch of consumed ids alone is fine too."""
        assert store.load_consumed() == []
        store.apply(msgs(3), [])
        store.apply([], [("m0", Q), ("m1", Q)], consumed=["m0", "m1"])
        store.apply([], [], consumed=["elsewhere"])
        store.apply([Message("late", Q)], [("m2", Q)], redelivered=[], consumed=["m2"])
        assert store.load_consumed() == ["m0", "m1", "elsewhere", "m2"]
        assert ids(store) == [("late", Q)]

    def test_only_the_newest_window_is_kept(self, small):
        """Past ``dedup_window`` the oldest ids are forgotten, whatever the batch sizes."""
        n = 0
        for size in (1, 3, 7, 2, 11, 1):
            small.apply([], [], consumed=[f"c{i}" for i in range(n, n + size)])
            n += size
            assert small.load_consumed() == [f"c{i}" for i in range(max(0, n - 5), n)]

    def test_window_zero_keeps_nothing(self, tmp_path):
        """dedup_window=0: consumed ids are ignored (the broker keeps none either)."""
        for s in (SqliteStore(tmp_path, dedup_window=0), MemoryStore(dedup_window=0)):
            with s:
                s.apply(msgs(1), [("m0", Q)], consumed=["m0"])
                assert s.load_consumed() == [] and s.stats()["rows"] == 0

    def test_negative_window_is_a_config_error(self, tmp_path):
        """dedup_window below 0 is refused by both stores as a ConfigError."""
        for make in (lambda: SqliteStore(tmp_path, dedup_window=-1),
                     lambda: MemoryStore(dedup_window=-1)):
            with pytest.raises(ConfigError) as info:
                make()
            assert info.value.key == "dedup_window"

    def test_closed_store_refuses_load_consumed(self, store):
        """load_consumed on a closed store raises StoreError(code='store_closed')."""
        store.close()
        with pytest.raises(StoreError) as info:
            store.load_consumed()
        assert info.value.code == "store_closed"

    def test_consumed_ids_survive_close_and_reopen(self, tmp_path):
        """What was committed is there after a reopen; a smaller window on reopen
        returns (and, at the next insert, keeps) only the newest ids."""
        with SqliteStore(tmp_path) as s:
            s.apply(msgs(4), [("m0", Q), ("m1", Q)], consumed=["m0", "m1"])
            s.apply([], [("m2", Q)], consumed=["m2"])
        with SqliteStore(tmp_path) as s:
            assert s.load_consumed() == ["m0", "m1", "m2"]
            assert ids(s) == [("m3", Q)]
        with SqliteStore(tmp_path, dedup_window=2) as s:
            assert s.load_consumed() == ["m1", "m2"]
            s.apply([], [("m3", Q)], consumed=["m3"])
        db = sqlite3.connect(tmp_path / "messages.db")
        rows = [r[0] for r in db.execute("SELECT id FROM consumed ORDER BY seq")]
        db.close()
        assert rows == ["m2", "m3"]

    def test_table_is_pruned_in_bulk(self, tmp_path):
        """The table is trimmed every so often, never growing past window + PRUNE_EVERY
        rows, and load_consumed always returns exactly the newest window."""
        window = PRUNE_EVERY // 2
        with SqliteStore(tmp_path, synchronous="NORMAL", dedup_window=window) as s:
            reader = sqlite3.connect(tmp_path / "messages.db")   # WAL: reads alongside
            for batch in range(12):
                s.apply([], [], consumed=[f"c{batch}-{i}" for i in range(500)])
                n = reader.execute("SELECT count(*) FROM consumed").fetchone()[0]
                assert n < window + PRUNE_EVERY
                got = s.load_consumed()
                assert len(got) == min(window, 500 * (batch + 1))
                assert got[-1] == f"c{batch}-499"
            reader.close()
            assert n < 2 * window + 500   # it really was pruned (12 x 500 inserted)

    def test_failed_batch_keeps_no_consumed_ids(self, tmp_path):
        """Consumed ids are in the batch's transaction: a refused batch (store_full)
        leaves neither its deletes nor its ids."""
        with SqliteStore(tmp_path, max_bytes=128 * 1024) as s:
            s.apply(msgs(50, prefix="keep"), [])
            with pytest.raises(StoreError) as info:
                s.apply([Message(f"big{i}", Q, body=bytes(1000)) for i in range(500)],
                        [("keep0", Q)], consumed=["keep0"])
            assert info.value.code == "store_full"
            assert s.load_consumed() == [] and s.stats()["rows"] == 50
            s.apply([], [("keep0", Q)], consumed=["keep0"])
            assert s.load_consumed() == ["keep0"]

    def test_data_dir_without_the_table_opens_and_gains_it(self, tmp_path):
        """A messages.db written before the consumed table existed (same schema version)
        opens, keeps its messages, and records consumed ids from then on."""
        with SqliteStore(tmp_path) as s:
            s.apply(msgs(2), [])
        db = sqlite3.connect(tmp_path / "messages.db")
        db.execute("DROP TABLE consumed")
        db.commit()
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        db.close()
        assert "consumed" not in tables and "messages" in tables
        with SqliteStore(tmp_path) as s:
            assert ids(s) == [("m0", Q), ("m1", Q)]
            assert s.load_consumed() == []
            s.apply([], [("m0", Q)], consumed=["m0"])
        with SqliteStore(tmp_path) as s:
            assert s.load_consumed() == ["m0"] and ids(s) == [("m1", Q)]


class TestSqliteStore:
    def test_reopen_after_close_keeps_rows_and_order(self, tmp_path):
        """A closed and reopened store loads exactly what was committed, in order."""
        with SqliteStore(tmp_path / "d") as s:
            s.apply(msgs(3), [])
            s.apply([Message("late", Q)], [("m1", Q)], redelivered=[("m2", Q, 7)])
        with SqliteStore(tmp_path / "d") as s:
            assert [(m.id, m.redelivered) for m in s.load()] == [("m0", 0), ("m2", 7), ("late", 0)]
            s.apply([Message("after", Q)], [])
            assert [m.id for m in s.load()][-1] == "after"

    def test_creates_data_dir_and_db_file(self, tmp_path):
        """The constructor creates missing data_dir levels and data_dir/messages.db in WAL."""
        with SqliteStore(tmp_path / "a" / "b", synchronous="NORMAL") as s:
            assert (tmp_path / "a" / "b" / "messages.db").is_file()
            st_ = s.stats()
            assert st_["journal_mode"] == "wal" and st_["synchronous"] == "NORMAL"
            assert st_["disk_bytes"] > 0 and st_["rows"] == 0

    def test_rejects_unknown_synchronous(self, tmp_path):
        """Only FULL and NORMAL are accepted; anything else is a ConfigError."""
        with pytest.raises(ConfigError) as info:
            SqliteStore(tmp_path, synchronous="OFF")
        assert info.value.key == "synchronous"

    def test_non_sqlite_file_is_store_error(self, tmp_path):
        """A messages.db that is not SQLite raises StoreError(code='store_corrupt') naming it."""
        (tmp_path / "messages.db").write_bytes(b"this is not a database " * 200)
        with pytest.raises(StoreError) as info:
            SqliteStore(tmp_path)
        assert info.value.code == "store_corrupt"
        assert "messages.db" in info.value.message

    def test_damaged_pages_are_store_error_on_load(self, tmp_path):
        """Garbage over a valid store's table pages raises StoreError('store_corrupt')."""
        with SqliteStore(tmp_path, synchronous="NORMAL") as s:
            s.apply([Message(f"m{i}", Q, body=bytes(300)) for i in range(2000)], [])
        with open(tmp_path / "messages.db", "r+b") as f:
            f.seek(4096 * 2)
            f.write(b"\xa5" * 4096 * 4)
        with pytest.raises(StoreError) as info:
            with SqliteStore(tmp_path) as s:
                s.load()
        assert info.value.code == "store_corrupt"

    def test_undecodable_payload_is_store_error(self, tmp_path):
        """A row whose blob is not a valid payload makes load() raise 'store_corrupt'."""
        with SqliteStore(tmp_path) as s:
            s.apply([Message("a", Q)], [])
        db = sqlite3.connect(tmp_path / "messages.db")
        db.execute("UPDATE messages SET blob = x'ff00'")
        db.commit()
        db.close()
        with SqliteStore(tmp_path) as s, pytest.raises(StoreError) as info:
            s.load()
        assert info.value.code == "store_corrupt" and "'a'" in info.value.message

    def test_foreign_sqlite_database_is_refused_untouched(self, tmp_path):
        """Another application's SQLite file is refused ('store_foreign') and not modified."""
        db = sqlite3.connect(tmp_path / "messages.db")
        db.execute("CREATE TABLE accounts (name TEXT)")
        db.commit()
        db.close()
        with pytest.raises(StoreError) as info:
            SqliteStore(tmp_path)
        assert info.value.code == "store_foreign"
        db = sqlite3.connect(tmp_path / "messages.db")
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        db.close()
        assert tables == ["accounts"]

    def test_full_store_refuses_whole_batch_and_stays_usable(self, tmp_path):
        """Hitting the size cap raises 'store_full', rolls the batch back, and deletes still work."""
        with SqliteStore(tmp_path, max_bytes=128 * 1024) as s:
            s.apply(msgs(50, prefix="keep"), [])
            with pytest.raises(StoreError) as info:
                s.apply([Message(f"big{i}", Q, body=bytes(1000)) for i in range(500)], [])
            assert info.value.code == "store_full"
            assert s.stats()["rows"] == 50  # nothing of the failed batch was kept
            s.apply([], [(f"keep{i}", Q) for i in range(50)])
            s.apply([Message("fits", Q, body=bytes(1000))], [])
            assert ids(s) == [("fits", Q)]

    async def test_apply_from_worker_thread(self, tmp_path):
        """apply() called via trio.to_thread.run_sync commits data visible to the caller."""
        with trio.fail_after(10):
            with SqliteStore(tmp_path) as s:
                await trio.to_thread.run_sync(s.apply, msgs(100), [])
                await trio.to_thread.run_sync(s.apply, [], [("m0", Q)])
                assert len(s.load()) == 99


# One step of a random workload: (inserted ids, deleted ids, redelivery updates).
_ids = st.sampled_from([f"m{i}" for i in range(8)])
_dsts = st.sampled_from([Q, "topic://T"])
_keys = st.tuples(_ids, _dsts)
_batch = st.tuples(
    st.lists(_keys, max_size=6),
    st.lists(_keys, max_size=4),
    st.lists(st.tuples(_ids, _dsts, st.integers(0, 9)), max_size=3),
)


class TestMemoryStore:
    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(_batch, max_size=6))
    def test_agrees_with_sqlite_on_any_workload(self, batches):
        """For any sequence of batches MemoryStore loads exactly what SqliteStore loads."""
        memory = MemoryStore()
        with tempfile.TemporaryDirectory() as d, SqliteStore(d, synchronous="NORMAL") as sqlite:
            for n, (stores, deletes, updates) in enumerate(batches):
                new = [Message(i, dst, body=f"{n}".encode(), redelivered=n) for i, dst in stores]
                for s in (memory, sqlite):
                    s.apply(new, deletes, redelivered=updates)
            assert [fields(m) for m in memory.load()] == [fields(m) for m in sqlite.load()]
            assert memory.stats()["rows"] == sqlite.stats()["rows"]

    def test_reports_no_disk_use(self):
        """A MemoryStore counts rows and never any bytes on disk."""
        s = MemoryStore()
        s.apply(msgs(3), [])
        assert s.stats() == {"rows": 3, "disk_bytes": 0}
