"""``treefed compare [--full] [scenario...]``: the main job -- run, then report.

Theory of operation
-------------------
Runs each scenario with the replay engine under the tree connector, the mesh
connector at TTL 1, 2 and 3 (duplex links) and the tuned mesh of baselines.py (each
store's connector limited to its own, its region's and HQ's queues); the scenario's own
modes are kept, the missing ones of that set added, then hands every run directory to the Spark job
(``treefed.analysis.job.main``) and prints where the report is.  The default set is the
size sweep ``sweep-size-4x0005`` .. ``4x0250`` (one workload, 4 regions, 5 to 250 stores
each), the depth sweep ``sweep-depth-2`` .. ``4`` (240 stores, 2 to 4 levels below HQ),
``reconfigure`` and ``churn``; ``--full`` adds ``sweep-size-4x1000`` (millions of events
at TTL 2 and 3).  Java is checked before the first run (the report needs it).  A scenario is a file path or
the name of a file in ``scenarios/`` (the working directory's, else the checkout's).
Every scenario is validated before the first run starts.

Each scenario runs in a child process that exits when it is done (``_run_apart``): a
run's millions of objects leave the interpreter's heap fragmented and its RSS high after
they are freed, and the Spark JVM starts after the last run -- in one process the two
peaks added up (3.6-4.0 GiB for ``make run``); apart, the peak is the larger of them.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Sequence

from treefed.errors import ConfigError
from treefed.scenario.baselines import TUNED_MODES, tuned_modes
from treefed.scenario.spec import Mode, Scenario, load_scenario

__all__ = ["main", "DEFAULT_SCENARIOS", "FULL_SCENARIOS", "COMPARED_MODES",
           "find_scenario", "with_compared_modes"]

#: The controlled sweeps (one workload each; report.py's scale and depth plots use only
#: them), then the fault scenarios.
SIZE_SWEEP = tuple(f"sweep-size-4x{n:04d}" for n in (5, 25, 100, 250))
DEPTH_SWEEP = ("sweep-depth-2", "sweep-depth-3", "sweep-depth-4")
DEFAULT_SCENARIOS = (*SIZE_SWEEP, *DEPTH_SWEEP, "reconfigure", "churn")
FULL_SCENARIOS = (*DEFAULT_SCENARIOS, "sweep-size-4x1000")
#: label -> (connector, options) every compared scenario runs under.
COMPARED_MODES: dict[str, tuple[str, dict]] = {
    "tree": ("tree", {}),
    "mesh-ttl1": ("mesh", {"network_ttl": 1, "duplex": True}),
    "mesh-ttl2": ("mesh", {"network_ttl": 2, "duplex": True}),
    "mesh-ttl3": ("mesh", {"network_ttl": 3, "duplex": True}),
}
#: The report's Spark driver heap: the JVM's resident set is about 1.4 GiB with it.
DRIVER_MEMORY = "1g"
_CHECKOUT = Path(__file__).resolve().parents[2] / "scenarios"


def find_scenario(name: str) -> Path:
    """A scenario file: ``name`` itself, or ``scenarios/<name>.toml`` here or in the
    checkout.  ConfigError when none exists."""
    direct = Path(name)
    if direct.is_file():
        return direct
    stem = name if name.endswith(".toml") else f"{name}.toml"
    for folder in (Path("scenarios"), _CHECKOUT):
        candidate = folder / stem
        if candidate.is_file():
            return candidate
    raise ConfigError("", f"no scenario {name!r} (not a file, not in scenarios/)")


def summary_mode(budget: int) -> tuple[str, dict]:
    """The ``tree-summary`` mode (issue 18 part 2): the tree with ``summary_budget`` on
    every tree link and the stores' own queues routed by subtree ownership."""
    return "tree", {"summary_budget": budget, "summary_owned": [SUMMARY_OWNED]}


#: the queues a store owns in every shipped scenario (scenario/spec.py STORE_QUEUE)
SUMMARY_OWNED = "queue://Store.{broker}.>"


