"""acquire_lock: the exclusive data-directory lock for master/slave."""

from __future__ import annotations

import os
import subprocess
import sys

from treefed.persistence import acquire_lock


class TestAcquireLock:
    def test_second_handle_is_refused_while_first_is_held(self, tmp_path):
        """Two opens in one process conflict: the second acquire returns None."""
        first = acquire_lock(tmp_path)
        assert first is not None and first.held
        assert acquire_lock(tmp_path) is None
        first.release()

    def test_release_lets_another_take_it(self, tmp_path):
        """After release() (idempotent) the lock can be acquired again."""
        first = acquire_lock(tmp_path)
        first.release()
        first.release()
        assert not first.held
        with acquire_lock(tmp_path) as second:
            assert second is not None and second.held
        assert not second.held
        assert acquire_lock(tmp_path) is not None

    def test_creates_dir_and_records_pid(self, tmp_path):
        """The lock file lives in a created data_dir and names the holder's pid."""
        with acquire_lock(tmp_path / "new" / "dir") as h:
            assert h.path == tmp_path / "new" / "dir" / "lock"
            assert h.path.read_text().strip() == str(os.getpid())

    def test_other_process_is_refused_until_release(self, tmp_path, child_env):
        """A second process cannot take a lock this process holds, and can after release."""
        probe = (
            "import sys; from treefed.persistence import acquire_lock; "
            "print('got' if acquire_lock(sys.argv[1]) else 'busy')"
        )

        def try_in_child() -> str:
            out = subprocess.run(
                [sys.executable, "-c", probe, str(tmp_path)],
                capture_output=True, text=True, timeout=30, check=True, env=child_env,
            )
            return out.stdout.strip()

        with acquire_lock(tmp_path):
            assert try_in_child() == "busy"
        assert try_in_child() == "got"
