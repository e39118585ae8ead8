"""Mesh convergence benchmark (issue 3): how long until every store's interest is in
place, and how much demand that takes, at a given network TTL.

Estate: HQ, one region, S stores, duplex mesh links at --ttl; every store registers one
queue consumer on its own queue and nothing else.  The run uses the memory engine: real
BrokerNodes over in-memory streams in one process.  ``seconds`` is wall time from the
start of the run to the last ``demand.created``; ``demand_total`` the demand held when
the estate is quiet.  The same estate on the replay engine (the pure federation code,
no trio shell) is the same-run baseline: ``vs_replay`` = seconds / replay seconds.  Each
measurement runs in its own process so ``peak_rss_mb`` is its own.  Prints ONE JSON line:

    {"bench": "mesh_convergence", "stores": S, "ttl": T, "demand_total": ...,
     "expected_demand": ..., "converged": true, "advisory_frames": ..., "seconds": ...,
     "peak_rss_mb": ..., "replay_seconds": ..., "replay_peak_rss_mb": ..., "vs_replay": ...}
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treefed.scenario.engines import engine_class  # noqa: E402
from treefed.scenario.results import Recorder  # noqa: E402
from treefed.scenario.spec import parse_scenario  # noqa: E402
from treefed.scenario.workload import build_plan  # noqa: E402


class LastDemand:
    """Event-writer stand-in: remembers when the last demand was created (wall clock)."""

    def __init__(self) -> None:
        self.last = 0.0

    def write(self, ts: float, broker: str, event: str, fields: dict | None = None) -> None:
        if event == "demand.created":
            self.last = time.perf_counter()


def measure(doc: dict, engine: str) -> dict:
    """Run the one-mode scenario ``doc`` on ``engine`` in this process."""
    sc = parse_scenario(doc)
    plan = build_plan(sc)
    probe = LastDemand()
    rec = Recorder(plan, probe)
    runner = engine_class(engine)(plan, sc.modes[0], rec)
    gc.disable()
    started = time.perf_counter()
    runner.run()
    wall = time.perf_counter() - started
    c = rec.counts
    return {"demand_total": c.get("demand.created", 0) - c.get("demand.removed", 0),
            "advisory_frames": rec.adds_sent, "advisory_receipts": rec.adds_received,
            "advisories_dropped": c.get("advisory.dropped", 0),
            "seconds": round((probe.last or time.perf_counter()) - started, 3),
            "wall_s": round(wall, 3),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def in_child(script: str, args: list[str]) -> dict:
    """Run ``script --child ...`` in a fresh interpreter and return its JSON line."""
    out = subprocess.run([sys.executable, script, "--child", *args], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def mesh_doc(stores: int, ttl: int) -> dict:
    return {"name": f"mesh-converge-{stores}-ttl{ttl}",
            "topology": {"regions": 1, "stores_per_region": stores},
            "mode": [{"connector": "mesh", "network_ttl": ttl, "duplex": True}],
            "workload": {"store_queue_consumers": True}}


def expected_mesh_demand(stores: int, ttl: int) -> int:
    """Demand when converged: a store's consumer reaches its region at TTL 1; at TTL 2
    and more also HQ and every sibling store (HQ -> region -> sibling is 2 hops too)."""
    return stores if ttl == 1 else stores * (stores + 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stores", type=int, default=100)
    p.add_argument("--ttl", type=int, default=2)
    p.add_argument("--engine", default="memory")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    doc = mesh_doc(args.stores, args.ttl)
    if args.child:
        print(json.dumps(measure(doc, args.engine)))
        return 0
    report(__file__, ["--stores", str(args.stores), "--ttl", str(args.ttl)], args.engine,
           expected_mesh_demand(args.stores, args.ttl),
           {"bench": "mesh_convergence", "stores": args.stores, "ttl": args.ttl})
    return 0


def report(script: str, common: list[str], engine: str, expected: int, head: dict) -> None:
    """Measure ``engine`` and the replay baseline in child processes; print one JSON line."""
    live = in_child(script, [*common, "--engine", engine])
    base = in_child(script, [*common, "--engine", "replay"])
    print(json.dumps({
        **head, "engine": engine, **live, "expected_demand": expected,
        "converged": live["demand_total"] == expected,
        "replay_seconds": base["seconds"], "replay_peak_rss_mb": base["peak_rss_mb"],
        "vs_replay": round(live["seconds"] / base["seconds"], 2) if base["seconds"] else None,
    }))


if __name__ == "__main__":
    sys.exit(main())
