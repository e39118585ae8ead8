"""Spark job rows/s: the two-pass plan (analysis/passes.py) against the stage plan, same runs.

``python bench/spark_rows.py [--rounds N] [--driver-memory 1g] RUN_DIR...``

The run directories come from the scenario runner (``treefed compare --no-report
--no-model --out DIR sweep-size-4x0100 ...`` writes them with Parquet parts).  Runs
``treefed report`` on them alternately with ``--legacy-plan`` (the stage plan, the
same-run baseline) and without (the two passes), each in its own process, and parses
the job's own last line: event rows, job seconds after Spark start-up, start-up seconds,
Spark jobs and stages, the driver JVM's CPU seconds (load does not inflate it: with a
local master it is all of Spark's work; on 2 cores the quiet rows/s is at most
2 x rows / CPU s).  Each round's runs.csv and per_role.csv are compared byte for byte
with the first stage-plan round's.

Prints ONE JSON line: {"bench": "spark_rows", "rows": n, "rounds": [...],
"old"/"new": {"median_job_s", "median_rows_per_s", "median_cpu_s", "rows_per_cpu_s",
"jobs", "stages", "median_start_s"}, "speedup": old/new job s, "identical": bool,
"load": [...] before, "load_after": [...]}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = re.compile(r"([\d,]+) lines: job ([\d.]+) s .*Spark start ([\d.]+) s, "
                     r"(\d+) Spark jobs, (\d+) stages(?:, driver JVM CPU ([\d.]+) s)?")


def one(runs: list[Path], out: Path, driver_memory: str, legacy: bool) -> dict:
    cmd = [sys.executable, "-m", "treefed.cli", "report", *map(str, runs), "--out", str(out),
           "--driver-memory", driver_memory] + (["--legacy-plan"] if legacy else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    load = os.getloadavg()[0]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT))
    found = FIGURES.search(done.stdout)
    if done.returncode != 0 or not found:
        raise SystemExit(f"report failed ({done.returncode}): {done.stderr[-2000:]}")
    rows, job_s = int(found[1].replace(",", "")), float(found[2])
    cpu = float(found[6]) if found[6] else None
    return {"plan": "old" if legacy else "new", "rows": rows, "job_s": job_s,
            "start_s": float(found[3]), "jobs": int(found[4]), "stages": int(found[5]),
            "cpu_s": cpu, "rows_per_s": round(rows / job_s),
            "load": round((load + os.getloadavg()[0]) / 2, 1)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--driver-memory", default="1g")
    args = p.parse_args()
    load = os.getloadavg()
    rounds, first, identical = [], None, True
    with tempfile.TemporaryDirectory(prefix="spark-rows-") as tmp:
        for n in range(args.rounds):
            for legacy in (True, False):
                out = Path(tmp) / f"report-{'old' if legacy else 'new'}-{n}"
                rounds.append(one(args.runs, out, args.driver_memory, legacy))
                print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
                tables = tuple((out / f).read_bytes() for f in ("runs.csv", "per_role.csv"))
                if first is None:
                    first = tables
                identical = identical and tables == first
    summary = {}
    for plan in ("old", "new"):
        mine = [r for r in rounds if r["plan"] == plan]
        cpu = [r["cpu_s"] for r in mine if r["cpu_s"] is not None]
        job_s = statistics.median(r["job_s"] for r in mine)
        summary[plan] = {
            "median_job_s": job_s, "median_rows_per_s": round(mine[0]["rows"] / job_s),
            "median_cpu_s": statistics.median(cpu) if cpu else None,
            "rows_per_cpu_s": round(mine[0]["rows"] / statistics.median(cpu)) if cpu else None,
            "jobs": mine[0]["jobs"], "stages": mine[0]["stages"],
            "median_start_s": statistics.median(r["start_s"] for r in mine)}
    print(json.dumps({"bench": "spark_rows", "rows": rounds[0]["rows"], "rounds": rounds,
                      **summary,
                      "speedup": round(summary["old"]["median_job_s"]
                                       / summary["new"]["median_job_s"], 2),
                      "identical": identical, "load": [round(x, 1) for x in load],
                      "load_after": [round(x, 1) for x in os.getloadavg()]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
