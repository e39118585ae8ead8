"""Model scale benchmark (issue 19): the analytic model against the replay engine, and
the model alone where nothing can emulate the estate.

Every measurement runs in its own process tree, and its peak memory is the largest sum
of resident set sizes over the process and all its children (the Spark JVM included),
sampled from /proc every 0.2 s:

* ``replay``: retail-4x1000 in mesh TTL 2, first convergence (the plan's consumers at
  t = 0, no timeline, no messages: ``model/truth.py``) on the replay engine -- the
  same-run baseline.  Its per-broker counts are written for the comparison.
* ``model_4x1000``: ``treefed model retail-4x1000 --mode mesh-ttl2`` on Spark: wall, peak
  memory, and every per-broker figure compared with the replay's; any difference is
  printed (stderr) and counted in ``differences``.
* ``model_10x10000``: ``treefed model retail-4x1000 --regions 10 --stores-per-region
  10000 --mode M --no-brokers`` for M in tree, mesh-ttl1, mesh-ttl2, mesh-ttl3.
  Targets: each < 300 s and < 4 GiB on 2 cores.

Prints ONE JSON line: {"bench": "model_scale", "load": [...], "replay": {...},
"model_4x1000": {..., "differences": n, "vs_replay_wall": r}, "model_10x10000": {mode:
{...}}}.  ``--skip-replay`` / ``--skip-large`` / ``--modes`` run a part.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("tree", "mesh-ttl1", "mesh-ttl2", "mesh-ttl3")
FIGURES = ("adds_sent", "adds_received", "demand", "interest")


def _tree_rss_bytes(root: int) -> int:
    """Resident bytes of ``root`` and every descendant (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [root]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/statm") as fh:
                total += int(fh.read().split()[1]) * page
        except OSError:
            pass
    return total


def measure(cmd: list[str], log: Path) -> dict:
    """Run ``cmd``; wall seconds, peak tree RSS (MiB), exit status."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    peak = 0
    started = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=str(ROOT))
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, _tree_rss_bytes(proc.pid))
                done.wait(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rc = proc.wait()
        done.set()
        sampler.join()
    return {"wall_s": round(time.perf_counter() - started, 1),
            "peak_rss_mb": round(peak / 2**20), "rc": rc}


def child_replay(out: str) -> None:
    """In a child: replay counts of retail-4x1000 mesh TTL 2, per broker, to ``out``."""
    sys.path.insert(0, str(ROOT))
    from treefed.model.exact import estate_from_topology
    from treefed.model.truth import replay_counts
    from treefed.scenario.compare import find_scenario, with_compared_modes
    from treefed.scenario.spec import load_scenario
    from treefed.scenario.workload import build_plan

    sc = with_compared_modes(load_scenario(find_scenario("retail-4x1000")))
    plan = build_plan(sc)
    mode = next(m for m in sc.modes if m.label == "mesh-ttl2")
    brokers = estate_from_topology(plan.topology, mode).brokers
    rows = replay_counts(plan, mode).per_broker(brokers)
    keys = sorted({k for r in rows.values() for k in r})
    with open(out, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["broker", *keys])
        for b, r in rows.items():
            w.writerow([b, *(r.get(k, 0) for k in keys)])


def _read(path: Path) -> dict[str, dict[str, int]]:
    with path.open() as fh:
        return {r["broker"]: {k: int(v) for k, v in r.items()
                              if k not in ("broker", "tier", "sibling_spill",
                                                      "downward_interest")}
                for r in csv.DictReader(fh)}


def differences(replay: dict, model: dict) -> list[str]:
    """Every (broker, figure) where the two disagree; a missing figure counts as 0."""
    out = []
    for b in sorted(set(replay) | set(model)):
        a, m = replay.get(b), model.get(b)
        if a is None or m is None:
            out.append(f"{b}: only in {'model' if a is None else 'replay'}")
            continue
        for k in sorted(set(a) | set(m)):
            if a.get(k, 0) != m.get(k, 0):
                out.append(f"{b} {k}: replay {a.get(k, 0)} model {m.get(k, 0)}")
    return out


def _model_cmd(out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "treefed.cli", "model", "retail-4x1000", *args,
            "--out", str(out)]


def _timings(out: Path) -> dict:
    try:
        return json.loads((out / "model.json").read_text())["timings"]
    except (OSError, ValueError, KeyError):
        return {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--skip-replay", action="store_true")
    p.add_argument("--skip-large", action="store_true")
    p.add_argument("--modes", default=",".join(MODES))
    args = p.parse_args(argv)
    result: dict = {"bench": "model_scale", "load_before": list(os.getloadavg())}
    with tempfile.TemporaryDirectory(prefix="model-scale-") as tmp:
        tmp = Path(tmp)
        if not args.skip_replay:
            counts = tmp / "replay.csv"
            result["replay"] = measure(
                [sys.executable, str(Path(__file__).resolve()), "--child-replay-to",
                 str(counts)], tmp / "replay.log")
            out = tmp / "m4"
            m4 = measure(_model_cmd(out, "--mode", "mesh-ttl2"), tmp / "m4.log")
            m4["timings"] = _timings(out)
            if result["replay"]["rc"] == 0 and m4["rc"] == 0:
                diff = differences(_read(counts), _read(out / "brokers-mesh-ttl2.csv"))
                for line in diff[:50]:
                    print("difference:", line, file=sys.stderr)
                m4["differences"] = len(diff)
                m4["brokers_compared"] = len(_read(counts))
                m4["vs_replay_wall"] = round(m4["wall_s"] / result["replay"]["wall_s"], 3)
                m4["vs_replay_rss"] = round(m4["peak_rss_mb"]
                                            / max(1, result["replay"]["peak_rss_mb"]), 3)
            result["model_4x1000"] = m4
        if not args.skip_large:
            large = {}
            for mode in args.modes.split(","):
                out = tmp / f"l-{mode}"
                r = measure(_model_cmd(out, "--regions", "10", "--stores-per-region", "10000",
                                       "--mode", mode, "--no-brokers"), tmp / f"{mode}.log")
                r["timings"] = _timings(out)
                try:
                    (row,) = csv.DictReader((out / "model.csv").open())
                    r.update({k: int(row[k]) for k in ("brokers", "adds_sent", "demand",
                                                       "sibling_spill")})
                except (OSError, ValueError):
                    r["log_tail"] = (tmp / f"{mode}.log").read_text()[-400:]
                r["within_target"] = r["rc"] == 0 and r["wall_s"] < 300 \
                    and r["peak_rss_mb"] < 4096
                large[mode] = r
            result["model_10x10000"] = large
    result["load_after"] = list(os.getloadavg())
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child-replay-to":
        child_replay(sys.argv[2])
        os._exit(0)     # skip freeing millions of demand objects: not part of the work
    sys.exit(main())
