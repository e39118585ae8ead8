"""Scenario-runner scale benchmark (issue 5): the estate sizes the issue sets targets for.

Three measurements, each in its own interpreter (so each peak RSS is its own):

* ``tree_memory``: retail-4x1000 in tree mode on the memory engine (4,005 BrokerNodes in
  one process) -- wall seconds, peak RSS, and whether it converged (every expected
  delivery made, nothing stranded).  Target: < 60 s, < 2 GiB.
* ``mesh_replay``: retail-<R>x<S> in mesh TTL 2 on the replay engine -- wall seconds,
  peak RSS, demand total.  Target at 4 x 1000 (about 4 million demand subscriptions):
  < 5 min, < 8 GiB.  ``--mesh-stores`` scales it down on a machine that cannot spare the
  memory (demand grows with the square of the stores per region).
* the replay engine's rate: advisory events (advisory.* and demand.* lines) per second
  of the mesh run, event log written (gzip) as in a real run; target >= 200,000.  The
  same-run baseline is ``log_only``: the rate at which the event writer alone writes
  lines of the same shape, i.e. the ceiling that logging leaves.  Each case also reports
  its CPU seconds (all threads) and the rate per CPU second: on a shared, loaded machine
  wall time says more about the neighbours than about the code.

Prints ONE JSON line: {"bench": "scenario_scale", "tree_memory": {...},
"mesh_replay": {...}, "replay_advisory_events_per_s": ..., "log_only_lines_per_s": ...,
"vs_log_only": ...}.  With ``--repeat R`` the mesh replay runs R times and the median run
is reported (each run listed under ``mesh_replay.runs``).
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treefed.scenario.runner import run_scenario  # noqa: E402
from treefed.scenario.spec import load_scenario  # noqa: E402

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def child_tree_memory(stores: int, out: str) -> dict:
    sc = _sized(load_scenario(SCENARIOS / "retail-4x1000.toml"), stores)
    (r,) = run_scenario(sc, engine="memory", out=out, modes=["tree"])
    s = r.summary
    return {"stores_per_region": stores, "brokers": s["brokers"], "wall_s": s["wall_s"],
            "peak_rss_mb": s["peak_rss_mb"], "demand_total": s["demand_held"],
            "converged": s["delivered"] == s["expected"] and s["stranded"] == 0,
            "events": s["events"]}


def child_mesh_replay(stores: int, out: str) -> dict:
    sc = _sized(load_scenario(SCENARIOS / "retail-4x1000.toml"), stores)
    cpu = time.process_time()
    (r,) = run_scenario(sc, engine="replay", out=out, modes=["mesh-ttl2"])
    cpu = time.process_time() - cpu      # includes the run's final gc.collect
    s = r.summary
    adv = s["advisory_frames"] + s["advisory_receipts"] + s["advisory_removals"] \
        + s["advisories_dropped"] + s["demand_created"] + s["demand_removed"]
    return {"stores_per_region": stores, "brokers": s["brokers"], "wall_s": s["wall_s"],
            "peak_rss_mb": s["peak_rss_mb"], "demand_total": s["demand_created"],
            "events": s["events"], "advisory_events": adv,
            "advisory_events_per_s": round(adv / s["wall_s"]),
            "cpu_s": round(cpu, 3), "advisory_events_per_cpu_s": round(adv / cpu),
            "bytes_per_demand": round(s["peak_rss_mb"] * 2**20 / max(1, s["demand_created"])),
            "log_bytes": sum((r.path / name).stat().st_size for name in s["log_files"]),
            "log_files": len(s["log_files"])}


def child_log_only(lines: int, out: str) -> dict:
    """The event writer alone, on advisory-shaped lines (the logging ceiling)."""
    from treefed.log import EventWriter

    fields = [{"link": "uplink", "peer": f"region-{i % 4}", "consumer":
               f"store-r1-{i % 1000:04d}/app/store-queue",
               "dst": f"queue://Store.store-r1-{i % 1000:04d}.Incoming",
               "origin": f"store-r1-{i % 1000:04d}", "kind": "add", "hops": 2}
              for i in range(1000)]
    gc.disable()
    with EventWriter(Path(out) / "log-only.jsonl.gz", run="bench") as w:
        started, cpu = time.perf_counter(), time.process_time()
        for i in range(lines):
            w.write(i * 1e-6, "store-r1-0001", "advisory.received", fields[i % 1000])
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu
    return {"lines": lines, "wall_s": round(wall, 3), "lines_per_s": round(lines / wall),
            "lines_per_cpu_s": round(lines / cpu)}


def _sized(sc, stores: int):
    import dataclasses

    return dataclasses.replace(sc, topology=dataclasses.replace(
        sc.topology, stores_per_region=stores))


def in_child(case: str, n: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", case, str(n)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree-stores", type=int, default=1000, help="stores per region, tree")
    p.add_argument("--mesh-stores", type=int, default=1000, help="stores per region, mesh")
    p.add_argument("--repeat", type=int, default=1,
                   help="mesh replay runs (each in a fresh interpreter); the rate "
                        "reported is their median, every run is listed")
    p.add_argument("--child", nargs=2, metavar=("CASE", "N"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        case, n = args.child[0], int(args.child[1])
        with tempfile.TemporaryDirectory(prefix="treefed-bench-") as out:
            result = {"tree_memory": child_tree_memory, "mesh_replay": child_mesh_replay,
                      "log_only": child_log_only}[case](n, out)
        result["peak_rss_mb"] = max(result.get("peak_rss_mb", 0), round(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))
        print(json.dumps(result))
        return 0
    tree = in_child("tree_memory", args.tree_stores)
    meshes = [in_child("mesh_replay", args.mesh_stores) for _ in range(max(1, args.repeat))]
    log_only = in_child("log_only", 1_000_000)
    # the median run (a shared machine's neighbours come and go between runs)
    mesh = sorted(meshes, key=lambda m: m["advisory_events_per_s"])[len(meshes) // 2]
    rate = mesh["advisory_events_per_s"]
    if len(meshes) > 1:
        mesh = {**mesh, "runs": [{k: m[k] for k in ("wall_s", "advisory_events_per_s",
                                                    "cpu_s", "peak_rss_mb")}
                                 for m in meshes]}
    print(json.dumps({
        "bench": "scenario_scale", "tree_memory": tree, "mesh_replay": mesh,
        "replay_advisory_events_per_s": rate, "log_only_lines_per_s": log_only["lines_per_s"],
        "replay_advisory_events_per_cpu_s": mesh["advisory_events_per_cpu_s"],
        "log_only_lines_per_cpu_s": log_only["lines_per_cpu_s"],
        "vs_log_only": round(rate / log_only["lines_per_s"], 3),
        "targets": {"tree_memory": "wall_s < 60, peak_rss_mb < 2048",
                    "mesh_replay": "at 4x1000: wall_s < 300, peak_rss_mb < 8192",
                    "replay_advisory_events_per_s": ">= 200000"},
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
