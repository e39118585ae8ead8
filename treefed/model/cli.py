"""``treefed model``: spillage of an estate computed, not emulated.

Theory of operation
-------------------
``treefed model SCENARIO [--mode LABEL]... [--regions N] [--stores-per-region N]
--out DIR`` takes a scenario's topology and workload (optionally resized: the same
estate shape at 10 x 10,000 stores), folds the estate into cells and propagates every
consumer group's interest on Spark (``model/spark.py``) for each mode: tree and mesh at
TTL 1, 2 and 3 by default, as ``treefed compare`` runs them.  ``--engine exact`` runs the
plain Python walk instead (the reference; fine up to a few thousand brokers), and
``--check`` runs both and fails (exit 1) on any difference.

Written to DIR, every row marked ``source = model``:

* ``model.csv`` -- one row per (scenario, mode): brokers, consumers, advisory frames
  sent / received, refusals by reason, demand created (= held: first convergence),
  the largest demand at one broker, and receipts split as the report splits them:
  **sibling spill** (a store receiving interest of another store's consumer) and
  **downward interest** (a broker receiving interest whose origin is one of its
  ancestors: AMQ-2875 rule 4);
* ``tiers.csv`` -- the same per (mode, tier: hq / layer / region / store);
* ``brokers-<mode>.csv`` -- per broker (omitted with ``--no-brokers``);
* ``model.json`` -- parameters, engine, wall time per mode and per step (``plan_s``;
  ``<mode>_steps``: estate, fold, spark / exact, cells, output).

Figures stay per cell up to the output (totals and tiers are member counts times the
cell's figures), so only ``brokers-<mode>.csv`` is as long as the estate.  With
``--sweep 10,100,...`` the same runs for each total number of stores (``model/sweep.py``:
``sweep.csv``, ``runs.csv`` in the report's schema, ``scale.png``, ``index.html``).

Exit status: 0, 1 (``--check`` found a difference, or the estate needs a rule the model
does not reproduce), 2 (usage: unknown scenario or mode, bad size).  As a Spark
application it runs under ``spark-submit treefed/model/cli.py ...`` unchanged.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Sequence

if not __package__:
    # run as a script (spark-submit treefed/model/cli.py): the checkout this file is in,
    # not whichever treefed the interpreter has installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from treefed.errors import ConfigError  # noqa: E402

__all__ = ["main", "model_rows", "MODES"]

MODES = ("tree", "mesh-ttl1", "mesh-ttl2", "mesh-ttl3")
#: accepted by --mode besides MODES (not run by default): the baselines the report
#: compares too (scenario/baselines.py; equal to emulation: tests/model)
EXTRA_MODES = ("mesh-tuned", "mesh-tuned-oneway", "nats-isolated")
_FIGURES = ("adds_sent", "adds_received", "demand", "interest")


def _scenario(name: str, regions: int | None, stores: int | None):
    from treefed.scenario.compare import find_scenario, with_compared_modes
    from treefed.scenario.spec import load_scenario

    sc = with_compared_modes(load_scenario(find_scenario(name)))
    topo = sc.topology
    if regions is not None or stores is not None:
        if (regions is not None and regions < 1) or (stores is not None and stores < 1):
            raise ConfigError("size", "--regions and --stores-per-region must be >= 1")
        topo = dataclasses.replace(topo, regions=regions or topo.regions,
                                   stores_per_region=stores or topo.stores_per_region)
        # a resized estate keeps the workload, not the timeline: the model computes
        # the first convergence
        sc = dataclasses.replace(sc, topology=topo, timeline=(),
                                 name=f"{sc.name}@{topo.regions}x{topo.stores_per_region}")
    return sc


def _tiers(topology) -> dict[str, str]:
    return {b.id: b.kind for b in topology.brokers}


def split_receipts(folded, result, topology) -> dict[int, dict[str, int]]:
    """Receipts per receiving cell split into sibling spill and downward interest, as
    figures per member of the cell (every member receives the same)."""
    kind = {b.id: b.kind for b in topology.brokers}
    parent = {b.id: b.parent for b in topology.brokers}

    def ancestors(b: str) -> set:
        out, cur = set(), parent.get(b)
        while cur is not None:
            out.add(cur)
            cur = parent.get(cur)
        return out

    out: dict[int, dict[str, int]] = defaultdict(lambda: {"sibling_spill": 0,
                                                          "downward_interest": 0})
    anc_cache: dict[str, set] = {}
    for cid, gid, received in result["dst"]:
        cell = folded.cells[cid]
        g = folded.groups[gid]
        origin_rep = folded.cells[g.origin].members[0]
        rep = cell.members[0]
        if rep not in anc_cache:
            anc_cache[rep] = ancestors(rep)
        if kind.get(rep) == "store" and kind.get(origin_rep) == "store":
            key = "sibling_spill"
        elif origin_rep in anc_cache[rep]:
            key = "downward_interest"
        else:
            continue
        out[cid][key] += received // len(cell.members)
    return out


def split_by_origin(origins: dict, topology, *, into: dict | None = None) -> dict:
    """Add receipts counted per (broker, destination, origin broker) -- ``exact.propagate``'s
    ``origins`` -- split per receiving broker into sibling spill (a store hearing of another
    store's consumer) and downward interest (hearing of an ancestor's consumer), the
    definitions ``split_receipts`` applies per cell.  Per origin, so a destination with
    consumers at many brokers (the broadcast topic every store subscribes to) counts every
    one of them.  ``into``: a dict to add to (batch by batch); returned."""
    kind = {b.id: b.kind for b in topology.brokers}
    parent = {b.id: b.parent for b in topology.brokers}
    out = {} if into is None else into
    above: dict[str, set] = {}
    for (b, _dst, origin), n in origins.items():
        if b not in above:
            chain, cur = set(), parent.get(b)
            while cur is not None:
                chain.add(cur)
                cur = parent.get(cur)
            above[b] = chain
        if kind.get(b) == "store" and kind.get(origin) == "store":
            key = "sibling_spill"
        elif origin in above[b]:
            key = "downward_interest"
        else:
            continue
        row = out.setdefault(b, {"sibling_spill": 0, "downward_interest": 0})
        row[key] += n
    return out


def cell_figures(folded, result) -> list[tuple[tuple[str, ...], dict[str, int]]]:
    """The Spark result as (members, figures of each member) per cell: the per-broker
    table without a row per broker (``spark.per_broker`` spreads the same figures)."""
    from treefed.model.exact import NotModelled

    out = []
    for cell in folded.cells:
        n = len(cell.members)
        row = {"adds_sent": 0, "adds_received": 0, "demand": 0, "interest": 0}
        for name, value in result["cells"].get(cell.id, {}).items():
            if not value:
                continue
            if value % n:
                raise NotModelled(f"cell {cell.id}: {name} = {value} does not split over "
                                  f"{n} members")
            row[name] = row.get(name, 0) + value // n
        out.append((cell.members, row))
    return out


def model_rows(spark, scenario, modes: Sequence[str], *, engine: str = "spark",
               cells: bool = True, check: bool = False, brokers_dir: Path | None = None,
               messages: bool = False, messages_dir: Path | None = None
               ) -> tuple[list[dict], list[dict], dict]:
    """Run the model for ``modes`` of ``scenario``: (run rows, tier rows, timings).

    Figures stay per cell (members, each member's figures) all the way to the output:
    totals and tiers are member counts times the cell's figures, and only
    ``brokers-<mode>.csv`` writes a line per broker."""
    from treefed.model.cells import fold
    from treefed.model.exact import estate_from_topology, groups_from_consumers, propagate
    from treefed.scenario.workload import build_plan

    started = time.perf_counter()
    plan = build_plan(dataclasses.replace(scenario, timeline=()))
    groups = groups_from_consumers(plan.consumers)
    timings: dict = {"plan_s": round(time.perf_counter() - started, 3)}
    tiers = _tiers(plan.topology)
    runs, tier_rows = [], []
    by_label = {m.label: m for m in scenario.modes}
    for label in modes:
        if label not in by_label:
            raise ConfigError("mode", f"unknown mode {label!r} (have {sorted(by_label)})")
    for label in modes:
        mode = by_label[label]
        steps: dict[str, float] = {}
        t0 = tick = time.perf_counter()

        def lap(name: str) -> None:
            nonlocal tick
            now = time.perf_counter()
            steps[name] = round(now - tick, 3)
            tick = now

        estate = estate_from_topology(plan.topology, mode)
        lap("estate_s")
        folded = fold(estate, groups, cells=cells)
        lap("fold_s")
        table = None
        held = [] if messages and engine == "spark" and not check else None
        if engine == "spark" or check:
            from treefed.model.spark import per_broker, propagate_spark
            result = propagate_spark(spark, folded, held=held)
            lap("spark_s")
            split = split_receipts(folded, result, plan.topology)
            table = [(ms, {**row, **split.get(cid, _NO_SPLIT)})
                     for cid, (ms, row) in enumerate(cell_figures(folded, result))]
            lap("cells_s")
        message_fig = None
        if engine == "exact" and messages and not check:
            # one walk for both: the message batches add up to the whole convergence
            per_b: dict = {}
            message_fig = message_figures(plan, mode, messages_dir, brokers=per_b)
            lap("messages_s")
            table = [((b,), per_b[b]) for b in estate.brokers]
        elif engine == "exact" or check:
            origins: dict = {}
            exact = propagate(estate, groups, origins=origins)
            lap("exact_s")
            if check:
                a = exact.per_broker(estate.brokers)
                b = per_broker(folded, result).per_broker(estate.brokers)
                diff = [x for x in estate.brokers if a[x] != b[x]]
                if diff:
                    raise AssertionError(f"{label}: model engines differ at {len(diff)} "
                                         f"brokers, e.g. {diff[0]}: {a[diff[0]]} != "
                                         f"{b[diff[0]]}")
                lap("check_s")
            if engine == "exact":
                split = split_by_origin(origins, plan.topology)
                table = [((b,), {**row, **split.get(b, _NO_SPLIT)})
                         for b, row in exact.per_broker(estate.brokers).items()]
        keys = sorted({k for _ms, r in table for k in r})
        row = {"source": "model", "scenario": scenario.name, "mode": label,
               "engine": engine, "brokers": len(estate.brokers),
               "stores": sum(1 for b in estate.brokers if tiers[b] == "store"),
               "consumers": len(plan.consumers), "cells": len(folded.cells),
               "links": len(estate.links), "regions": scenario.topology.regions,
               "stores_per_region": scenario.topology.stores_per_region}
        for k in keys:
            row[k] = sum(len(ms) * r.get(k, 0) for ms, r in table)
        row["max_demand"] = max((r["demand"] for _ms, r in table), default=0)
        if messages and held is not None:
            # --engine spark: messages routed on the cells too (model/spark_messages.py)
            from treefed.model.spark_messages import message_figures_spark
            message_fig = message_figures_spark(spark, plan, mode, folded, held, estate,
                                                messages_dir)
            lap("messages_s")
        if messages:
            if message_fig is None:
                message_fig = message_figures(plan, mode, messages_dir)
                lap("messages_s")
            row.update(message_fig)
        by_tier: dict[str, dict] = {}
        for ms, r in table:
            per_tier: dict[str, int] = defaultdict(int)
            for b in ms:
                per_tier[tiers[b]] += 1
            for tier, n in per_tier.items():
                t = by_tier.setdefault(tier, {"source": "model", "scenario": scenario.name,
                                              "mode": label, "tier": tier, "brokers": 0})
                t["brokers"] += n
                for k in keys:
                    t[k] = t.get(k, 0) + n * r.get(k, 0)
        tier_rows += by_tier.values()
        if brokers_dir is not None:
            _write_brokers(brokers_dir / f"brokers-{label}.csv", keys, table, tiers)
        lap("output_s")
        wall = time.perf_counter() - t0
        row["wall_s"] = round(wall, 3)
        runs.append(row)
        timings[label] = round(wall, 3)
        timings[f"{label}_steps"] = steps
    return runs, tier_rows, timings


_NO_SPLIT = {"sibling_spill": 0, "downward_interest": 0}

MESSAGE_COLUMNS = ("msg", "kind", "sender", "dst", "expected", "delivered", "delivered_at",
                   "stranded_at", "dropped_at", "path")


def message_figures(plan, mode, out_dir: Path | None = None, *,
                    brokers: dict | None = None) -> dict:
    """The workload's sends under ``mode`` (``model/messages.py``, exact walk): the
    run's accounting figures, and spill as the report defines it -- add receipts at a
    broker that never sends to the destination (produced or forwarded a message of it),
    split into sibling spill (at a store, about another store's consumer) and downward
    spill (at a store, about a region's or HQ's consumer) -- and wasted demand (held
    where the destination is never sent to); ``messages-<mode>.csv`` per sender ->
    destination in ``out_dir`` when given.  Batch by batch (``route_batches``).
    ``brokers``: a dict that receives every broker's figures of the whole first
    convergence (``exact.per_broker``'s, plus the model's sibling spill and downward
    interest as ``split_receipts`` counts them), so the exact engine need not walk twice."""
    from treefed.model.exact import Counts
    from treefed.model.messages import route_batches, senders, summarise

    whole = Counts() if brokers is not None else None
    kind = {b.id: b.kind for b in plan.topology.brokers}
    split: dict = {}

    stores = {b.id for b in plan.topology.brokers
              if b.role == "leaf" or b.kind == "store"}
    units = {m.id: m.units for m in plan.messages.values()}
    outcomes = []
    spilled = sibling = downward = wasted = 0
    for part, counts, origins in route_batches(plan, mode, everything=True):
        outcomes += part
        send = senders(part)
        if whole is not None:
            for name in ("adds_sent", "adds_received", "dropped", "demand", "interest"):
                mine = getattr(whole, name)
                for k, v in getattr(counts, name).items():
                    mine[k] += v
            split_by_origin(origins, plan.topology, into=split)
        for (b, d, origin), n in origins.items():
            if b in send.get(d, ()):
                continue
            spilled += n
            if b in stores:
                if origin in stores:
                    sibling += n
                else:
                    downward += n
        wasted += sum(n for (b, d), n in counts.demand_by_dst.items()
                      if b not in send.get(d, ()))
    if whole is not None:
        for b, row in whole.per_broker(kind).items():
            brokers[b] = {**row, **split.get(b, _NO_SPLIT)}
    fig = summarise(outcomes, units)
    fig.update(spilled=spilled, spilled_sibling=sibling, spilled_downward=downward,
               wasted_demand=wasted, messages=len(outcomes))
    if out_dir is not None:
        kinds = {m.id: m.kind for m in plan.messages.values()}
        rows = [{"msg": o.send.id, "kind": kinds[o.send.id], "sender": o.send.broker,
                 "dst": o.send.dst, "expected": units[o.send.id],
                 "delivered": min(o.delivered, units[o.send.id]),
                 "delivered_at": o.delivered_at or "", "stranded_at": o.stranded_at or "",
                 "dropped_at": " ".join(o.dropped_at), "path": " ".join(o.path)}
                for o in outcomes]
        _write_csv(out_dir / f"messages-{mode.label}.csv", list(MESSAGE_COLUMNS), rows)
    return fig


def _write_brokers(path: Path, keys: Sequence[str], table, tiers: dict) -> None:
    """One line per broker, written from the per-cell figures."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["broker", "tier", *keys])
        for ms, r in table:
            figures = [r.get(k, 0) for k in keys]
            w.writerows([b, tiers[b], *figures] for b in ms)


def _write_csv(path: Path, columns: Sequence[str], rows: list[dict]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, 0) for c in columns})


