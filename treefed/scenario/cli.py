"""``treefed scenario run FILE [--engine E] [--out DIR] [--mode LABEL]...``

Theory of operation
-------------------
A thin shell over ``runner.run_scenario``: it validates everything first (the scenario
file, mode labels, the engine name) and exits 2 naming the key and the reason before any
run starts; then runs each mode with a rich progress display (only on a terminal, so
logs and CI output stay clean) and prints the summaries as one table.  Exit status: 0
when every run completed, 2 for bad input, 1 when an engine failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from treefed.errors import ConfigError
from treefed.scenario.engines import ENGINES

__all__ = ["main", "summary_table", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="treefed scenario",
                                description="run store-scale scenarios in tree and mesh modes")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a scenario file, one run directory per mode")
    run.add_argument("file", help="scenario TOML (see scenarios/)")
    run.add_argument("--engine", choices=list(ENGINES), default="replay",
                     help="replay (virtual clock, fastest), memory, tcp or procs")
    run.add_argument("--out", default="runs", help="directory for run directories")
    run.add_argument("--mode", action="append", dest="modes", metavar="LABEL",
                     help="run only this mode (repeatable); default: every mode")
    return p


def summary_table(results: Sequence[Any], title: str | None = None) -> Any:
    """A rich Table of RunResult summaries."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    cols = [("mode", "mode"), ("brokers", "brokers"), ("adv\nsent", "advisory_frames"),
            ("adv\nrecv", "advisory_receipts"), ("demand", "demand_created"),
            ("expect", "expected"), ("deliv", "delivered"), ("dup", "duplicates"),
            ("strand", "stranded"), ("wall\ns", "wall_s"), ("RSS\nMiB", "peak_rss_mb")]
    for head, _ in cols:
        table.add_column(head, justify="left" if head == "mode" else "right",
                         no_wrap=head == "mode")
    for r in results:
        s = r.summary
        cells = []
        for _, key in cols:
            v = s[key]
            cells.append(f"{v:,}" if isinstance(v, int) else
                         f"{v:,.0f}" if key == "peak_rss_mb" else
                         f"{v:,.2f}" if isinstance(v, float) else str(v))
        if s["delivered"] < s["expected"]:
            cells[6] = f"[yellow]{cells[6]}[/]"
        if s["stranded"]:
            cells[8] = f"[red]{cells[8]}[/]"
        table.add_row(*cells)
    return table


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rich.console import Console

    from treefed.scenario.runner import select_modes
    from treefed.scenario.spec import load_scenario

    err = Console(stderr=True)
    try:
        scenario = load_scenario(args.file)
        modes = select_modes(scenario, args.modes)
    except ConfigError as exc:
        key = f"{exc.key}: " if exc.key else ""
        print(f"treefed scenario: {args.file}: {key}{exc.problem}", file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        results = _run(scenario, args.engine, out, [m.label for m in modes], err)
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except Exception as exc:  # an engine failed: say so, keep the traceback for bugs
        err.print_exception()
        err.print(f"[bold red]treefed scenario:[/] {args.engine} run failed: {exc}")
        return 1
    console = Console()
    if not console.is_terminal:
        console = Console(width=132)   # a log file is not 80 columns wide
    console.print(summary_table(results, title=f"{scenario.name} ({args.engine})"))
    for r in results:
        console.print(f"{r.summary['mode']}: {r.path}", highlight=False, soft_wrap=True)
    return 0


def _run(scenario: Any, engine: str, out: Path, labels: list[str], err: Any) -> list:
    from treefed.scenario.runner import run_scenario

    if not err.is_terminal:
        return run_scenario(scenario, engine=engine, out=out, modes=labels)
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    results = []
    with Progress(SpinnerColumn(), TextColumn("{task.description}"),
                  TextColumn("{task.fields[detail]}"), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        for label in labels:
            task = bar.add_task(f"{scenario.name} {label} ({engine})", detail="starting")

            def progress(mode: str, info: dict, task: int = task) -> None:
                detail = f"t={info.get('t', 0):.3f}s  frames={info.get('frames', 0):,}"
                bar.update(task, detail=detail)

            results += run_scenario(scenario, engine=engine, out=out, modes=[label],
                                    progress=progress)
            bar.update(task, detail="done")
    return results


if __name__ == "__main__":
    sys.exit(main())
