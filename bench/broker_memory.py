"""RSS of one real ``treefed broker`` process: idle, and after 100,000-message runs.

Issue #14's memory targets: idle <= 35 MiB, <= 50 MiB after the 100,000-message runs.
One ``treefed broker`` process (SQLite store in a temporary directory, logging at
warning) is started, per round:

* ``idle`` — VmRSS once it serves, after ``--settle`` seconds (the broker gives freed heap
  back once it has been idle ``node.trim.IDLE_TRIM_S``; before that it holds what start-up
  freed: ``start``, read 0.5 s after it answers);
* ``after_np`` / ``after_p`` — VmRSS right after 100,000 non-persistent, then 100,000
  persistent (pipelined) 100-byte messages went through it (producer and consumer are
  two connections in this process, prefetch 1000), and ``settled`` ``--settle`` seconds
  later;
* the modules it loaded are not listed here: tests/node/test_lean_broker.py checks them.

One JSON line: each round's figures, the medians, the 1-minute load before and after.

    python bench/broker_memory.py [--count N] [--rounds R] [--settle S]
                                  [--allocator pymalloc|malloc]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BODY = b"x" * 100
DEST = "queue://Bench.Memory"
TARGETS = {"idle_mib": 35.0, "after_mib": 50.0}


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError("no VmRSS")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _pump(uri: str, count: int, persistent: bool) -> None:
    import trio

    from treefed.client import connect

    async with connect(uri, client_id="mem-consumer") as cons, \
            connect(uri, client_id="mem-producer") as prod:
        sub = await cons.subscribe(DEST, prefetch=1000)

        async def consume() -> None:
            for _ in range(count):
                msg = await sub.receive()
                msg.ack_nowait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            for _ in range(count):
                await prod.send(DEST, BODY, persistent=persistent, confirm=False)
            if persistent:
                await prod.wait_confirmed()
            await prod.flush()


async def _wait_serving(uri: str) -> None:
    import trio

    from treefed.client import connect
    from treefed.errors import TreefedError

    deadline = time.monotonic() + 30
    while True:
        try:
            with trio.fail_after(2):
                async with connect(uri, client_id="mem-probe") as conn:
                    await conn.stat()
                    return
        except (TreefedError, OSError, trio.TooSlowError):
            if time.monotonic() > deadline:
                raise
            await trio.sleep(0.1)


def one_round(root: Path, count: int, settle: float, allocator: str = "") -> dict:
    import trio

    from treefed.config import dump_config, parse_config

    port = _free_port()
    data = root / "data"
    shutil.rmtree(data, ignore_errors=True)
    config = root / "broker.toml"
    config.write_text(dump_config(parse_config({
        "broker": {"id": "mem", "data_dir": str(data), "listen": [f"tcp://127.0.0.1:{port}"]},
        "logging": {"level": "warning", "file": str(root / "broker.log")}})))
    proc = subprocess.Popen([sys.executable, "-m", "treefed.cli", "broker", "--config",
                             str(config)], cwd=str(REPO),
                            env=dict(os.environ, PYTHONPATH=str(REPO),
                                     **({"PYTHONMALLOC": allocator} if allocator else {})),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    uri = f"tcp://127.0.0.1:{port}"
    try:
        trio.run(_wait_serving, uri)
        time.sleep(0.5)
        out = {"start_mib": _rss_mib(proc.pid)}
        time.sleep(settle)
        out["idle_mib"] = _rss_mib(proc.pid)
        trio.run(_pump, uri, count, False)
        out["after_np_mib"] = _rss_mib(proc.pid)
        trio.run(_pump, uri, count, True)
        out["after_p_mib"] = _rss_mib(proc.pid)
        time.sleep(settle)
        out["settled_mib"] = _rss_mib(proc.pid)
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def main(argv: list[str] | None = None) -> int:
    from treefed.node.trim import IDLE_TRIM_S

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=2 * IDLE_TRIM_S + 1.0,
                        help="seconds idle before the idle / settled reading")
    parser.add_argument("--allocator", choices=("pymalloc", "malloc"), default="",
                        help="the broker's PYTHONMALLOC (default: inherited); 'malloc' "
                        "lets the idle trim return a drained backlog's pages, see "
                        "node/trim.py")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="treefed-mem-"))
    try:
        rounds = [one_round(root, args.count, args.settle, args.allocator)
                  for _ in range(args.rounds)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    keys = rounds[0].keys()
    median = {k: statistics.median(r[k] for r in rounds) for k in keys}
    print(json.dumps({
        "bench": "broker_memory", "count": args.count, "settle_s": args.settle,
        "allocator": args.allocator or os.environ.get("PYTHONMALLOC", "pymalloc"),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "median": median, "rounds": rounds, "targets": TARGETS,
        "targets_met": {"idle_le_35mib": median["idle_mib"] <= TARGETS["idle_mib"],
                        "after_le_50mib": max(median["after_np_mib"], median["after_p_mib"])
                        <= TARGETS["after_mib"],
                        "settled_le_50mib": median["settled_mib"] <= TARGETS["after_mib"]},
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
