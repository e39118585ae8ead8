"""Messages on Spark cells at scale: ``python bench/model_messages.py [--regions 10]
[--stores-per-region 10000] [--modes tree,mesh-ttl1,mesh-ttl2,mesh-ttl3]``.

For each mode, one ``treefed model sweep-size-4x1000 --regions R --stores-per-region S
--mode M --messages --no-brokers`` (the Spark engine: demand and messages on the cells,
``model/spark_messages.py``) in a child process, its whole process tree's RSS sampled
(``bench/tree_rss.py``: the JVM included).  Prints ONE JSON line: per mode wall time,
peak MiB of the tree, the step times the model records (``model.json``), and the
message figures (expected, delivered, stranded, dropped, stranded_at, stranded_tiers,
message classes), with ``uptime``'s load before and after each run.  Modes run one after
another (one Spark job at a time).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ("brokers", "cells", "adds_sent", "demand", "expected", "delivered", "stranded",
           "dropped", "stranded_at", "stranded_tiers", "message_classes", "messages")


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run(mode: str, regions: int, stores: int, driver_memory: str, tmp: Path) -> dict:
    out = tmp / mode
    cmd = [sys.executable, str(ROOT / "bench" / "tree_rss.py"), "--",
           sys.executable, "-m", "treefed.model.cli", "sweep-size-4x1000",
           "--regions", str(regions), "--stores-per-region", str(stores), "--mode", mode,
           "--messages", "--no-brokers", "--driver-memory", driver_memory, "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    load_before = _load()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    rss = json.loads(lines[-1]) if lines else {}
    row: dict = {"mode": mode, "rc": rss.get("rc", proc.returncode),
                 "wall_s": rss.get("wall_s"), "peak_mib": rss.get("peak_mib"),
                 "peak_processes": rss.get("peak_processes", [])[:3],
                 "load_before": load_before, "load_after": _load()}
    if row["rc"] != 0:
        row["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return row
    with (out / "model.csv").open(newline="", encoding="utf-8") as fh:
        model = next(csv.DictReader(fh))
    row.update({k: model.get(k) for k in FIGURES})
    meta = json.loads((out / "model.json").read_text(encoding="utf-8"))
    row["steps"] = meta["timings"].get(f"{mode}_steps")
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--regions", type=int, default=10)
    p.add_argument("--stores-per-region", type=int, default=10_000)
    p.add_argument("--modes", default="tree,mesh-ttl1,mesh-ttl2,mesh-ttl3")
    p.add_argument("--driver-memory", default="3g")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="model-messages-") as tmp:
        for mode in args.modes.split(","):
            rows.append(run(mode, args.regions, args.stores_per_region,
                            args.driver_memory, Path(tmp)))
            print(f"# {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
    print(json.dumps({"bench": "model_messages", "regions": args.regions,
                      "stores_per_region": args.stores_per_region,
                      "driver_memory": args.driver_memory, "cpus": os.cpu_count(),
                      "runs": rows}))
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