def _spark(master: str | None, driver_memory: str):
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    builder = SparkSession.builder.appName("treefed-model") \
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    master = master or (None if under_submit else "local[2]")
    if master is not None:
        builder = builder.master(master)
    if master is not None and master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.memory", driver_memory) \
            .config("spark.driver.bindAddress", "127.0.0.1") \
            .config("spark.driver.host", "127.0.0.1") \
            .config("spark.sql.shuffle.partitions", "2") \
            .config("spark.default.parallelism", "2")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark, True


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="treefed model",
                                description="compute an estate's advisory and demand "
                                            "figures on Spark, without emulating it")
    p.add_argument("scenario", help="scenario name or file (its topology and workload)")
    p.add_argument("--mode", action="append", choices=(*MODES, *EXTRA_MODES), dest="modes",
                   help="mode to model (repeatable; default: the first four)")
    p.add_argument("--regions", type=int, help="resize: regions under HQ")
    p.add_argument("--stores-per-region", type=int, help="resize: stores per region")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--engine", choices=("spark", "exact"), default="spark",
                   help="spark (default) or the plain Python walk")
    p.add_argument("--flat", action="store_true",
                   help="no cells: one row per broker and route (for checking)")
    p.add_argument("--check", action="store_true",
                   help="run both engines and fail on any difference")
    p.add_argument("--no-brokers", action="store_true", help="skip brokers-<mode>.csv")
    p.add_argument("--messages", action="store_true",
                   help="also route the workload's messages over the modelled demand: "
                        "with --engine exact per broker (delivered / stranded and where, "
                        "per sender -> destination in messages-<mode>.csv, and spill as "
                        "the report defines it); with --engine spark on the cells, per "
                        "class of alike sends (message-classes-<mode>.csv)")
    p.add_argument("--sweep", metavar="TOTALS",
                   help="comma-separated total store counts (e.g. 10,100,1000,10000,"
                        "100000) spread over --regions (default 10): writes sweep.csv, "
                        "runs.csv, scale.png and index.html, marked modelled")
    p.add_argument("--master", default=None, help="Spark master (default local[2])")
    p.add_argument("--driver-memory", default="3g")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from treefed.model.exact import NotModelled

    try:
        if args.sweep is not None:
            from treefed.model.sweep import parse_sizes

            if args.stores_per_region is not None:
                raise ConfigError("sweep", "--sweep sets the stores per region itself")
            regions = args.regions or 10
            try:
                sizes = parse_sizes(args.sweep, regions)
            except ValueError as exc:
                raise ConfigError("sweep", str(exc)) from None
            scenarios = [_scenario(args.scenario, regions, n) for n in sizes]
        else:
            scenarios = [_scenario(args.scenario, args.regions, args.stores_per_region)]
    except ConfigError as exc:
        print(f"treefed model: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    spark, owned = (None, False)
    if args.engine == "spark" or args.check:
        spark, owned = _spark(args.master, args.driver_memory)
    started = time.perf_counter()
    try:
        runs, tiers, timings = [], [], {}
        for scenario in scenarios:
            r, t, timings[scenario.name] = model_rows(
                spark, scenario, args.modes or MODES, engine=args.engine,
                cells=not args.flat, check=args.check,
                brokers_dir=None if args.no_brokers or args.sweep else out,
                messages=args.messages,
                messages_dir=out if args.messages and not args.sweep else None)
            runs += r
            tiers += t
        if len(scenarios) == 1:
            timings = timings[scenario.name]
    except (NotModelled, AssertionError) as exc:
        print(f"treefed model: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:
        print(f"treefed model: {exc}", file=sys.stderr)
        return 2
    finally:
        if owned:
            spark.stop()
    columns = list(dict.fromkeys(k for r in runs for k in r))
    _write_csv(out / "model.csv", columns, runs)
    _write_csv(out / "tiers.csv", list(dict.fromkeys(k for r in tiers for k in r)), tiers)
    meta = {"scenario": scenario.name, "regions": scenario.topology.regions,
            "stores_per_region": scenario.topology.stores_per_region,
            "engine": args.engine, "cells": not args.flat,
            "wall_s": round(time.perf_counter() - started, 3), "timings": timings}
    if args.sweep is not None:
        from treefed.model.sweep import write_sweep

        meta["sweep_stores"] = [r["stores"] for r in runs[::len(args.modes or MODES)]]
        write_sweep(out, runs)
    else:   # the report reads runs.csv (treefed report --model DIR)
        from treefed.model.sweep import RUN_COLUMNS, _csv, run_rows

        _csv(out / "runs.csv", [*RUN_COLUMNS, "source"], run_rows(runs))   # "" = not modelled
    (out / "model.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    for r in runs:
        print(f"{r['mode']:10} stores {r['stores']:>7}  brokers {r['brokers']:>7}  "
              f"frames {r['adds_sent']:>14,}  demand {r['demand']:>14,}  sibling spill {r['sibling_spill']:>14,}  "
              f"{r['wall_s']:.1f} s")
    print(f"model written to {out}")
    return 0


if __name__ == "__main__":  # spark-submit treefed/model/cli.py ...
    sys.exit(main())
