"""``treefed compare [--full] [scenario...]``: the main job -- run, then report.

Theory of operation
-------------------
Runs each scenario with the replay engine under the tree connector, the mesh
connector at TTL 1, 2 and 3 (duplex links) and the tuned mesh of baselines.py (each
store's connector limited to its own, its region's and HQ's queues), and two tree
variants: ``tree-summary`` (interest summarised at branches, ``summary_budget`` 50)
and ``tree-resync`` (delta resync on reconnect, ``resync_grace`` 30 s); the scenario's own
modes are kept, the missing ones of that set added, then hands every run directory to the Spark job
(``treefed.analysis.job.main``) and prints where the report is.  The default set is the
size sweep ``sweep-size-4x0005`` .. ``4x0250`` (one workload, 4 regions, 5 to 250 stores
each), the depth sweep ``sweep-depth-2`` .. ``4`` (240 stores, 2 to 4 levels below HQ),
``reconfigure``, ``churn`` and the headline estate ``sweep-size-4x1000``: emulated in
the tree, TTL 1, one-way, isolated and the two tree-variant modes, modelled (``treefed model --messages``, exact) in the modes whose
replay does not fit make run's 2 GiB (TTL 2 and 3 need 4+ GiB, the tuned mesh ~1.9 GiB
alone), plus a model sweep to 100,000 stores on Spark for the scale curves; the report
marks modelled rows.  ``--full`` emulates every mode of 4 x 1,000 instead (4+ GiB), and
``--no-model`` leaves the modelled rows out.  Java is checked before the first run (the
report needs it).  A scenario is a file path or the name of a file in ``scenarios/``
(the working directory's, else the checkout's).  Every scenario is validated before the
first run starts.

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

__all__ = ["main", "DEFAULT_SCENARIOS", "FULL_SCENARIOS", "COMPARED_MODES", "MODELLED",
           "find_scenario", "with_compared_modes"]

#: The controlled sweeps (one workload each; report.py's scale and depth plots use only
#: them), then the fault scenarios.
SIZE_SWEEP = tuple(f"sweep-size-4x{n:04d}" for n in (5, 25, 100, 250))
DEPTH_SWEEP = ("sweep-depth-2", "sweep-depth-3", "sweep-depth-4")
#: The headline estate, 4 x 1,000 stores, is in the default set too: emulated in the
#: modes whose replay fits make run's memory budget (2 GiB over the process tree), and
#: *modelled* in the others (``treefed model --messages``: the exact walk and the
#: brokers' dispatch rules, equal to the replay engine wherever both run -- tests/model);
#: the report marks the modelled rows.  ``--full`` emulates every mode instead.
HEADLINE = "sweep-size-4x1000"
HEADLINE_EMULATED = ("tree", "mesh-ttl1", "mesh-tuned-oneway", "nats-isolated",
                     "tree-summary", "tree-resync")
#: the modes ``treefed model`` computes (model/cli.py MODES + EXTRA_MODES); the tree
#: variants tree-summary and tree-resync are not modelled: they are emulated everywhere
MODELLED = ("tree", "mesh-ttl1", "mesh-ttl2", "mesh-ttl3", "mesh-tuned",
            "mesh-tuned-oneway", "nats-isolated")
#: The model sweep behind the report's scale curves (total stores over 4 regions, the
#: size sweep's shape and workload), on Spark.
MODEL_SWEEP = "100,1000,10000,100000"
#: its Spark driver heap: with 2g its JVM alone reached 2,176 MiB RSS (make run's peak,
#: 2,928 MiB); with 768m the sweep completes and peaks at 1,846 MiB for the whole tree
SWEEP_DRIVER_MEMORY = "768m"
DEFAULT_SCENARIOS = (*SIZE_SWEEP, *DEPTH_SWEEP, "reconfigure", "churn", HEADLINE)
FULL_SCENARIOS = DEFAULT_SCENARIOS
#: label -> (connector, options) every compared scenario runs under.
COMPARED_MODES: dict[str, tuple[str, dict]] = {
    "tree": ("tree", {}),
    "mesh-ttl1": ("mesh", {"network_ttl": 1, "duplex": True}),
    "mesh-ttl2": ("mesh", {"network_ttl": 2, "duplex": True}),
    "mesh-ttl3": ("mesh", {"network_ttl": 3, "duplex": True}),
}
#: The report's Spark driver heap.  The two-pass job (analysis/passes.py) holds more in
#: the driver's Python: with 1g make run peaked at 2,344 MiB at the report (java 1,494 +
#: the driver's Python 680); with 768m the report of the same 87 runs peaks at 1,993 MiB
#: (java 1,171 + 665), at the same speed (129.7 s vs 131.6 s).
DRIVER_MEMORY = "768m"
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


#: the default ``summary_budget`` of the compared ``tree-summary`` mode (entries per
#: child link; a store's own interest stays precise below it, a region's is summarised)
SUMMARY_BUDGET = 50
#: the ``resync_grace`` (seconds) of the compared ``tree-resync`` mode (issue 18 part 3):
#: longer than every link cut of the shipped fault scenarios, so a flap is a delta resync
RESYNC_GRACE = 30.0


def resync_mode(grace: float = RESYNC_GRACE) -> tuple[str, dict]:
    """The ``tree-resync`` mode: the tree with ``resync_grace`` on every tree link."""
    return "tree", {"resync_grace": grace}


def with_compared_modes(scenario: Scenario, *,
                        summary_budget: int = SUMMARY_BUDGET) -> Scenario:
    """``scenario`` with every mode of COMPARED_MODES it lacks appended, then the tuned
    baselines (baselines.py) with the network TTL set to the estate's depth, then
    ``tree-summary`` (``summary_budget``; 0 leaves it out) and ``tree-resync``."""
    modes = list(scenario.modes)
    have = {m.label for m in modes}
    wanted = dict(COMPARED_MODES)
    if any(label not in have for label in TUNED_MODES):
        wanted.update(tuned_modes(scenario.build_topology().depth))
    if summary_budget:
        wanted["tree-summary"] = summary_mode(summary_budget)
    wanted["tree-resync"] = resync_mode()
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
                   help="emulate sweep-size-4x1000 in every mode (4+ GiB) instead of "
                        "modelling the modes that do not fit 2 GiB")
    p.add_argument("--out", default="runs", help="directory for run directories")
    p.add_argument("--report", default=None,
                   help="report directory (default reports/compare-<time>)")
    p.add_argument("--no-report", action="store_true", help="run only, skip the Spark job")
    p.add_argument("--summary-budget", type=int, default=SUMMARY_BUDGET, metavar="N",
                   help="tree-summary's summary_budget: interest summarised at branches "
                        f"past N entries per child link (default {SUMMARY_BUDGET}; 0 "
                        "leaves tree-summary out)")
    p.add_argument("--driver-memory", default=DRIVER_MEMORY,
                   help=f"Spark driver heap for the report (default {DRIVER_MEMORY}: the "
                        "job reads the runs' Parquet parts and fits; keeps make run's whole "
                        "process tree under 2 GiB)")
    p.add_argument("--no-model", action="store_true",
                   help=f"emulate only: no modelled {HEADLINE} modes, no model sweep")
    args = p.parse_args(argv)
    names = args.scenarios or list(FULL_SCENARIOS if args.full else DEFAULT_SCENARIOS)
    if args.full and args.scenarios and HEADLINE not in names:
        names.append(HEADLINE)
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
    modelled: list[tuple[str, list[str]]] = []    # (scenario, modes) to model
    if not args.full and not args.no_model:
        scenarios, modelled = split_headline(scenarios)
    for scenario in scenarios:
        console.print(f"[bold]{scenario.name}[/]: {len(scenario.modes)} modes, replay engine",
                      highlight=False)
        results = _run_apart(scenario, args.out)
        console.print(summary_table(results, title=scenario.name))
        run_dirs += [str(r.path) for r in results]
    console.print(f"{len(run_dirs)} runs in {time.perf_counter() - started:.0f} s",
                  highlight=False)
    model_dirs = []
    if not args.no_model and not args.no_report:
        model_dirs = run_models(modelled, Path(args.out), console,
                                sweep=not args.scenarios)
        if model_dirs is None:
            return 1
    if args.no_report:
        return 0
    report = args.report or f"reports/compare-{time.strftime('%Y%m%d-%H%M%S')}"
    from treefed.analysis.job import main as report_main

    extra = [a for d in model_dirs for a in ("--model", d)]
    # it prints where the report is
    return report_main([*run_dirs, "--out", report, "--driver-memory", args.driver_memory,
                        *extra])


def split_headline(scenarios: list[Scenario]) -> tuple[list[Scenario], list[tuple]]:
    """The headline estate emulated in ``HEADLINE_EMULATED`` modes only; its other
    modes returned as (scenario name, mode labels) to model."""
    kept, modelled = [], []
    for sc in scenarios:
        if sc.name != HEADLINE:
            kept.append(sc)
            continue
        emulate = tuple(m for m in sc.modes if m.label in HEADLINE_EMULATED)
        rest = [m.label for m in sc.modes
                if m.label not in HEADLINE_EMULATED and m.label in MODELLED]
        kept.append(dataclasses.replace(sc, modes=emulate))
        if rest:
            modelled.append((sc.name, rest))
    return kept, modelled


def run_models(modelled: list[tuple], out: Path, console, *, sweep: bool) -> list[str] | None:
    """``treefed model --messages`` (exact walk) for each (scenario, modes), and with
    ``sweep`` the Spark model sweep (``MODEL_SWEEP``, 4 regions) for the scale curves,
    each in a child process (its memory, and the sweep's JVM, gone before the report's
    Spark job starts); returns the output directories (None: a model failed, it said
    why on stderr)."""
    import subprocess

    def model(argv: list[str]) -> bool:
        return subprocess.run([sys.executable, "-m", "treefed.model.cli", *argv]).returncode == 0

    dirs = []
    for name, modes in modelled:
        d = out / f"model-{name}"
        console.print(f"[bold]{name}[/]: modelling {', '.join(modes)} (exact, messages)",
                      highlight=False)
        argv = [name, "--engine", "exact", "--messages", "--no-brokers", "--out", str(d)]
        for m in modes:
            argv += ["--mode", m]
        if not model(argv):
            return None
        dirs.append(str(d))
    if sweep:
        d = out / "model-sweep"
        console.print(f"[bold]model sweep[/]: {MODEL_SWEEP} stores, 4 regions, on Spark",
                      highlight=False)
        if not model([HEADLINE, "--sweep", MODEL_SWEEP, "--regions", "4",
                      "--driver-memory", SWEEP_DRIVER_MEMORY, "--out", str(d)]):
            return None
        dirs.append(str(d))
    return dirs
