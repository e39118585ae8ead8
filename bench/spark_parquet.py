"""Spark job speed: Parquet event parts against the JSON lines, on the same runs (issue 13).

``python bench/spark_parquet.py [--rounds N] [--driver-memory 1g] RUN_DIR...``

The run directories (made by ``treefed scenario run`` / ``treefed compare --no-report``,
so they have Parquet parts) are mirrored once under a temporary folder, same names,
without the parts and without ``parquet_parts`` in summary.json: the JSON-lines path,
the same-run baseline.  Then ``treefed report`` runs on each, alternating (json, parquet,
json, parquet, ...), each in its own process, and the job's own figures are parsed from
its last lines: event rows, job seconds after Spark start-up, start-up seconds.  Each
round's runs.csv is compared byte for byte with the first JSON round's.

Prints ONE JSON line: {"bench": "spark_parquet", "rows": n, "rounds": [...],
"json": {"median_job_s", "median_rows_per_s"}, "parquet": {...}, "speedup": r,
"identical_runs_csv": bool, "load": [...] (before), "load_after": [...]}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = re.compile(r"([\d,]+) lines: job ([\d.]+) s .*Spark start ([\d.]+) s")


def json_mirror(runs: list[Path], root: Path) -> list[Path]:
    """The runs without their Parquet parts (hard links where possible)."""
    out = []
    for run in runs:
        copy = root / run.name
        copy.mkdir(parents=True)
        for f in run.iterdir():
            if f.suffix == ".parquet" or f.name == "summary.json":
                continue
            try:
                os.link(f, copy / f.name)
            except OSError:
                shutil.copy(f, copy / f.name)
        summary = json.loads((run / "summary.json").read_text())
        summary.pop("parquet_parts", None)
        (copy / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        out.append(copy)
    return out


def one(runs: list[Path], out: Path, driver_memory: str) -> dict:
    cmd = [sys.executable, "-m", "treefed.cli", "report", *map(str, runs), "--out", str(out),
           "--driver-memory", driver_memory]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(ROOT))
    found = FIGURES.search(done.stdout)
    if done.returncode != 0 or not found:
        raise SystemExit(f"report failed ({done.returncode}): {done.stderr[-2000:]}")
    rows, job_s, start_s = int(found[1].replace(",", "")), float(found[2]), float(found[3])
    return {"rows": rows, "job_s": job_s, "start_s": start_s,
            "rows_per_s": round(rows / job_s), "load": os.getloadavg()[0]}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("runs", nargs="+", type=Path)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--driver-memory", default="1g")
    args = p.parse_args()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="spark-parquet-") as tmp:
        plain = json_mirror(args.runs, Path(tmp) / "json")
        rounds, first_csv, identical = [], None, True
        for n in range(args.rounds):
            for path, dirs in (("json", plain), ("parquet", args.runs)):
                out = Path(tmp) / f"report-{path}-{n}"
                figures = {"round": n + 1, "path": path,
                           **one(dirs, out, args.driver_memory)}
                rounds.append(figures)
                print(json.dumps(figures), file=sys.stderr, flush=True)
                text = (out / "runs.csv").read_bytes()
                first_csv = first_csv or text
                identical = identical and text == first_csv
    result: dict = {"bench": "spark_parquet", "rows": rounds[0]["rows"], "rounds": rounds}
    for path in ("json", "parquet"):
        mine = [r for r in rounds if r["path"] == path]
        result[path] = {"median_job_s": statistics.median(r["job_s"] for r in mine),
                        "median_rows_per_s": round(statistics.median(
                            r["rows_per_s"] for r in mine))}
    result["speedup"] = round(result["json"]["median_job_s"]
                              / result["parquet"]["median_job_s"], 2)
    result["identical_runs_csv"] = identical
    result["load"] = load
    result["load_after"] = os.getloadavg()
    print(json.dumps(result))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
