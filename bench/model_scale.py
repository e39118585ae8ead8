"""Model scale benchmark (issue 19): the analytic model against the replay engine, and
the model alone where nothing can emulate the estate.

Every measurement runs in its own process tree, and its peak memory is the largest sum
of resident set sizes over the process and all its children (the Spark JVM included),
sampled from /proc every 0.2 s:

* ``compare_4x1000`` (issue 19 "for retail-4x1000 in every mode"): for every mode the
  report runs -- tree, mesh-ttl1, mesh-ttl2, mesh-ttl3 (compare.COMPARED_MODES) and
  mesh-tuned (baselines.py) -- the replay engine's first convergence (the plan's
  consumers at t = 0, no timeline, no messages: ``model/truth.py``; the same-run
  baseline) and ``treefed model retail-4x1000 --mode M`` on Spark, one after the other,
  each alone: wall, peak memory, and every per-broker figure compared (any difference
  printed to stderr and counted in ``differences``).  A replay runs only when the
  machine has room (``--max-load``, ``--min-free-gib``: it waits up to ``--wait``
  seconds, else the mode is skipped with the reason) and under an address-space limit
  (``--replay-limit-gib``), so an estate too big for the machine fails with MemoryError
  in its own process instead of waking the OOM killer.  ``--regions`` /
  ``--stores-per-region`` check a smaller estate (e.g. 4 x 500).  mesh-tuned gives every
  store its own filter; the filters are folded relative to the store
  (``cells._relative``), so a region's stores are one cell as in the other modes (9
  cells, ~100 flag rows at 4 x 1,000; before that: 4,005 cells and 32 million flag rows
  built in Python, which did not fit).
* ``model_10x10000``: ``treefed model retail-4x1000 --regions 10 --stores-per-region
  10000 --mode M --no-brokers`` for M in tree, mesh-ttl1, mesh-ttl2, mesh-ttl3.
  Targets: each < 300 s and < 4 GiB on 2 cores.

Prints ONE JSON line: {"bench": "model_scale", "load_before": [...], "compare_4x1000":
{mode: {"replay": {wall_s, peak_rss_mb, rc, load}, "model": {...}, "differences": n,
"brokers_compared": n, "vs_replay_wall": r, "vs_replay_rss": r} | {"skipped": why}},
"model_10x10000": {mode: {...}}}.  ``--skip-replay`` / ``--skip-large`` /
``--compare-modes`` / ``--modes`` (10 x 10,000) run a part.
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
#: every mode the report compares (compare.COMPARED_MODES + baselines.TUNED_MODES)
COMPARE_MODES = (*MODES, "mesh-tuned")
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


def measure(cmd: list[str], log: Path, limit_bytes: int = 0) -> dict:
    """Run ``cmd``; wall seconds, peak tree RSS (MiB), exit status, load at the start.
    ``limit_bytes``: the child's address-space limit (0: none)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    peak = 0
    load = [round(x, 2) for x in os.getloadavg()]

    def limit() -> None:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    started = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=str(ROOT), preexec_fn=limit if limit_bytes else None)
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
            "peak_rss_mb": round(peak / 2**20), "rc": rc, "load": load}


def child_replay(out: str, label: str, regions: int, stores: int) -> None:
    """In a child: replay counts of retail-4x1000 (resized to ``regions`` x ``stores``
    unless 4 x 1000) under mode ``label``, per broker, to ``out``."""
    sys.path.insert(0, str(ROOT))
    from treefed.model.cli import _scenario   # the model command's own resizing
    from treefed.model.exact import estate_from_topology
    from treefed.model.truth import replay_counts
    from treefed.scenario.workload import build_plan

    size = (None, None) if (regions, stores) == (4, 1000) else (regions, stores)
    sc = _scenario("retail-4x1000", *size)
    plan = build_plan(sc)
    mode = next(m for m in sc.modes if m.label == label)
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


def available_gib() -> float:
    """MemAvailable of this machine, GiB."""
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return 0.0


