"""``treefed estate generate``, ``treefed import activemq`` and ``treefed forecast``.

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
    args = p.parse_args(list(argv))
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
