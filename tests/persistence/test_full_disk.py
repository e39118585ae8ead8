"""A full disk must not wedge the broker or resurrect acked messages (issue #12, defect 4).

The scenario (``full_disk_driver.py``) runs a real broker process on a real, small tmpfs
mounted in a private mount namespace (``unshare -Urm``: no root needed where user
namespaces are allowed).  Where that is not possible the test is skipped and says why.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TMPFS_SIZE = "24m"



def _namespace_command(mount_point: Path, *command: str) -> list[str]:
    script = (f'mount -t tmpfs -o size={TMPFS_SIZE} tmpfs "{mount_point}" && exec "$@"')
    return ["unshare", "-Urm", "sh", "-c", script, "sh", *command]


def _can_mount_tmpfs(tmp_path: Path) -> str | None:
    """None when a private tmpfs can be mounted here, else why not."""
    if shutil.which("unshare") is None:
        return "unshare(1) (util-linux) is not installed"
    probe = tmp_path / "probe"
    probe.mkdir()
    result = subprocess.run(_namespace_command(probe, "true"), capture_output=True,
                            text=True, timeout=30)
    if result.returncode:
        return ("cannot mount a private tmpfs (unshare -Urm + mount -t tmpfs): "
                f"{result.stderr.strip() or result.returncode}")
    return None


@pytest.mark.slow   # real broker processes, a kill -9 and two restarts
def test_full_disk_acks_commit_nothing_resurrects_and_space_returns(tmp_path):
    why = _can_mount_tmpfs(tmp_path)
    if why is not None:
        pytest.skip(f"needs a small real filesystem: {why}")
    root = tmp_path / "fs"
    root.mkdir()
    result = subprocess.run(
        _namespace_command(root, sys.executable, "-m", "tests.persistence.full_disk_driver",
                           str(root)),
        capture_output=True, text=True, timeout=240, cwd=str(REPO))
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-6000:]}"
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["first"] > 20 and seen["cleared_after_s"] < 10, seen


class _FullFile:
    """A text stream whose writes fail like a full disk's, until ``room`` is set."""

    def __init__(self) -> None:
        self.room = False
        self.lines: list[str] = []

    def write(self, text: str) -> int:
        if not self.room:
            raise OSError(28, "No space left on device")
        self.lines.append(text)
        return len(text)

    def flush(self) -> None:
        if not self.room:
            raise OSError(28, "No space left on device")

    def isatty(self) -> bool:
        return False


def test_a_log_write_on_a_full_disk_does_not_raise():
    """The broker's log often shares the data directory's disk: a full disk must cost
    log lines, never the process (it did: OSError out of structlog ended the broker)."""
    from treefed.log import configure_logging, get_logger

    out = _FullFile()
    configure_logging("info", file=out)
    try:
        log = get_logger(broker="b")
        log.warning("store.full", refused=1)       # must not raise
        log.info("still.serving")
        out.room = True
        log.info("space.back")
        assert '"lines":2' in out.lines[0] and "log.dropped" in out.lines[0]
        assert "space.back" in out.lines[1]
    finally:
        configure_logging("warning")
