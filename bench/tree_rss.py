"""Peak memory of a whole process tree: ``python bench/tree_rss.py [--every S] -- CMD ...``.

Runs CMD and samples, every ``--every`` seconds (default 0.5), the memory of CMD and all
its descendants from /proc (the Spark JVM and any child Python included; psutil is not
needed).  At the end prints ONE JSON line:

  {"bench": "tree_rss", "cmd": [...], "rc": 0, "wall_s": ..., "peak_mib": ...,
   "peak_rss_sum_mib": ..., "peak_at_s": ..., "peak_processes": [[pid, "comm", mib], ...],
   "load": [1, 5, 15]}

``peak_mib`` is the largest sum over the tree of each process's proportional set size
(``Pss`` of /proc/PID/smaps_rollup): a page shared by k processes counts 1/k in each, so
the sum is the memory the tree holds.  A plain sum of resident set sizes counts shared
pages once per process -- a JVM that forks a helper before exec appears twice -- so it
overstates; it is given beside (``peak_rss_sum_mib``, at the same sample) for comparison.
``peak_processes`` is the tree at the peak sample (PSS), largest first: where the memory
is.  A child that shares its parent's address space (``clone(CLONE_VM)``: a JVM spawns
its helpers that way, and until the helper's ``exec`` the child *is* the JVM's memory,
named after the spawning thread, e.g. "Thread-17") is left out: its PSS is its parent's
again (``kcmp(KCMP_VM)`` tells; where the kernel refuses it, nothing is left out).  CMD's own output goes through unchanged.  Used for issue 13's "make run <= 2 GiB".
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import subprocess
import sys
import threading
import time

PAGE = os.sysconf("SC_PAGE_SIZE")
#: kcmp(2)'s syscall number by machine, and its "same address space" comparison
_SYS_KCMP = {"x86_64": 312, "aarch64": 272}.get(platform.machine())
_KCMP_VM = 1
_libc = ctypes.CDLL(None, use_errno=True)


def same_memory(pid: int, other: int) -> bool:
    """Whether two processes share one address space (kcmp(2) KCMP_VM); False when the
    kernel cannot say (no syscall number for this machine, a process gone, EPERM)."""
    if _SYS_KCMP is None:
        return False
    return _libc.syscall(_SYS_KCMP, pid, other, _KCMP_VM, 0, 0) == 0


def pss(pid: int) -> int | None:
    """Proportional set size of ``pid`` in bytes, or None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            for line in fh:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def tree(root: int) -> list[tuple[int, str, int, int]]:
    """(pid, comm, resident bytes, proportional bytes) of ``root`` and every descendant."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        close = stat.rindex(b")")
        pid = int(entry)
        names[pid] = stat[stat.index(b"(") + 1:close].decode(errors="replace")
        children.setdefault(int(stat[close + 2:].split()[1]), []).append(pid)
    out, todo = [], [(root, None)]
    while todo:
        pid, parent = todo.pop()
        todo += [(child, pid) for child in children.get(pid, [])]
        if parent is not None and same_memory(parent, pid):
            continue     # its parent's memory, counted with the parent
        try:
            with open(f"/proc/{pid}/statm") as fh:
                rss = int(fh.read().split()[1]) * PAGE
        except OSError:
            continue
        proportional = pss(pid)
        if proportional is not None:
            out.append((pid, names.get(pid, "?"), rss, proportional))
    return out


def main(argv: list[str]) -> int:
    every = 0.5
    if argv[:1] == ["--every"]:
        every, argv = float(argv[1]), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    started = time.perf_counter()
    proc = subprocess.Popen(argv)
    peak: list = [0, 0.0, [], 0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            now = tree(proc.pid)
            total = sum(p for _, _, _, p in now)
            if total > peak[0]:
                peak[:] = [total, time.perf_counter() - started, now,
                           sum(r for _, _, r, _ in now)]
            done.wait(every)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    rc = proc.wait()
    done.set()
    sampler.join()
    print(json.dumps({
        "bench": "tree_rss", "cmd": argv, "rc": rc,
        "wall_s": round(time.perf_counter() - started, 1),
        "peak_mib": round(peak[0] / 2**20, 1),
        "peak_rss_sum_mib": round(peak[3] / 2**20, 1), "peak_at_s": round(peak[1], 1),
        "peak_processes": [[p, n, round(b / 2**20, 1)]
                           for p, n, _, b in sorted(peak[2], key=lambda x: -x[3])],
        "load": os.getloadavg()}), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
