"""Ack-only commits without their own fsync (issue #14, the owners' decision).

A SqliteStore (synchronous FULL, ``ack_sync="normal"``, the default) commits a
transaction that stores no message with ``synchronous=NORMAL``: no fdatasync; a
transaction that stores a message still fdatasyncs the WAL before ``apply`` returns.
The fsyncs are counted with strace (the system calls SQLite really makes); kill -9 right
after an ack-only commit loses nothing; ``ack_sync="full"`` restores one fsync per ack."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

from treefed.core.message import Message
from treefed.errors import ConfigError
from treefed.persistence import SqliteStore

N = 10

# The child opens a store and runs phases of N commits each; getppid() marks each
# phase's start in the trace.  Phase order: inserts, ack-only deletes, sync(),
# redelivery counts + consumed ids (ack-only too), inserts again.
CHILD = """
import os, sys
from treefed.core.message import Message
from treefed.persistence import SqliteStore
N = int(sys.argv[3])
store = SqliteStore(sys.argv[1], ack_sync=sys.argv[2], reserve_bytes=0)
def m(i):
    return Message(f"m{i}", "queue://Q", body=bytes(100), persistent=True)
store.apply([m(i) for i in range(1000, 1000 + N)], [])   # warm: schema, first pages
os.getppid()
for i in range(N):
    store.apply([m(i)], [])
os.getppid()
for i in range(N):
    store.apply([], [(f"m{i}", "queue://Q")], consumed=[f"m{i}"])
pending = store.sync_pending()
os.getppid()
store.sync()
os.getppid()
for i in range(N):
    store.apply([], [], redelivered=[(f"m{1000 + i}", "queue://Q", i + 1)])
os.getppid()
for i in range(N):
    store.apply([m(2000 + i)], [])
os.getppid()
print(pending, store.sync_pending())
os._exit(0)   # no close(): its checkpoint would fsync too
"""


def _strace() -> str:
    path = shutil.which("strace")
    if path is None:
        pytest.skip("strace is not installed (Debian package strace; `make test` installs "
                    "it when run as root): the fsync count cannot be observed")
    probe = subprocess.run([path, "-f", "-qq", "-e", "trace=getppid", "-o", os.devnull,
                            sys.executable, "-c", "import os; os.getppid()"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"strace cannot trace here (ptrace refused?): {probe.stderr[-200:]!r}")
    return path


def _fsyncs_per_phase(tmp_path, child_env, ack_sync: str) -> tuple[list[int], str]:
    trace = tmp_path / f"trace-{ack_sync}"
    out = subprocess.run(
        [_strace(), "-f", "-qq", "-e", "trace=fsync,fdatasync,getppid", "-o", str(trace),
         sys.executable, "-c", CHILD, str(tmp_path / f"data-{ack_sync}"), ack_sync, str(N)],
        capture_output=True, text=True, env=child_env, timeout=120)
    assert out.returncode == 0, out.stderr
    counts: list[int] = []
    for line in trace.read_text().splitlines():
        if "getppid(" in line:
            counts.append(0)
        elif counts and ("fdatasync(" in line or "fsync(" in line):
            counts[-1] += 1
    assert len(counts) == 6, trace.read_text()[-2000:]
    return counts[:5], out.stdout.strip()


def test_ack_only_commits_do_not_fsync_storing_commits_do(tmp_path, child_env):
    (inserts, acks, sync, recounts, inserts_again), printed = _fsyncs_per_phase(
        tmp_path, child_env, "normal")
    assert inserts >= N          # every storing commit fsyncs the WAL before returning
    assert acks == 0             # ack-only: written to the WAL, no fsync
    assert recounts == 0         # redelivery counts are ack-only too
    assert sync == 1             # sync(): one fdatasync of the WAL
    assert inserts_again >= N    # switching back to FULL for storing commits
    # after the acks, frames were pending; the storing commits at the end covered them
    assert printed == "True False"


def test_ack_sync_full_fsyncs_every_commit(tmp_path, child_env):
    (inserts, acks, _sync, recounts, inserts_again), printed = _fsyncs_per_phase(
        tmp_path, child_env, "full")
    assert inserts >= N and acks >= N and recounts >= N and inserts_again >= N
    assert printed == "False False"   # nothing is ever left unsynced


KILLED = """
import os, signal, sys
from treefed.core.message import Message
from treefed.persistence import SqliteStore
store = SqliteStore(sys.argv[1], reserve_bytes=0)
store.apply([Message(f"m{i}", "queue://Q", body=b"x", persistent=True) for i in range(5)], [])
store.apply([], [("m1", "queue://Q"), ("m3", "queue://Q")], consumed=["m1", "m3"])
assert store.sync_pending()
os.kill(os.getpid(), signal.SIGKILL)   # no close, no checkpoint, no sync
"""


def test_kill_9_right_after_an_ack_only_commit_loses_no_ack(tmp_path, child_env):
    """The ack-only commit is in the WAL (page cache): a killed broker's restart does
    not deliver the acked messages again."""
    data = tmp_path / "d"
    out = subprocess.run([sys.executable, "-c", KILLED, str(data)], env=child_env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGKILL, out.stderr
    with SqliteStore(data, reserve_bytes=0) as store:
        assert [m.id for m in store.load()] == ["m0", "m2", "m4"]
        assert store.load_consumed() == ["m1", "m3"]
        assert not store.sync_pending()


def _msg(i: int) -> Message:
    return Message(f"m{i}", "queue://Q", body=b"b", persistent=True)


def test_sync_pending_tracks_what_no_fsync_covered_yet(tmp_path):
    with SqliteStore(tmp_path, reserve_bytes=0) as store:
        assert store.deferred_sync and store.stats()["ack_sync"] == "normal"
        store.apply([_msg(1), _msg(2)], [])
        assert not store.sync_pending()
        store.apply([], [("m1", "queue://Q")])
        assert store.sync_pending() and store.stats()["sync_pending"]
        store.apply([_msg(3)], [])          # a storing commit's fsync covers the ack
        assert not store.sync_pending()
        store.apply([], [("m2", "queue://Q")])
        store.sync()
        assert not store.sync_pending()
        store.apply([], [("absent", "queue://Q")])   # nothing written: nothing pending
        assert not store.sync_pending()
        store.apply([_msg(3)], [("m3", "queue://Q")])   # stores: a FULL commit
        assert not store.sync_pending()
        assert [m.id for m in store.load()] == []


def test_normal_store_and_full_ack_sync_never_defer(tmp_path):
    with SqliteStore(tmp_path / "a", synchronous="NORMAL", reserve_bytes=0) as store:
        assert not store.deferred_sync   # nothing is fsynced per commit there anyway
        store.apply([_msg(1)], [])
        store.apply([], [("m1", "queue://Q")])
        assert not store.sync_pending()
    with SqliteStore(tmp_path / "b", ack_sync="full", reserve_bytes=0) as store:
        assert not store.deferred_sync
        store.apply([_msg(1)], [])
        store.apply([], [("m1", "queue://Q")])
        assert not store.sync_pending()


def test_unknown_ack_sync_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        SqliteStore(tmp_path, ack_sync="never")
    assert info.value.key == "ack_sync" and "normal" in str(info.value)
    assert not (tmp_path / "messages.db").exists()


def test_close_syncs_pending_acks(tmp_path, monkeypatch):
    store = SqliteStore(tmp_path, reserve_bytes=0)
    store.apply([_msg(1)], [])
    store.apply([], [("m1", "queue://Q")])
    synced: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])
    store.close()
    assert len(synced) == 1