def with_compared_modes(scenario: Scenario, *, summary_budget: int = 0) -> Scenario:
    """``scenario`` with every mode of COMPARED_MODES it lacks appended, then the tuned
    baselines (baselines.py) with the network TTL set to the estate's depth, then (with
    ``summary_budget``) ``tree-summary``."""
    modes = list(scenario.modes)
    have = {m.label for m in modes}
    wanted = dict(COMPARED_MODES)
    if any(label not in have for label in TUNED_MODES):
        wanted.update(tuned_modes(scenario.build_topology().depth))
    if summary_budget:
        wanted["tree-summary"] = summary_mode(summary_budget)
    for label, (connector, options) in wanted.items():
        if label not in have:
            modes.append(Mode(label, connector, dict(options)))
    return dataclasses.replace(scenario, modes=tuple(modes))


def _run_in_child(scenario: Scenario, out: str) -> list:
    from treefed.scenario.runner import run_scenario

    # only what the summary table needs crosses back: not the per-message deliveries
    return [dataclasses.replace(r, deliveries={})
            for r in run_scenario(scenario, engine="replay", out=out)]


def _run_apart(scenario: Scenario, out: str) -> list:
    """``run_scenario`` in a fresh child process (spawned, so it inherits no heap), which
    exits afterwards and gives its memory back; its RunResults without deliveries."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_run_in_child, scenario, out).result()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="treefed compare",
                                description="run scenarios in tree and TTL modes, then "
                                            "report with the Spark job")
    p.add_argument("scenarios", nargs="*", help="scenario names or files (default: "
                                                 + ", ".join(DEFAULT_SCENARIOS) + ")")
    p.add_argument("--full", action="store_true",
                   help="also run sweep-size-4x1000 (4 x 1,000 stores)")
    p.add_argument("--out", default="runs", help="directory for run directories")
    p.add_argument("--report", default=None,
                   help="report directory (default reports/compare-<time>)")
    p.add_argument("--no-report", action="store_true", help="run only, skip the Spark job")
    p.add_argument("--summary-budget", type=int, default=0, metavar="N",
                   help="also run tree-summary: the tree with summary_budget = N (interest "
                        "summarised at branches, issue 18 part 2); default off")
    p.add_argument("--driver-memory", default=DRIVER_MEMORY,
                   help=f"Spark driver heap for the report (default {DRIVER_MEMORY}: the "
                        "job reads the runs' Parquet parts and fits; keeps make run's whole "
                        "process tree under 2 GiB)")
    args = p.parse_args(argv)
    names = args.scenarios or list(FULL_SCENARIOS if args.full else DEFAULT_SCENARIOS)
    if args.full and args.scenarios and "sweep-size-4x1000" not in names:
        names.append("sweep-size-4x1000")
    try:
        scenarios = [with_compared_modes(load_scenario(find_scenario(n)),
                                         summary_budget=args.summary_budget)
                     for n in names]
    except ConfigError as exc:
        key = f"{exc.key}: " if exc.key else ""
        notes = "".join(f" ({n})" for n in getattr(exc, "__notes__", ()))
        print(f"treefed compare: {key}{exc.problem}{notes}", file=sys.stderr)
        return 2
    if not args.no_report:
        # The report needs Java; find out now, not after every scenario has run.
        from treefed.analysis.integrity import java_problem

        if (problem := java_problem()) is not None:
            print(f"treefed compare: {problem} (or pass --no-report to run only)",
                  file=sys.stderr)
            return 2

    from rich.console import Console

    from treefed.scenario.cli import summary_table

    console = Console(stderr=False)
    if not console.is_terminal:
        console = Console(width=132)
    started = time.perf_counter()
    run_dirs: list[str] = []
    for scenario in scenarios:
        console.print(f"[bold]{scenario.name}[/]: {len(scenario.modes)} modes, replay engine",
                      highlight=False)
        results = _run_apart(scenario, args.out)
        console.print(summary_table(results, title=scenario.name))
        run_dirs += [str(r.path) for r in results]
    console.print(f"{len(run_dirs)} runs in {time.perf_counter() - started:.0f} s",
                  highlight=False)
    if args.no_report:
        return 0
    report = args.report or f"reports/compare-{time.strftime('%Y%m%d-%H%M%S')}"
    from treefed.analysis.job import main as report_main

    # it prints where the report is
    return report_main([*run_dirs, "--out", report, "--driver-memory", args.driver_memory])


if __name__ == "__main__":
    sys.exit(main())