def wait_for_room(max_load: float, min_free: float, wait: float) -> str | None:
    """None once the 1-minute load is below ``max_load`` and more than ``min_free`` GiB
    are available; after ``wait`` seconds, why not."""
    deadline = time.monotonic() + wait
    while True:
        load, free = os.getloadavg()[0], available_gib()
        if load < max_load and free > min_free:
            return None
        if time.monotonic() >= deadline:
            return (f"no room after {wait:.0f} s: load {load:.1f} (max {max_load}), "
                    f"{free:.1f} GiB available (min {min_free})")
        time.sleep(15)


def compare(tmp: Path, label: str, args) -> dict:
    """Replay, then model, of one mode; their per-broker differences."""
    size = f"{args.regions}x{args.stores_per_region}"
    why = wait_for_room(args.max_load, args.min_free_gib, args.wait)
    if why is not None:
        return {"size": size, "skipped": why}
    counts = tmp / f"replay-{label}.csv"
    replay = measure([sys.executable, str(Path(__file__).resolve()), "--child-replay-to",
                      str(counts), label, str(args.regions), str(args.stores_per_region)],
                     tmp / f"replay-{label}.log", int(args.replay_limit_gib * 2**30))
    r: dict = {"size": size, "replay": replay}
    if replay["rc"] != 0:
        r["replay"]["log_tail"] = (tmp / f"replay-{label}.log").read_text()[-600:]
    resize = () if (args.regions, args.stores_per_region) == (4, 1000) else (
        "--regions", str(args.regions), "--stores-per-region", str(args.stores_per_region))
    out = tmp / f"m-{label}"
    model = measure(_model_cmd(out, "--mode", label, *resize), tmp / f"m-{label}.log")
    model["timings"] = _timings(out)
    if model["rc"] != 0:
        model["log_tail"] = (tmp / f"m-{label}.log").read_text()[-600:]
    r["model"] = model
    if replay["rc"] == 0 and model["rc"] == 0:
        truth = _read(counts)
        diff = differences(truth, _read(out / f"brokers-{label}.csv"))
        for line in diff[:50]:
            print(f"difference [{label}]:", line, file=sys.stderr)
        r["differences"] = len(diff)
        r["brokers_compared"] = len(truth)
        r["demand_total"] = sum(row.get("demand", 0) for row in truth.values())
        r["adds_sent_total"] = sum(row.get("adds_sent", 0) for row in truth.values())
        r["vs_replay_wall"] = round(model["wall_s"] / replay["wall_s"], 3)
        r["vs_replay_rss"] = round(model["peak_rss_mb"] / max(1, replay["peak_rss_mb"]), 3)
    return r


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--skip-replay", action="store_true",
                   help="skip the model-vs-replay comparison")
    p.add_argument("--skip-large", action="store_true", help="skip the 10 x 10,000 runs")
    p.add_argument("--modes", default=",".join(MODES), help="modes of the 10 x 10,000 runs")
    p.add_argument("--compare-modes", default=",".join(COMPARE_MODES),
                   help="modes compared with the replay engine")
    p.add_argument("--regions", type=int, default=4, help="compared estate: regions")
    p.add_argument("--stores-per-region", type=int, default=1000,
                   help="compared estate: stores per region")
    p.add_argument("--max-load", type=float, default=10.0,
                   help="start a replay only below this 1-minute load")
    p.add_argument("--min-free-gib", type=float, default=12.0,
                   help="start a replay only with more than this much memory available")
    p.add_argument("--wait", type=float, default=600.0,
                   help="seconds to wait for room before skipping a mode")
    p.add_argument("--replay-limit-gib", type=float, default=12.0,
                   help="address-space limit of a replay child")
    args = p.parse_args(argv)
    result: dict = {"bench": "model_scale", "load_before": list(os.getloadavg())}
    with tempfile.TemporaryDirectory(prefix="model-scale-") as tmp:
        tmp = Path(tmp)
        if not args.skip_replay:
            result["compare_4x1000"] = {label: compare(tmp, label, args)
                                        for label in args.compare_modes.split(",")}
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
    if len(sys.argv) == 6 and sys.argv[1] == "--child-replay-to":
        child_replay(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        os._exit(0)     # skip freeing millions of demand objects: not part of the work
    sys.exit(main())
