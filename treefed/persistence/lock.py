"""The data-directory lock: which broker process may own a message store.

Theory of operation
-------------------
A master/slave pair sharing one data directory must never both write the store.  The
owner holds an exclusive ``flock`` on ``<data_dir>/lock``; ``acquire_lock`` tries once,
without blocking, and returns a ``LockHandle`` or None (someone else holds it — the caller
decides whether to wait as a slave and retry).  The kernel releases the lock when the
holder's file description closes, so a broker killed with -9 frees it without cleanup.

flock locks belong to an open file description, not a process: two ``acquire_lock`` calls
in one process conflict just as two processes do.  The lock file is never unlinked:
removing it while another process waits on the old inode would let two holders coexist.
The holder's pid (and the ``owner`` it names, e.g. its broker id) is written into the file;
``read_lock`` returns them so a second broker can tell its own master (wait as its slave)
from a different broker pointed at the wrong directory (refuse).  Informational only: the
flock alone decides who holds the lock.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from treefed.errors import StoreError

__all__ = ["LockHandle", "acquire_lock", "read_lock", "LOCK_NAME"]

LOCK_NAME = "lock"


class LockHandle:
    """A held data-directory lock; ``release()`` (idempotent) or use as a context manager."""

    __slots__ = ("path", "_fd")

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the description drops the flock

    def __enter__(self) -> LockHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"LockHandle({str(self.path)!r}, {'held' if self.held else 'released'})"


def acquire_lock(data_dir: str | os.PathLike[str], *, owner: str = "") -> LockHandle | None:
    """Take the exclusive lock on ``data_dir`` (created if missing) or return None if held.
    ``owner`` (one word, e.g. the broker id) is recorded next to the pid."""
    path = Path(data_dir) / LOCK_NAME
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StoreError(f"cannot open lock file {path}: {exc}", code="store_io") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError as exc:
        os.close(fd)
        raise StoreError(f"cannot lock {path}: {exc}", code="store_io") from exc
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {owner}".rstrip().encode() + b"\n", 0)
    except OSError:
        pass  # the pid is a courtesy to operators; the lock itself is held
    return LockHandle(path, fd)


def read_lock(data_dir: str | os.PathLike[str]) -> tuple[int | None, str]:
    """``(pid, owner)`` recorded by the last holder of ``data_dir``'s lock (``None, ""``
    when there is no readable record).  It may be stale: only the flock is authoritative."""
    try:
        text = (Path(data_dir) / LOCK_NAME).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None, ""
    pid, _, owner = text.strip().partition(" ")
    return (int(pid) if pid.isdigit() else None), owner.strip()
