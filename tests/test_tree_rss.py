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


def test_shared_pages_of_a_fork_count_once() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--every", "0.1", "--",
                           sys.executable, "-c", _FORKER],
                          capture_output=True, text=True, timeout=60, check=True)
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["rc"] == 0
    # the tree holds the block once; the resident sets add up to it twice
    assert 150 < line["peak_mib"] < 240, line
    assert line["peak_rss_sum_mib"] > 300, line
    assert sum(mib for _, _, mib in line["peak_processes"]) <= line["peak_mib"] + 1
