"""Start-up and identity checks of the data directory (issue #12, defect 12, store half).

A 0-byte ``messages.db`` (its messages are gone) is refused unless ``--init``; a data
directory records the broker id that owns it, and a broker with another id may not open
it.  Checked on the store and on real ``treefed broker`` processes.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from treefed.core.message import Message
from treefed.errors import StoreError
from treefed.persistence import SqliteStore
from treefed.persistence.sqlite import DB_NAME, IDENTITY_NAME
from treefed.transport.ports import free_port

from tests.persistence.conftest import REPO_ROOT


def _message(i: int) -> Message:
    return Message(id=f"m{i}", dst="queue://q", body=b"b", persistent=True)


class TestStore:
    def test_zero_byte_store_is_refused_unless_init(self, tmp_path):
        with SqliteStore(tmp_path, broker_id="b1") as store:
            store.apply([_message(i) for i in range(5)], [])
        (tmp_path / DB_NAME).write_bytes(b"")       # truncated by an accident
        with pytest.raises(StoreError) as info:
            SqliteStore(tmp_path, broker_id="b1")
        assert info.value.code == "store_empty"
        assert "--init" in info.value.message
        assert (tmp_path / DB_NAME).stat().st_size == 0   # refused without touching it
        with SqliteStore(tmp_path, broker_id="b1", init=True) as store:
            assert store.load() == []
            store.apply([_message(1)], [])
        with SqliteStore(tmp_path, broker_id="b1") as store:  # a real store again
            assert [m.id for m in store.load()] == ["m1"]

    def test_zero_byte_store_without_identity_is_refused_too(self, tmp_path):
        """A data dir from before the identity record: still no silent empty start."""
        (tmp_path / DB_NAME).write_bytes(b"")
        with pytest.raises(StoreError) as info:
            SqliteStore(tmp_path)
        assert info.value.code == "store_empty"

    def test_missing_store_of_a_known_broker_is_refused_unless_init(self, tmp_path):
        with SqliteStore(tmp_path, broker_id="b1") as store:
            store.apply([_message(1)], [])
        (tmp_path / DB_NAME).unlink()
        with pytest.raises(StoreError) as info:
            SqliteStore(tmp_path, broker_id="b1")
        assert info.value.code == "store_missing"
        SqliteStore(tmp_path, broker_id="b1", init=True).close()

    def test_directory_records_its_broker_and_refuses_another(self, tmp_path):
        with SqliteStore(tmp_path, broker_id="store-1") as store:
            store.apply([_message(1)], [])
        assert (tmp_path / IDENTITY_NAME).read_text().strip() == "store-1"
        for init in (False, True):
            with pytest.raises(StoreError) as info:
                SqliteStore(tmp_path, broker_id="store-2", init=init)
            assert info.value.code == "store_identity"
            assert "store-1" in info.value.message
        with SqliteStore(tmp_path, broker_id="store-1") as store:
            assert [m.id for m in store.load()] == ["m1"]

    def test_existing_directory_adopts_the_first_id(self, tmp_path):
        """A data dir written before identities existed is claimed by its next opener."""
        with SqliteStore(tmp_path) as store:
            store.apply([_message(1)], [])
        assert not (tmp_path / IDENTITY_NAME).exists()
        SqliteStore(tmp_path, broker_id="b1").close()
        assert (tmp_path / IDENTITY_NAME).read_text().strip() == "b1"


def _config(tmp_path, broker_id: str, data) -> tuple[str, str]:
    port = free_port()
    path = tmp_path / f"{broker_id}.toml"
    path.write_text(f'[broker]\nid = "{broker_id}"\ndata_dir = "{data}"\n'
                    f'listen = ["tcp://127.0.0.1:{port}"]\n[logging]\nlevel = "info"\n')
    return str(path), f"127.0.0.1:{port}"


def _run(config: str, *extra: str, child_env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "treefed.cli", "broker", "--config",
                             config, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env, cwd=str(REPO_ROOT))


def _serving(proc: subprocess.Popen, address: str, timeout: float = 20.0) -> bool:
    host, port = address.split(":")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            socket.create_connection((host, int(port)), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def _refused(proc: subprocess.Popen, address: str) -> str:
    """The broker must exit 1 without ever serving; returns its stderr."""
    assert not _serving(proc, address), "the broker started serving on that directory"
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 1, err
    return err


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
    proc.communicate(timeout=15)


class TestBrokerProcess:
    def test_zero_byte_store_refused_at_start_and_init_accepts_it(self, tmp_path, child_env):
        data = tmp_path / "data"
        data.mkdir()
        (data / DB_NAME).write_bytes(b"")
        config, address = _config(tmp_path, "b1", data)
        proc = _run(config, child_env=child_env)
        try:
            err = _refused(proc, address)
        finally:
            _stop(proc)
        assert "empty (0 bytes)" in err and "--init" in err
        proc = _run(config, "--init", child_env=child_env)
        try:
            assert _serving(proc, address), proc.stderr.read() if proc.poll() else ""
        finally:
            _stop(proc)
        assert (data / IDENTITY_NAME).read_text().strip() == "b1"

    def test_another_broker_id_refuses_the_directory(self, tmp_path, child_env):
        data = tmp_path / "data"
        first, address = _config(tmp_path, "b1", data)
        proc = _run(first, child_env=child_env)
        try:
            assert _serving(proc, address)
        finally:
            _stop(proc)
        second, address = _config(tmp_path, "b2", data)
        proc = _run(second, child_env=child_env)
        try:
            err = _refused(proc, address)
        finally:
            _stop(proc)
        assert "belongs to broker 'b1'" in err
