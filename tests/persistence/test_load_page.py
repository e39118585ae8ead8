"""``SqliteStore.load_page``: the store cursor's read side (issue #14, core/broker.py), and
the store's page cache size (its RSS after a big backlog)."""

from treefed.core.message import Message
from treefed.persistence.sqlite import CACHE_KIB, SqliteStore


def _msg(i: int, dst: str = "queue://A") -> Message:
    return Message(f"p:{i}", dst, {"k": i}, b"body%d" % i, True, 4, float(i))


def test_pages_come_in_store_order_leaving_out_memory_and_other_queues(tmp_path):
    store = SqliteStore(tmp_path / "d")
    try:
        store.apply([_msg(i, "queue://A" if i % 3 else "queue://B") for i in range(30)], [])
        held = {"p:1", "p:2"}                      # in memory: left out
        page, last, done = store.load_page("queue://A", 0, 5, held)
        assert [m.id for m in page] == ["p:4", "p:5", "p:7", "p:8", "p:10"]
        assert not done
        assert page[0].headers == {"k": 4} and page[0].body == b"body4"
        assert page[0].persistent and page[0].timestamp == 4.0
        rest, last2, done = store.load_page("queue://A", last, 100)
        assert [m.id for m in rest] == [f"p:{i}" for i in range(11, 30) if i % 3]
        assert done and last2 > last
        # a row deleted meanwhile (acked) is not read; nothing after the end
        store.apply([], [("p:11", "queue://A")])
        again, _, done = store.load_page("queue://A", last, 1)
        assert [m.id for m in again] == ["p:13"] and not done
        assert store.load_page("queue://A", last2, 10) == ([], 0, True)
    finally:
        store.close()


def test_a_page_can_start_at_the_row_of_an_id(tmp_path):
    store = SqliteStore(tmp_path / "d")
    try:
        store.apply([_msg(i) for i in range(10)], [])
        # from p:6's row on, no exclusion needed (what is held in memory is before it)
        page, _, done = store.load_page("queue://A", 0, 3, {"p:0", "p:1"}, first="p:6")
        assert [m.id for m in page] == ["p:6", "p:7", "p:8"] and not done
        # an id without a row: the exclusion as given
        page, _, _ = store.load_page("queue://A", 0, 2, {"p:0", "p:1"}, first="p:99")
        assert [m.id for m in page] == ["p:2", "p:3"]
    finally:
        store.close()


def test_page_cache_is_bounded(tmp_path):
    store = SqliteStore(tmp_path / "d")
    try:
        assert store._db.execute("PRAGMA cache_size").fetchone()[0] == -CACHE_KIB
        assert CACHE_KIB < 2000          # below SQLite's default 2,000 KiB
    finally:
        store.close()
