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

Durability: each ``apply`` is one explicit transaction (BEGIN ... COMMIT, executemany per
kind) so a whole batch pays for one commit.  The journal is WAL.  With
``synchronous="FULL"`` (default) the WAL is fsynced at every commit: a confirmed message
survives kill -9 *and* power loss.  ``"NORMAL"`` fsyncs only at checkpoints: a commit is
still in the OS page cache when ``apply`` returns, which survives kill -9 of the broker but
not an OS crash.  bench/store_commit.py measures the price of each.

Failures: sqlite3 exceptions are translated here, once, into ``StoreError`` with a code —
``store_full`` (disk full or ``max_bytes`` reached; the broker refuses producers and keeps
running), ``store_corrupt`` (not a database, malformed pages, undecodable payload),
``store_foreign`` (some other application's SQLite file), ``store_version``, ``store_busy``,
``store_io``, ``store_closed``.  A failed ``apply`` is rolled back whole, and the store
remains usable (deletes can free the space a refused insert lacked).

The connection is opened with ``check_same_thread=False`` because the node calls ``apply``
from ``trio.to_thread.run_sync``; callers guarantee one thread at a time.  The store never
takes the master/slave lock itself (see lock.py) and never deletes its files.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import cbor2

from treefed.core.message import Message
from treefed.errors import ConfigError, StoreError
from treefed.persistence.base import MessageStore

__all__ = ["SqliteStore", "DB_NAME", "PRUNE_EVERY"]

DB_NAME = "messages.db"

# Written into the SQLite header so a foreign database is refused rather than extended.
_APPLICATION_ID = 0x74726664  # "trfd"
_SCHEMA_VERSION = 1
_SYNCHRONOUS = ("FULL", "NORMAL")

_SCHEMA = """
CREATE TABLE messages (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL,
    dst TEXT NOT NULL,
    redelivered INTEGER NOT NULL,
    blob BLOB NOT NULL,
    UNIQUE (id, dst)
)"""
_INSERT = "INSERT OR IGNORE INTO messages (id, dst, redelivered, blob) VALUES (?, ?, ?, ?)"
_UPDATE = "UPDATE messages SET redelivered = ? WHERE id = ? AND dst = ?"
_DELETE = "DELETE FROM messages WHERE id = ? AND dst = ?"
_SELECT = "SELECT id, dst, redelivered, blob FROM messages ORDER BY seq"
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
    crash only).  ``max_bytes``: cap on the database size (0 = the disk is the limit);
    reaching it raises StoreError(code="store_full") exactly as a full disk does.
    ``dedup_window``: how many consumed ids ``load_consumed`` returns (the Broker's
    window; 0 = none are kept).
    """

    __slots__ = ("data_dir", "path", "synchronous", "journal_mode", "dedup_window",
                 "_prune_every", "_since_prune", "_db")

    def __init__(
        self, data_dir: str | os.PathLike[str], *, synchronous: str = "FULL", max_bytes: int = 0,
        dedup_window: int = 100_000,
    ) -> None:
        if synchronous not in _SYNCHRONOUS:
            raise ConfigError("synchronous", f"must be one of {_SYNCHRONOUS}, got {synchronous!r}")
        if max_bytes < 0:
            raise ConfigError("max_bytes", f"must be >= 0, got {max_bytes}")
        if dedup_window < 0:
            raise ConfigError("dedup_window", f"must be >= 0, got {dedup_window}")
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / DB_NAME
        self.synchronous = synchronous
        self.dedup_window = dedup_window
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
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise _store_error(exc, self.path, "open") from exc
        try:
            # The first statement reads the header: a non-SQLite file fails right here.
            self.journal_mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            db.execute(f"PRAGMA synchronous={synchronous}")
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
        out = []
        for msg_id, dst, redelivered, blob in rows:
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
            out.append(
                Message(
                    id=msg_id, dst=dst, headers=headers, body=body, persistent=persistent,
                    priority=priority, timestamp=timestamp, expires=expires,
                    reply_to=reply_to, path=tuple(path), redelivered=redelivered,
                )
            )
        return out

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
    ) -> None:
        db = self._conn()
        if consumed and not self.dedup_window:
            consumed = ()
        if not stores and not deletes and not redelivered and not consumed:
            return
        prune = False
        try:
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
        if consumed:
            self._since_prune = 0 if prune else self._since_prune + len(consumed)

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
        }

    def close(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            try:
                db.close()  # the last connection checkpoints and removes the WAL
            except sqlite3.Error as exc:
                raise _store_error(exc, self.path, "close") from exc

    def __repr__(self) -> str:
        state = "open" if self._db is not None else "closed"
        return f"SqliteStore({str(self.data_dir)!r}, synchronous={self.synchronous!r}, {state})"
