"""``treefed estate generate|start|run``, ``treefed import activemq`` and ``treefed forecast``.

Each ``*_main(argv)`` is a delegated subcommand of ``treefed.cli``: exit status 0 on
success, 1 when the work could not be done (a graph that is not a tree for
``--emit-tree``), 2 for bad input (unreadable or hostile XML, invalid configs), with the
problem on stderr naming the file (and line) at fault.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

from treefed.errors import ConfigError, TreefedError

__all__ = ["estate_main", "import_main", "forecast_main"]


def _err(prog: str, exc: TreefedError) -> int:
    notes = "".join(f" ({note})" for note in getattr(exc, "__notes__", ()))
    print(f"{prog}: {exc.message}{notes}", file=sys.stderr)
    return 2


def import_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="treefed import",
                                description="import a broker estate from another system")
    sub = p.add_subparsers(dest="system", required=True, metavar="SYSTEM")
    a = sub.add_parser("activemq", help="activemq.xml files -> treefed mesh configs")
    a.add_argument("files", nargs="+", help="activemq.xml files (one or more brokers each)")
    a.add_argument("--out", required=True, help="folder for <broker>.toml, import.md/json")
    args = p.parse_args(list(argv))
    from treefed.estate.activemq import import_files, write_import

    started = time.perf_counter()
    try:
        result = import_files(args.files)
    except TreefedError as exc:
        return _err("treefed import activemq", exc)
    write_import(result, args.out)
    print(f"treefed import activemq: {len(result.brokers)} brokers, {len(result.links)} "
          f"links, {len(result.unresolved)} unresolved addresses, {len(result.unmapped)} "
          f"not mapped (see {Path(args.out) / 'import.md'}); "
          f"{time.perf_counter() - started:.2f} s", file=sys.stderr)
    return 0


def forecast_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="treefed forecast",
                                description="run an estate's configs as they are and as a "
                                            "tree; compare demand, spillage, stranding")
    p.add_argument("configs", nargs="+", help="broker config files or folders of them")
    p.add_argument("--out", required=True, help="folder for forecast.md and forecast.json")
    p.add_argument("--workload", default=None,
                   help="workload TOML ([[consumer]] / [[send]]); default: retail workload")
    p.add_argument("--root", default=None, help="root of the proposed tree (default: the "
                                                "broker every link points to, or the centre)")
    p.add_argument("--emit-tree", default=None, metavar="DIR",
                   help="write the proposed tree's broker configs to DIR")
    args = p.parse_args(list(argv))
    from treefed.estate.forecast import (
        emit_tree, forecast, load_estate, load_workload, write_forecast,
    )
    from treefed.estate.topology import NotATree, infer_tree

    started = time.perf_counter()
    try:
        est = load_estate(args.configs)
        workload = (load_workload(args.workload, est.configs) if args.workload else None)
        result = forecast(est, workload, root=args.root)
    except (ConfigError, NotATree) as exc:
        if isinstance(exc, NotATree):
            print(f"treefed forecast: {exc}", file=sys.stderr)
            return 2
        return _err("treefed forecast", exc)
    write_forecast(result, args.out)
    cur, tree = result["current"], result["proposed_tree"]
    line = (f"treefed forecast: {result['estate']['brokers']} brokers; current: "
            f"{cur['totals']['demand']} demand, {cur['totals']['spilled']} spilled, "
            f"{cur['messages']['stranded']} stranded")
    if tree is not None:
        line += (f"; tree: {tree['totals']['demand']} demand, {tree['totals']['spilled']} "
                 f"spilled, {tree['messages']['stranded']} stranded")
    print(f"{line}; {time.perf_counter() - started:.2f} s -> {Path(args.out) / 'forecast.md'}",
          file=sys.stderr)
    if args.emit_tree:
        try:
            t = infer_tree(est.configs, est.links, root=args.root)
        except NotATree as exc:
            print("treefed forecast: no tree to emit:\n" + "\n".join(f"  - {r}"
                                                                     for r in exc.reasons),
                  file=sys.stderr)
            return 1
        files, notes = emit_tree(est, t, args.emit_tree)
        for note in notes:
            print(f"treefed forecast: note: {note}", file=sys.stderr)
        print(f"treefed forecast: {len(files)} tree configs in {args.emit_tree} "
              f"(root {t.root})", file=sys.stderr)
    return 0


def estate_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="treefed estate", description="estate descriptions")
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    g = sub.add_parser("generate", help="ESTATE.toml -> one broker config per site")
    g.add_argument("estate", help="the estate description (TOML)")
    g.add_argument("--out", required=True, help="output folder")
    g.add_argument("--rotate", action="store_true",
                   help="replace existing keys, certificates and generated passwords")
    s = sub.add_parser("start", help="run a generated estate's brokers on this machine")
    s.add_argument("folder", help="folder of broker configs (estate generate --out)")
    s.add_argument("sites", nargs="*", help="only these sites (default: all)")
    s.add_argument("--timeout", type=float, default=60.0,
                   help="seconds to wait for every link to come up")
    r = sub.add_parser("run", help="run a scenario's workload and timeline on a generated "
                                   "estate (procs engine: its own configs, one process "
                                   "per site)")
    r.add_argument("folder", help="folder of broker configs (estate generate --out)")
    r.add_argument("scenario", help="scenario TOML (its workload, seed and timeline; "
                                    "the topology and mode are the estate's)")
    r.add_argument("--engine", default="procs", choices=("procs", "memory", "tcp", "replay"),
                   help="procs: the estate's configs as they are (TLS, users); the others "
                        "run the same plan from configs they write (default: procs)")
    r.add_argument("--out", default="runs", help="folder for the run directory")
    r.add_argument("--link-timeout", type=float, default=30.0,
                   help="seconds for every link to come up before the plan starts")
    args = p.parse_args(list(argv))
    if args.action == "start":
        return _start(args)
    if args.action == "run":
        return _run(args)
    from treefed.estate.generate import generate, load_description

    started = time.perf_counter()
    try:
        desc = load_description(args.estate)
        report = generate(desc, args.out, rotate=args.rotate)
    except TreefedError as exc:
        return _err("treefed estate generate", exc)
    print(f"treefed estate generate: {report['sites']} sites, {report['files']} files "
          f"({report['new_keys']} new keys) in {args.out}; "
          f"{time.perf_counter() - started:.2f} s", file=sys.stderr)
    return 0


def _run(args: argparse.Namespace) -> int:
    """``treefed estate run DIR SCENARIO.toml``: one run directory, a summary line."""
    from treefed.estate.scenario import estate_scenario
    from treefed.scenario.runner import run_scenario
    from treefed.scenario.spec import load_scenario

    try:
        scenario = estate_scenario(load_scenario(args.scenario), args.folder)
        options = ({"estate": args.folder, "link_timeout": args.link_timeout}
                   if args.engine == "procs" else {})
        (result,) = run_scenario(scenario, engine=args.engine, out=args.out, **options)
    except TreefedError as exc:
        return _err("treefed estate run", exc)
    except RuntimeError as exc:   # the estate did not link, a broker exited
        print(f"treefed estate run: {exc}", file=sys.stderr)
        return 1
    s = result.summary
    print(f"treefed estate run: {s['brokers']} brokers ({s['mode']}, {args.engine}): "
          f"{s['delivered']} of {s['expected']} delivered, {s['stranded']} stranded, "
          f"{s['duplicates']} duplicates -> {result.path}", file=sys.stderr)
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt   # SIGTERM stops the estate as Ctrl-C does


def _start(args: argparse.Namespace) -> int:
    """Start, wait for every link, then run until Ctrl-C / SIGTERM; stop them all."""
    import signal

    from treefed.estate.start import start_estate

    try:
        running = start_estate(args.folder, args.sites or None)
    except TreefedError as exc:
        return _err("treefed estate start", exc)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        missing = running.wait_linked(args.timeout)
        n = len(running.procs)
        if missing:
            print(f"treefed estate start: {n} brokers running, links still down: "
                  + ", ".join(f"{a}->{b}" for a, b in missing), file=sys.stderr)
        else:
            print(f"treefed estate start: {n} brokers running, every link up "
                  f"(logs in {Path(args.folder) / 'logs'}); Ctrl-C stops them",
                  file=sys.stderr)
        while all(p.poll() is None for p in running.procs.values()):
            time.sleep(0.5)
        print("treefed estate start: a broker exited; stopping the others", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except RuntimeError as exc:
        print(f"treefed estate start: {exc}", file=sys.stderr)
        return 1
    finally:
        running.stop()
