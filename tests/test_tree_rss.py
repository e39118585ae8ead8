"""bench/tree_rss.py: a page shared by a forked child is counted once, not once per process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "tree_rss.py"

# 160 MiB touched, then a fork: parent and child share every page copy-on-write for ~1.5 s
_FORKER = """
import os, time
block = bytearray(160 * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1
pid = os.fork()
time.sleep(1.5)
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
"""


def _measured(script: str) -> dict:
    """bench/tree_rss.py's JSON line for a Python process running ``script``."""
    done = subprocess.run([sys.executable, str(BENCH), "--every", "0.1", "--",
                           sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=60, check=True)
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["rc"] == 0
    return line


def test_shared_pages_of_a_fork_count_once() -> None:
    line = _measured(_FORKER)
    # the tree holds the block once; the resident sets add up to it twice
    assert 150 < line["peak_mib"] < 240, line
    assert line["peak_rss_sum_mib"] > 300, line
    assert sum(mib for _, _, mib in line["peak_processes"]) <= line["peak_mib"] + 1


# 160 MiB touched, then a child in the same address space (clone(CLONE_VM), as a JVM
# spawns its helpers before their exec) that sleeps 1.5 s in C: one memory, two processes
_CLONER = """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
block = bytearray(160 * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1
stack = ctypes.create_string_buffer(1 << 16)
top = ctypes.c_void_p(ctypes.addressof(stack) + len(stack) - 64)
CLONE_VM, SIGCHLD = 0x100, 17
libc.clone.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
pid = libc.clone(ctypes.cast(libc.usleep, ctypes.c_void_p), top, CLONE_VM | SIGCHLD,
                 ctypes.c_void_p(1_500_000))
assert pid > 0, ctypes.get_errno()
os.waitpid(pid, 0)
"""


def test_a_child_in_its_parents_address_space_counts_once() -> None:
    line = _measured(_CLONER)
    assert 150 < line["peak_mib"] < 240, line
    assert len(line["peak_processes"]) == 1, line
