"""The disk's own floor for a synchronous persistent send, measured where the store lives.

A message sent one at a time and confirmed only once it is on disk can go no faster than
one durable write per message.  ``measure(directory)`` times, in ``directory`` (the same
file system a broker's ``data_dir`` uses), the two writes that bound it:

* ``fdatasync`` — ``pwrite`` of 4 KiB into a file written once beforehand (so no block
  allocation, like a reused WAL) followed by ``fdatasync``: the cheapest durable append
  there is;
* ``sqlite_commit`` — one message committed by the broker's own store
  (``SqliteStore.apply``: WAL, ``synchronous=FULL``, one transaction): what the broker
  pays per commit before a receipt may leave.

Each gives the wall time (median, p99) and the CPU time per operation, and the rates
they cap a lone sender at (1 / median).  A figure of the broker is then read as a ratio
to its disk's floor measured in the same run: on a shared machine the disk's latency
drifts with the neighbours, and a broker cannot beat the fsync it waits for.

    python bench/disk_floor.py [--dir D] [--count N]      # one JSON line
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))   # PYTHONPATH first

from treefed.core.message import Message  # noqa: E402
from treefed.persistence import SqliteStore  # noqa: E402

PAGE = 4096
FILE_BYTES = 4 * 1024 * 1024


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _summary(name: str, walls: list[float], cpu: float) -> dict:
    walls = sorted(walls)
    p50 = statistics.median(walls)
    p99 = walls[min(len(walls) - 1, int(len(walls) * 0.99))]
    return {f"{name}_p50_ms": round(p50 * 1e3, 3), f"{name}_p99_ms": round(p99 * 1e3, 3),
            f"{name}_cpu_us": round(cpu / len(walls) * 1e6, 1),
            f"{name}_cap_msgs_per_s": round(1 / p50) if p50 > 0 else None}


def fdatasync_floor(directory: str, count: int) -> dict:
    path = os.path.join(directory, "floor.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.pwrite(fd, bytes(FILE_BYTES), 0)   # written, not just allocated
        os.fsync(fd)
        block = os.urandom(PAGE)
        walls = []
        cpu = _cpu()
        for i in range(count):
            began = time.perf_counter()
            os.pwrite(fd, block, (i * PAGE) % FILE_BYTES)
            os.fdatasync(fd)
            walls.append(time.perf_counter() - began)
        cpu = _cpu() - cpu
    finally:
        os.close(fd)
        os.unlink(path)
    return _summary("fdatasync", walls, cpu)


def sqlite_floor(directory: str, count: int, body: bytes = b"x" * 100) -> dict:
    with tempfile.TemporaryDirectory(dir=directory, prefix="floor-") as data_dir:
        store = SqliteStore(data_dir, reserve_bytes=0)
        try:
            for i in range(50):   # warm: schema pages cached, WAL file grown
                store.apply([Message(f"w{i}", "queue://floor", body=body, persistent=True)],
                            [])
            walls = []
            cpu = _cpu()
            for i in range(count):
                m = Message(f"m{i}", "queue://floor", body=body, persistent=True)
                began = time.perf_counter()
                store.apply([m], [])
                walls.append(time.perf_counter() - began)
            cpu = _cpu() - cpu
        finally:
            store.close()
    return _summary("sqlite_commit", walls, cpu)


def measure(directory: str | None = None, count: int = 500) -> dict:
    """Both floors in ``directory`` (default: the system temp dir, where the benches'
    data dirs live)."""
    directory = directory or tempfile.gettempdir()
    return {"disk_dir": directory, **fdatasync_floor(directory, count),
            **sqlite_floor(directory, count)}


def combine(runs: list[dict]) -> dict:
    """Several ``measure`` results as one: each timing averaged, caps recomputed."""
    out: dict = {}
    for key in runs[0]:
        if key == "disk_dir" or key.endswith("_cap_msgs_per_s"):
            continue
        out[key] = round(statistics.fmean(r[key] for r in runs), 3)
    for name in ("fdatasync", "sqlite_commit"):
        p50 = out[f"{name}_p50_ms"]
        out[f"{name}_cap_msgs_per_s"] = round(1000 / p50) if p50 > 0 else None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None)
    parser.add_argument("--count", type=int, default=500)
    args = parser.parse_args(argv)
    print(json.dumps({"bench": "disk_floor", "loadavg_1m": round(os.getloadavg()[0], 2),
                      **measure(args.dir, args.count)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
