"""Stores committed with ``durable=False`` (issue #14, forwards synced in groups): the
WAL is written but not fsynced — counted with strace, the system calls SQLite really
makes — until ``sync()`` (one fdatasync) or the next durable commit; ``stores_mark`` /
``synced_past`` say when a group of them is covered; kill -9 right after such a commit
loses nothing (the WAL frames are in the page cache)."""

from __future__ import annotations

import subprocess
import sys

from treefed.core.message import Message
from treefed.persistence import SqliteStore

from tests.persistence.test_ack_sync import _strace

N = 10

# phases (getppid() marks each start): N lazy stores, sync(), N durable stores
CHILD = """
import os, sys
from treefed.core.message import Message
from treefed.persistence import SqliteStore
N = int(sys.argv[2])
store = SqliteStore(sys.argv[1], reserve_bytes=0)
def m(i):
    return Message(f"m{i}", "queue://Q", body=bytes(100), persistent=True)
store.apply([m(i) for i in range(1000, 1000 + N)], [])   # warm: schema, first pages
os.getppid()
for i in range(N):
    store.apply([m(i)], [], durable=False)
mark = store.stores_mark()
before = store.synced_past(mark)
os.getppid()
store.sync()
os.getppid()
for i in range(N):
    store.apply([m(2000 + i)], [])
os.getppid()
print(before, store.synced_past(mark))
os._exit(0)   # no close(): its checkpoint would fsync too
"""


def test_lazy_stores_do_not_fsync_until_sync(tmp_path, child_env):
    trace = tmp_path / "trace"
    out = subprocess.run(
        [_strace(), "-f", "-qq", "-e", "trace=fsync,fdatasync,getppid", "-o", str(trace),
         sys.executable, "-c", CHILD, str(tmp_path / "data"), str(N)],
        capture_output=True, text=True, env=child_env, timeout=120)
    assert out.returncode == 0, out.stderr
    counts: list[int] = []
    for line in trace.read_text().splitlines():
        if "getppid(" in line:
            counts.append(0)
        elif counts and ("fdatasync(" in line or "fsync(" in line):
            counts[-1] += 1
    assert len(counts) == 4, trace.read_text()[-2000:]
    lazy, sync, durable = counts[:3]
    assert lazy == 0            # written to the WAL, not fsynced
    assert sync == 1            # the group's one fdatasync
    assert durable >= N         # durable commits still fsync each
    assert out.stdout.strip() == "False True"


def test_marks(tmp_path):
    store = SqliteStore(tmp_path, reserve_bytes=0)
    m = [Message(f"m{i}", "queue://Q", body=b"x", persistent=True) for i in range(4)]
    assert store.stores_mark() == 0 and store.synced_past(0)
    store.apply([m[0]], [], durable=False)
    mark = store.stores_mark()
    assert mark > 0 and not store.synced_past(mark)
    store.apply([], [("m0", "queue://Q")])          # ack-only: no fsync, mark unchanged
    assert store.stores_mark() == mark and not store.synced_past(mark)
    store.apply([m[1]], [])                          # a durable commit covers the group
    assert store.synced_past(mark)
    store.apply([m[2]], [], durable=False)
    store.apply([m[2]], [], durable=False)           # a duplicate: nothing written
    mark = store.stores_mark()
    assert not store.synced_past(mark)
    store.sync()
    assert store.synced_past(mark)
    store.close()
    full = SqliteStore(tmp_path / "full", reserve_bytes=0, ack_sync="full")
    full.apply([m[3]], [], durable=False)           # every commit fsyncs there
    assert full.stores_mark() == 0 and not full.sync_pending()
    full.close()


KILLED = """
import os, signal, sys
from treefed.core.message import Message
from treefed.persistence import SqliteStore
store = SqliteStore(sys.argv[1], reserve_bytes=0)
store.apply([Message(f"m{i}", "queue://Q", body=b"x", persistent=True) for i in range(5)], [],
            durable=False)
assert not store.synced_past(store.stores_mark())
os.kill(os.getpid(), signal.SIGKILL)   # no close, no checkpoint, no sync
"""


def test_kill_9_right_after_a_lazy_store_loses_nothing(tmp_path, child_env):
    out = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path)], env=child_env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == -9, out.stderr
    store = SqliteStore(tmp_path, reserve_bytes=0)
    assert [m.id for m in store.load()] == [f"m{i}" for i in range(5)]
    store.close()


REOPEN = """
import os, sys
from treefed.persistence import SqliteStore
os.getppid()
store = SqliteStore(sys.argv[1], reserve_bytes=0)
os.getppid()
print(len(store.load()))
os._exit(0)
"""


def test_reopening_after_kill_9_fsyncs_what_the_killed_process_left_unsynced(
        tmp_path, child_env):
    """A restarted broker acks a re-forwarded duplicate at once (nothing of its own is
    pending): the unsynced frames the killed one left in the page cache must be fsynced
    when the store opens, or a power loss after the ack would lose the message."""
    out = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path)], env=child_env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == -9, out.stderr
    trace = tmp_path / "trace"
    out = subprocess.run(
        [_strace(), "-f", "-qq", "-e", "trace=fsync,fdatasync,getppid", "-o", str(trace),
         sys.executable, "-c", REOPEN, str(tmp_path)],
        capture_output=True, text=True, env=child_env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "5"
    marks = 0
    syncs = 0
    for line in trace.read_text().splitlines():
        if "getppid(" in line:
            marks += 1
        elif marks == 1 and "sync(" in line:
            syncs += 1
    assert syncs >= 1
