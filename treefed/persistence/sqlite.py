"""SqliteStore: persistent messages in ``<data_dir>/messages.db`` (stdlib sqlite3, WAL).

Theory of operation
-------------------
One table, one row per (msg id, dst)::

    messages(seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT, dst TEXT,
             redelivered INTEGER, blob BLOB, UNIQUE(id, dst))

``seq`` is the arrival order (AUTOINCREMENT so a number is never reused, even after the
newest row is deleted); ``redelivered`` sits in its own column so a nack costs an UPDATE of
one integer rather than a re-encode; ``blob`` is a CBOR array of every other Message field
(see ``_encode``) — compact, and the codec the wire already uses.

A second table, ``consumed(seq INTEGER PRIMARY KEY, id TEXT)``, remembers the ids of
queue messages a local consumer acked (``apply(..., consumed=)``, in the same
transaction as their deletes) so a restarted broker still drops a late re-forwarded copy
(``load_consumed``).  Only the newest ``dedup_window`` ids matter: every few thousand
inserts one range DELETE on ``seq`` trims the rest.  It is created IF NOT EXISTS, so a
data dir written before it existed opens (schema version stays 1) and gains it.

Checkpoints off the receipt path (issue #14).  ``apply`` never checkpoints on its own
(``wal_autocheckpoint=0``): a commit is a WAL append and, with FULL, one fsync of the WAL —
nothing else.  Once about ``CHECKPOINT_BYTES`` were committed, ``checkpoint_due()`` says so
and the caller runs ``checkpoint()`` (PASSIVE: copy the WAL into the database, fsync it;
the next commit restarts the WAL from its beginning) when it suits it — the node does it
in the worker thread right after the batch's receipts are queued, so they leave while the
checkpoint runs.  A caller that never does is covered: at ``2 * CHECKPOINT_BYTES`` behind,
``apply`` checkpoints after its commit, so the WAL stays bounded (the reserve covers it).

Durability: each ``apply`` is one explicit transaction (BEGIN ... COMMIT, executemany per
kind) so a whole batch pays for one commit.  The journal is WAL.  With
``synchronous="FULL"`` (default) the WAL is fsynced at every commit that stores a message:
a confirmed message survives kill -9 *and* power loss.  ``"NORMAL"`` fsyncs only at
checkpoints: a commit is still in the OS page cache when ``apply`` returns, which survives
kill -9 of the broker but not an OS crash.  bench/store_commit.py measures the price of each.

Ack-only commits (issue #14, the owners' decision).  A transaction that inserts no message
— only deletes (acks, forward acks, expiry), redelivery counts and consumed ids — is
committed with ``synchronous=NORMAL`` (set on the connection for that transaction only)
when ``ack_sync="normal"`` (the default): written to the WAL, not fsynced.  What that
means:

* kill -9 of the broker loses nothing: the WAL frames are in the OS page cache and the
  next open replays them;
* a power loss (or OS crash) may lose the acks of the last moments, so those messages are
  delivered again (``redelivered``) — at-least-once, as with ActiveMQ's asynchronous acks;
  a message whose receipt was sent is never lost: its insert's commit was fsynced;
* an ack is durable at the next commit that stores a message (that commit's fsync of the
  WAL covers every frame before it) or at ``sync()``, which fdatasyncs the WAL file and
  which the node runs at most ``ACK_SYNC_S`` seconds after an ack-only commit, off the
  receipt path (node/acksync.py).  ``sync_pending()`` says whether such frames exist.

Forwards synced in groups (issue #14).  ``apply(..., durable=False)`` commits stores
the same way (NORMAL, no fsync); the node uses it for a batch whose every stored message
came in a Forward from another broker and which answers no client's send, and holds
the batch's ForwardAcks until an fsync covers it: ``stores_mark()`` names the newest
such commit, ``synced_past(mark)`` says when ``sync()`` or a later storing commit (whose
WAL fsync covers every earlier frame) made it durable.  The upstream broker keeps its
copy until then, so a confirmed message is always fsynced somewhere.  Opening a store
fsyncs the WAL once: a killed process may have left such frames in the page cache only.

``ack_sync="full"`` restores an fsync per ack-only commit too.  Under ``synchronous=
"NORMAL"`` nothing is fsynced per commit anyway and ``ack_sync`` changes nothing.  This
halves the fsyncs per message where a consumer acks each one and at every hop of a chain
(each hop deletes its copy when the next one's ForwardAck arrives).

Failures: sqlite3 exceptions are translated here, once, into ``StoreError`` with a code —
``store_full`` (disk full or ``max_bytes`` reached; the broker refuses producers and keeps
running), ``store_corrupt`` (not a database, malformed pages, undecodable payload),
``store_foreign`` (some other application's SQLite file), ``store_version``, ``store_busy``,
``store_io``, ``store_closed``.  A failed ``apply`` is rolled back whole, and the store
remains usable (deletes can free the space a refused insert lacked).

Full disk (issue #12, defect 4).  Next to the database lies ``reserve``, a preallocated
file of ``reserve_bytes`` that no insert can use.  A WAL database needs free space to
*delete* (the WAL grows), so on a full disk acks would fail and every restart would
re-deliver acked messages.  When a transaction without inserts (deletes, redelivery
counts, consumed ids) fails with ``store_full``, the store releases the reserve, commits
it, checkpoints and truncates the WAL (the pages go back to the database file, whose
growth the reserve also covers: checkpoints run every ``CHECKPOINT_BYTES`` written, far
less than the reserve) and tries to take the reserve back.  ``room()`` says whether inserts
may be tried again: the reserve is held (re-taken if it can be) and the disk, or the
``max_bytes`` cap, leaves ``ROOM_MARGIN`` bytes; the node polls it while it refuses
producers, and at start-up, so a restarted broker on a full disk refuses producers
rather than failing, and accepts them once space returns.

Start-up and identity (issue #12, defect 12).  ``<data_dir>/broker-id`` records the broker
that owns the directory (written once the schema exists).  A store opened with another
``broker_id`` is refused (``store_identity``).  A 0-byte ``messages.db`` — a truncated
store, whose messages are gone — and a missing one in a directory that has a
``broker-id`` are refused (``store_empty`` / ``store_missing``) unless ``init=True``
(``treefed broker --init``), which starts an empty store there.

The connection is opened with ``check_same_thread=False`` because the node calls ``apply``
from ``trio.to_thread.run_sync``; callers guarantee one thread at a time.  The store never
takes the master/slave lock itself (see lock.py) and never deletes its files.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

import cbor2

from treefed.core.message import Message
from treefed.errors import ConfigError, StoreError
from treefed.persistence.base import MessageStore

__all__ = ["SqliteStore", "DB_NAME", "PRUNE_EVERY", "RESERVE_NAME", "RESERVE_BYTES",
           "IDENTITY_NAME", "ROOM_MARGIN", "CHECKPOINT_BYTES", "ACK_SYNC"]

DB_NAME = "messages.db"
#: preallocated file whose space only deletes may use (see "Full disk")
RESERVE_NAME = "reserve"
RESERVE_BYTES = 8 * 1024 * 1024
#: the id of the broker that owns the data directory
IDENTITY_NAME = "broker-id"
#: free bytes (disk, or under ``max_bytes``) below which ``room()`` says no
ROOM_MARGIN = 256 * 1024
#: WAL bytes (estimated per commit) between background checkpoints: bounds what a
#: checkpoint adds to the database file, which the reserve must cover
CHECKPOINT_BYTES = 2 * 1024 * 1024
#: SQLite's page cache, KiB (its default is 2,000): the broker appends at the end of the
#: table, deletes at its head and pages a queue in from its cursor (core/broker.py), and
#: the kernel's page cache holds the rest; after a 100,000-message backlog the default's
#: 2 MiB stayed resident in the store thread's heap (issue #14: broker RSS).
CACHE_KIB = 512
_ROW_OVERHEAD = 128
_COMMIT_PAGES_BYTES = 3 * 4096

# Written into the SQLite header so a foreign database is refused rather than extended.
_APPLICATION_ID = 0x74726664  # "trfd"
_SCHEMA_VERSION = 1
_SYNCHRONOUS = ("FULL", "NORMAL")
#: ``ack_sync`` values: "normal" = ack-only commits are not fsynced (see "Ack-only
#: commits"), "full" = every commit is (under synchronous="FULL")
ACK_SYNC = ("normal", "full")

_SCHEMA = """
CREATE TABLE messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL,
    dst TEXT NOT NULL,
    redelivered INTEGER NOT NULL,
    blob BLOB NOT NULL,
    UNIQUE (id, dst)
)"""
_SYNC_PRAGMA = {"FULL": "PRAGMA synchronous=FULL", "NORMAL": "PRAGMA synchronous=NORMAL"}
_INSERT = "INSERT OR IGNORE INTO messages (id, dst, redelivered, blob) VALUES (?, ?, ?, ?)"
_UPDATE = "UPDATE messages SET redelivered = ? WHERE id = ? AND dst = ?"
_DELETE = "DELETE FROM messages WHERE id = ? AND dst = ?"
_SELECT = "SELECT id, dst, redelivered, blob FROM messages ORDER BY seq"
_SELECT_PAGE = ("SELECT seq, id, redelivered, blob FROM messages WHERE dst = ? AND seq > ? "
                "ORDER BY seq LIMIT ?")
_SELECT_SEQ = "SELECT seq FROM messages WHERE id = ? AND dst = ?"
_SELECT_BLOB = "SELECT blob FROM messages WHERE id = ? AND dst = ?"
# Consumed ids (duplicate detection across restarts).  ``seq`` is the rowid: the newest
# row is never deleted, so max(seq) - window keeps exactly the newest ``window`` ids.
_CONSUMED_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS consumed (seq INTEGER PRIMARY KEY, id TEXT NOT NULL)"
)
_REMEMBER = "INSERT INTO consumed (id) VALUES (?)"
_PRUNE = "DELETE FROM consumed WHERE seq <= (SELECT max(seq) FROM consumed) - ?"
_SELECT_CONSUMED = (
    "SELECT id FROM (SELECT seq, id FROM consumed ORDER BY seq DESC LIMIT ?) ORDER BY seq"
)
#: Consumed ids inserted between two prunes (at most; less for a smaller window).
PRUNE_EVERY = 4096

# Primary result codes (the low byte of an extended code) and what they mean for the broker.
_CODES = {
    sqlite3.SQLITE_FULL: "store_full",
    sqlite3.SQLITE_CORRUPT: "store_corrupt",
    sqlite3.SQLITE_NOTADB: "store_corrupt",
    sqlite3.SQLITE_BUSY: "store_busy",
    sqlite3.SQLITE_LOCKED: "store_busy",
    sqlite3.SQLITE_IOERR: "store_io",
    sqlite3.SQLITE_CANTOPEN: "store_io",
    sqlite3.SQLITE_READONLY: "store_io",
    sqlite3.SQLITE_PERM: "store_io",
}


def _encode(m: Message) -> bytes:
    # Field order is the on-disk format of schema version 1: append only, never reorder.
    return cbor2.dumps(
        (m.headers, m.body, m.persistent, m.priority, m.timestamp, m.expires, m.reply_to, m.path)
    )


def _store_error(exc: Exception, path: Path, doing: str) -> StoreError:
    """Translate a sqlite3 (or cbor2) exception into a StoreError naming the file."""
    errcode = getattr(exc, "sqlite_errorcode", None)
    if errcode is not None:
        code = _CODES.get(errcode & 0xFF, "store")
    elif "database or disk is full" in str(exc):  # older sqlite3 modules lack the code
        code = "store_full"
    elif isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
        code = "store_corrupt"
    else:
        code = "store"
    hint = {
        "store_full": " (disk full or store size limit reached)",
        "store_corrupt": " (the file is not a usable treefed message store)",
    }.get(code, "")
    return StoreError(f"message store {path}: {doing} failed: {exc}{hint}", code=code)


class SqliteStore(MessageStore):
    """A MessageStore in ``data_dir/messages.db``; creates ``data_dir`` if missing.

    ``synchronous``: "FULL" (durable against power loss) or "NORMAL" (against process
    crash only).  ``ack_sync``: "normal" (ack-only commits are not fsynced until the next
    storing commit or ``sync()``; see "Ack-only commits") or "full" (fsynced each).  ``max_bytes``: cap on the database size (0 = the disk is the limit);
    reaching it raises StoreError(code="store_full") exactly as a full disk does.
    ``dedup_window``: how many consumed ids ``load_consumed`` returns (the Broker's
    window; 0 = none are kept).  ``reserve_bytes``: space kept for deletes on a full disk
    (0 = none).  ``broker_id``: the owner recorded in the directory (None = not checked);
    ``init``: accept a 0-byte or missing ``messages.db`` as a new, empty store.
    """

    __slots__ = ("data_dir", "path", "synchronous", "journal_mode", "dedup_window",
                 "max_bytes", "reserve_bytes", "broker_id", "_reserve_held",
                 "_written", "_checkpointed",
                 "_prune_every", "_since_prune", "_db",
                 "ack_sync", "deferred_sync", "_sync_mode", "_lazy_commits", "_synced",
                 "_stores_mark")

    def __init__(
        self, data_dir: str | os.PathLike[str], *, synchronous: str = "FULL", max_bytes: int = 0,
        dedup_window: int = 100_000, reserve_bytes: int = RESERVE_BYTES,
        broker_id: str | None = None, init: bool = False, ack_sync: str = "normal",
    ) -> None:
        if synchronous not in _SYNCHRONOUS:
            raise ConfigError("synchronous", f"must be one of {_SYNCHRONOUS}, got {synchronous!r}")
        if ack_sync not in ACK_SYNC:
            raise ConfigError("ack_sync", f"must be one of {ACK_SYNC}, got {ack_sync!r}")
        self.ack_sync = ack_sync
        #: ack-only commits skip their fsync (FULL store, ack_sync="normal")
        self.deferred_sync = synchronous == "FULL" and ack_sync == "normal"
        self._sync_mode = synchronous   # the connection's PRAGMA synchronous right now
        self._lazy_commits = 0          # ack-only commits not fsynced, ever (a counter)
        self._synced = 0                # ``_lazy_commits`` covered by an fsync of the WAL
        self._stores_mark = 0           # ``_lazy_commits`` after the last unsynced store
        if max_bytes < 0:
            raise ConfigError("max_bytes", f"must be >= 0, got {max_bytes}")
        if dedup_window < 0:
            raise ConfigError("dedup_window", f"must be >= 0, got {dedup_window}")
        if reserve_bytes < 0:
            raise ConfigError("reserve_bytes", f"must be >= 0, got {reserve_bytes}")
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / DB_NAME
        self.synchronous = synchronous
        self.dedup_window = dedup_window
        self.max_bytes = max_bytes
        self.reserve_bytes = reserve_bytes
        self.broker_id = broker_id
        self._reserve_held = False
        self._written = 0           # bytes committed (payload + overhead), ever
        self._checkpointed = 0      # ``_written`` when the last complete checkpoint began
        # Prune at most every PRUNE_EVERY inserts (a small window: every ``window``), so
        # the table holds fewer than window + PRUNE_EVERY rows.  What an earlier run left
        # is unknown: the first insert after opening prunes.
        self._prune_every = max(1, min(PRUNE_EVERY, dedup_window))
        self._since_prune = self._prune_every
        self._db: sqlite3.Connection | None = None
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create data directory {self.data_dir}: {exc}", code="store_io"
            ) from exc
        recorded = self._check_start(broker_id, init)
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise _store_error(exc, self.path, "open") from exc
        try:
            # The first statement reads the header: a non-SQLite file fails right here.
            self.journal_mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            db.execute(f"PRAGMA synchronous={synchronous}")
            db.execute("PRAGMA wal_autocheckpoint=0")   # see checkpoint()
            db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            if max_bytes:
                page_size = db.execute("PRAGMA page_size").fetchone()[0]
                db.execute(f"PRAGMA max_page_count={max(1, max_bytes // page_size)}")
            self._init_schema(db)
        except sqlite3.Error as exc:
            db.close()
            raise _store_error(exc, self.path, "open") from exc
        except BaseException:
            db.close()
            raise
        self._db = db
        if broker_id and recorded is None:
            self._record_identity(broker_id)
        self._take_reserve()
        if self.deferred_sync:
            # what a killed process committed without an fsync (acks, grouped forwards)
            # is in the page cache only: make it durable before anything is confirmed
            # on the strength of it (a re-forwarded duplicate is acked at once)
            self.sync()

    # ------------------------------------------------------------ start-up checks
    def _check_start(self, broker_id: str | None, init: bool) -> str | None:
        """Refuse another broker's directory and a truncated or vanished store (see
        "Start-up and identity"); returns the recorded owner (None: none yet)."""
        recorded = None
        try:
            recorded = (self.data_dir / IDENTITY_NAME).read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            pass
        except (OSError, UnicodeDecodeError) as exc:
            raise StoreError(f"cannot read {self.data_dir / IDENTITY_NAME}: {exc}",
                             code="store_io") from exc
        if broker_id and recorded and recorded != broker_id:
            raise StoreError(
                f"data directory {self.data_dir} belongs to broker {recorded!r}, not "
                f"{broker_id!r}; refusing to open another broker's message store",
                code="store_identity")
        try:
            size: int | None = self.path.stat().st_size
        except FileNotFoundError:
            size = None
        except OSError as exc:
            raise StoreError(f"cannot stat {self.path}: {exc}", code="store_io") from exc
        if size == 0 and not init:
            raise StoreError(
                f"message store {self.path} is empty (0 bytes): whatever it held is gone. "
                "Refusing to start on it as if nothing had been stored; start with --init "
                "to accept an empty store",
                code="store_empty")
        if size is None and recorded and not init:
            raise StoreError(
                f"message store {self.path} of broker {recorded!r} is missing; refusing to "
                "start as if nothing had been stored; start with --init to begin an empty "
                "store", code="store_missing")
        if size == 0:   # init: a 0-byte file is a new database; so are its stale journals
            for suffix in ("", "-wal", "-shm"):
                try:
                    os.unlink(f"{self.path}{suffix}")
                except FileNotFoundError:
                    pass
        return recorded or None

    def _record_identity(self, broker_id: str) -> None:
        target = self.data_dir / IDENTITY_NAME
        tmp = self.data_dir / f".{IDENTITY_NAME}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(broker_id + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except OSError as exc:
            raise StoreError(f"cannot record the broker id in {target}: {exc}",
                             code="store_io") from exc

    # ------------------------------------------------------------ the reserve
    def _take_reserve(self) -> bool:
        """Hold ``reserve_bytes`` of disk in the reserve file; False when the disk has
        not that much free (nothing is kept then)."""
        if self._reserve_held or not self.reserve_bytes:
            self._reserve_held = True   # nothing to hold when reserve_bytes is 0
            return True
        path = self.data_dir / RESERVE_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            return False
        try:
            os.posix_fallocate(fd, 0, self.reserve_bytes)
            os.fsync(fd)
        except OSError:
            os.close(fd)
            try:
                os.unlink(path)
            except OSError:
                pass
            return False
        os.close(fd)
        self._reserve_held = True
        return True

    def _release_reserve(self) -> None:
        try:
            os.unlink(self.data_dir / RESERVE_NAME)
        except FileNotFoundError:
            pass
        except OSError:
            return
        self._reserve_held = False

    def _checkpoint(self, db: sqlite3.Connection) -> None:
        """Copy the WAL into the database and truncate it (frees its disk space)."""
        self._checkpoint_with(db, "TRUNCATE")

    def room(self) -> bool:
        """May inserts be tried again?  The reserve is held (taken back if the disk
        allows) and the disk — or ``max_bytes`` — leaves ``ROOM_MARGIN`` bytes free."""
        db = self._conn()
        if not self._reserve_held:
            self._checkpoint(db)
            if not self._take_reserve():
                return False
        try:
            st = os.statvfs(self.data_dir)
            page_size, pages, free, cap = (
                db.execute(f"PRAGMA {name}").fetchall()[0][0]
                for name in ("page_size", "page_count", "freelist_count", "max_page_count"))
        except (OSError, sqlite3.Error):
            return False
        # pages freed by deletes are reused before the file grows
        if st.f_bavail * st.f_frsize + free * page_size < ROOM_MARGIN:
            return False
        if self.max_bytes:
            if (cap - pages + free) * page_size < min(ROOM_MARGIN, self.max_bytes // 4):
                return False
        return True

    def _init_schema(self, db: sqlite3.Connection) -> None:
        app_id = db.execute("PRAGMA application_id").fetchone()[0]
        if app_id == _APPLICATION_ID:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version != _SCHEMA_VERSION:
                raise StoreError(
                    f"message store {self.path} has schema version {version}; this treefed "
                    f"reads version {_SCHEMA_VERSION}",
                    code="store_version",
                )
            # Added after version 1 shipped: older data dirs gain it (a no-op otherwise).
            db.execute(_CONSUMED_SCHEMA)
            return
        if app_id != 0 or db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            raise StoreError(
                f"{self.path} is an SQLite database of another application, not a treefed "
                "message store; refusing to modify it",
                code="store_foreign",
            )
        db.execute("BEGIN IMMEDIATE")
        db.execute(_SCHEMA)
        db.execute(_CONSUMED_SCHEMA)
        db.execute(f"PRAGMA application_id={_APPLICATION_ID}")
        db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
        db.execute("COMMIT")

    def _conn(self) -> sqlite3.Connection:
        db = self._db
        if db is None:
            raise StoreError(f"message store {self.path} is closed", code="store_closed")
        return db

    def load(self) -> list[Message]:
        db = self._conn()
        try:
            rows = db.execute(_SELECT).fetchall()
        except sqlite3.Error as exc:
            raise _store_error(exc, self.path, "load") from exc
        decode = self._decode
        return [decode(msg_id, dst, redelivered, blob)
                for msg_id, dst, redelivered, blob in rows]

    def load_bodies(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], bytes]:
        """The bodies of the stored messages ``(id, dst)`` (rows not found are left
        out): the broker pages waiting persistent bodies out of memory and reads them
        back here before they are delivered (issue #12, defect 8)."""
        db = self._conn()
        out: dict[tuple[str, str], bytes] = {}
        try:
            for key in keys:
                row = db.execute(_SELECT_BLOB, key).fetchone()
                if row is not None:
                    out[key] = cbor2.loads(row[0])[1]
        except sqlite3.Error as exc:
            raise _store_error(exc, self.path, "load bodies") from exc
        except (cbor2.CBORError, ValueError, TypeError, IndexError) as exc:
            raise StoreError(f"message store {self.path}: a stored payload is "
                             f"undecodable: {exc}", code="store_corrupt") from exc
        return out

    def load_page(self, dst: str, after: int, n: int, exclude: Collection[str] = (),
                  first: str | None = None) -> tuple[list[Message], int, bool]:
        """Up to ``n`` stored messages of ``dst`` after store seq ``after``, oldest first,
        leaving out the ids in ``exclude``: the broker's store cursor (core/broker.py)
        pages a queue's backlog back in from here.  ``first``: start at the row of this
        id instead, without ``exclude`` (when it has no row: ``exclude`` as given).
        Returns ``(messages, seq of the last one (0: none), exhausted)``; ``exhausted``:
        no more rows of ``dst`` after them."""
        db = self._conn()
        if first is not None:
            try:
                row = db.execute(_SELECT_SEQ, (first, dst)).fetchone()
            except sqlite3.Error as exc:
                raise _store_error(exc, self.path, "load a page") from exc
            if row is not None:
                after, exclude = row[0] - 1, ()
        limit = n + len(exclude)
        try:
            rows = db.execute(_SELECT_PAGE, (dst, after, limit)).fetchall()
        except sqlite3.Error as exc:
            raise _store_error(exc, self.path, "load a page") from exc
        out: list[Message] = []
        last = 0
        loads = cbor2.loads
        for seq, msg_id, redelivered, blob in rows:
            if exclude and msg_id in exclude:
                continue
            if len(out) == n:
                return out, last, False
            try:
                headers, body, persistent, priority, timestamp, expires, reply_to, path = (
                    loads(blob))
            except (cbor2.CBORError, ValueError, TypeError):
                self._decode(msg_id, dst, redelivered, blob)   # raises the StoreError
                raise
            out.append(Message(msg_id, dst, headers, body, persistent, priority, timestamp,
                               expires, reply_to, tuple(path), redelivered))
            last = seq
        return out, last, len(rows) < limit

    def _decode(self, msg_id: str, dst: str, redelivered: int, blob: bytes) -> Message:
        try:
            headers, body, persistent, priority, timestamp, expires, reply_to, path = (
                cbor2.loads(blob)
            )
        except (cbor2.CBORError, ValueError, TypeError) as exc:  # wrong shape: Value/TypeError
            raise StoreError(
                f"message store {self.path}: payload of {msg_id!r} for {dst} is "
                f"undecodable: {exc}",
                code="store_corrupt",
            ) from exc
        return Message(id=msg_id, dst=dst, headers=headers, body=body, persistent=persistent,
                       priority=priority, timestamp=timestamp, expires=expires,
                       reply_to=reply_to, path=tuple(path), redelivered=redelivered)

    def load_consumed(self) -> list[str]:
        """The newest ``dedup_window`` consumed ids, oldest first."""
        db = self._conn()
        if not self.dedup_window:
            return []
        try:
            return [row[0] for row in db.execute(_SELECT_CONSUMED, (self.dedup_window,))]
        except sqlite3.Error as exc:
            raise _store_error(exc, self.path, "load consumed ids") from exc

    def apply(
        self,
        stores: Sequence[Message],
        deletes: Sequence[tuple[str, str]],
        redelivered: Iterable[tuple[str, str, int]] = (),
        consumed: Sequence[str] = (),
        *,
        durable: bool = True,
    ) -> None:
        """See MessageStore.apply.  ``durable=False`` (issue #14, "Forwards synced in
        groups"): commit the stores without fsyncing the WAL, like an ack-only commit —
        the caller must not confirm them to anyone until ``synced_past(mark)`` for the
        ``stores_mark()`` read after this call."""
        db = self._conn()
        if consumed and not self.dedup_window:
            consumed = ()
        redelivered = list(redelivered)
        if not stores and not deletes and not redelivered and not consumed:
            return
        try:
            self._apply_once(db, stores, deletes, redelivered, consumed, durable)
        except StoreError as exc:
            if exc.code != "store_full" or stores:
                raise
            # Nothing inserted: deletes (acks) must succeed even on a full disk — spend
            # the reserve on them, then give the WAL's space back (see "Full disk").
            self._checkpoint(db)
            self._release_reserve()
            self._apply_once(db, stores, deletes, redelivered, consumed)
            self._checkpoint(db)
            self._take_reserve()

    def _apply_once(self, db: sqlite3.Connection, stores: Sequence[Message],
                    deletes: Sequence[tuple[str, str]],
                    redelivered: Sequence[tuple[str, str, int]],
                    consumed: Sequence[str], durable: bool = True) -> None:
        # an ack-only commit, or forwards synced later in a group: no fsync
        lazy = (not stores or not durable) and self.deferred_sync
        changes = db.total_changes
        if self.deferred_sync:
            mode = "NORMAL" if lazy else "FULL"
            if mode != self._sync_mode:   # per transaction; only when it changes
                try:
                    db.execute(_SYNC_PRAGMA[mode])
                except sqlite3.Error as exc:
                    raise _store_error(exc, self.path, "apply") from exc
                self._sync_mode = mode
        try:
            if len(stores) + len(deletes) == 1 and not redelivered and not consumed:
                # one row (a lone send, a lone forward ack): one statement in autocommit
                # mode is its own transaction — the same commit and fsync without
                # BEGIN / executemany / COMMIT round trips (issue #14)
                if stores:
                    m = stores[0]
                    db.execute(_INSERT, (m.id, m.dst, m.redelivered, _encode(m)))
                else:
                    db.execute(_DELETE, deletes[0])
            else:
                self._apply_many(db, stores, deletes, redelivered, consumed)
        except (sqlite3.Error, cbor2.CBOREncodeError, OverflowError, ValueError,
                TypeError) as exc:
            # SQLite may already have rolled back (e.g. on SQLITE_FULL); finish the job so
            # the connection is usable for the next batch.  OverflowError & co: a value
            # sqlite3 cannot bind (an integer past 64 bits, issue #12).
            if db.in_transaction:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            if not isinstance(exc, sqlite3.Error):
                raise StoreError(
                    f"message store {self.path}: a message is not encodable: {exc}",
                    code="store_encode",
                ) from exc
            raise _store_error(exc, self.path, "apply") from exc
        self._committed(db, stores, deletes, redelivered, consumed, lazy, changes)

    def _apply_many(self, db: sqlite3.Connection, stores: Sequence[Message],
                    deletes: Sequence[tuple[str, str]],
                    redelivered: Sequence[tuple[str, str, int]],
                    consumed: Sequence[str]) -> None:
        """One explicit transaction for a batch of several rows (may raise)."""
        prune = False
        db.execute("BEGIN")
        if stores:
            db.executemany(_INSERT, [(m.id, m.dst, m.redelivered, _encode(m)) for m in stores])
        if redelivered:
            db.executemany(_UPDATE, [(count, i, d) for i, d, count in redelivered])
        if deletes:
            db.executemany(_DELETE, deletes)
        if consumed:
            db.executemany(_REMEMBER, [(i,) for i in consumed])
            prune = self._since_prune + len(consumed) >= self._prune_every
            if prune:
                db.execute(_PRUNE, (self.dedup_window,))
        db.execute("COMMIT")
        if consumed:
            self._since_prune = 0 if prune else self._since_prune + len(consumed)

    def _committed(self, db: sqlite3.Connection, stores: Sequence[Message],
                   deletes: Sequence[tuple[str, str]],
                   redelivered: Sequence[tuple[str, str, int]], consumed: Sequence[str],
                   lazy: bool, changes: int) -> None:
        """Book-keeping after a successful commit: deferred syncs, checkpoint estimate."""
        if self.deferred_sync and db.total_changes != changes:   # it wrote WAL frames
            if lazy:
                self._lazy_commits += 1
                if stores:
                    self._stores_mark = self._lazy_commits
            else:   # FULL: its fsync of the WAL covers every earlier frame
                self._synced = self._lazy_commits
        # what the commit appended to the WAL, roughly: a few whole pages (table, index,
        # sqlite_sequence) plus each row twice over (row page + index/overflow pages)
        self._written += (_COMMIT_PAGES_BYTES
                          + 2 * sum(len(m.body) + _ROW_OVERHEAD for m in stores)
                          + _ROW_OVERHEAD * (len(deletes) + len(redelivered) + len(consumed)))
        if self._written - self._checkpointed >= 2 * CHECKPOINT_BYTES:
            self._checkpoint_with(db, "PASSIVE")   # nobody called checkpoint(): bound the WAL

    # ------------------------------------------------------------ deferred ack sync
    def sync_pending(self) -> bool:
        """True while an ack-only commit is written but not yet fsynced."""
        return self._synced != self._lazy_commits

    def stores_mark(self) -> int:
        """The mark of the newest commit that stored messages without an fsync
        (``durable=False``); ``synced_past(mark)`` says when an fsync covered it."""
        return self._stores_mark

    def synced_past(self, mark: int) -> bool:
        """True once every commit up to ``mark`` (a ``stores_mark()``) is fsynced."""
        return self._synced >= mark

    def sync(self) -> None:
        """Make every commit so far durable against power loss: fdatasync the WAL file.

        Touches no SQLite state (only the file), so it may run in a thread while the
        connection commits: what a concurrent commit writes after the call began may or
        may not be covered, and stays pending when not."""
        upto = self._lazy_commits
        try:
            fd = os.open(f"{self.path}-wal", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:   # no WAL: a checkpoint (which syncs) removed it
            fd = -1
        except OSError as exc:
            raise StoreError(f"message store {self.path}: sync failed: {exc}",
                             code="store_io") from exc
        if fd >= 0:
            try:
                os.fdatasync(fd)
            except OSError as exc:
                raise StoreError(f"message store {self.path}: sync failed: {exc}",
                                 code="store_io") from exc
            finally:
                os.close(fd)
        # never past what a commit on the other thread recorded meanwhile (max: monotone)
        self._synced = max(self._synced, upto)

    # ------------------------------------------------------------ checkpoints
    def checkpoint_due(self) -> bool:
        """True once ``CHECKPOINT_BYTES`` were committed since the last checkpoint."""
        return self._written - self._checkpointed >= CHECKPOINT_BYTES

    def checkpoint(self) -> None:
        """Copy the WAL into the database (PASSIVE); the next commit restarts the WAL."""
        self._checkpoint_with(self._conn(), "PASSIVE")

    def _checkpoint_with(self, db: sqlite3.Connection, mode: str) -> bool:
        """One checkpoint on ``db``; True when it copied the whole WAL."""
        began = self._written
        try:
            busy, log, done = db.execute(f"PRAGMA wal_checkpoint({mode})").fetchall()[0]
        except sqlite3.Error:
            return False
        if not busy and done == log:
            self._checkpointed = max(self._checkpointed, began)
            return True
        return False

    def stats(self) -> dict[str, Any]:
        db = self._conn()
        try:
            rows = db.execute("SELECT count(*) FROM messages").fetchone()[0]
        except sqlite3.Error as exc:
            raise _store_error(exc, self.path, "stats") from exc
        disk = 0
        for suffix in ("", "-wal"):
            try:
                disk += os.stat(f"{self.path}{suffix}").st_size
            except FileNotFoundError:
                pass
        return {
            "rows": rows,
            "disk_bytes": disk,
            "path": str(self.path),
            "synchronous": self.synchronous,
            "journal_mode": self.journal_mode,
            "reserve_held": self._reserve_held,
            "ack_sync": self.ack_sync,
            "sync_pending": self.sync_pending(),
        }

    def close(self) -> None:
        if self._db is not None and self.sync_pending():
            try:
                self.sync()   # the last acks, before anything else can happen
            except StoreError:
                pass   # closing checkpoints (syncs) anyway
        db, self._db = self._db, None
        if db is not None:
            try:
                db.close()  # the last connection checkpoints and removes the WAL
            except sqlite3.Error as exc:
                raise _store_error(exc, self.path, "close") from exc

    def __repr__(self) -> str:
        state = "open" if self._db is not None else "closed"
        return f"SqliteStore({str(self.data_dir)!r}, synchronous={self.synchronous!r}, {state})"
