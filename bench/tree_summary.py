"""Interest summarisation at tree branches (issue 18 part 2): HQ's entries, delivery and
the extra message hops, plain tree against ``summary_budget``.

The retail scenario (HQ, R regions x S stores; each store consumes its own queue
``queue://Store.<store>.Incoming`` and subscribes to ``topic://Prices``; HQ -> stores,
stores -> HQ, store -> store and topic traffic) runs on the replay engine twice: the
plain tree and the tree with ``summary_budget = B`` and ``summary_owned =
["queue://Store.{broker}.>"]`` on every tree link.  Per run: HQ's interest entries at the
end (learned instances + covers, per region and in total), the delivery figures
(expected, delivered, duplicates, stranded), advisory frames (adds sent) and Subtree
frames, message forwards, and the *extra hops*: forwards from a parent down to a child
whose subtree never delivered that message (a message sent down a subtree that had no
consumer for it).  Prints ONE JSON line per run and a final comparison line.

    python bench/tree_summary.py --regions 4 --stores 1000 --budget 50
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treefed.scenario.engines import engine_class  # noqa: E402
from treefed.scenario.results import Recorder  # noqa: E402
from treefed.scenario.spec import TimelineEvent, load_scenario  # noqa: E402
from treefed.scenario.workload import SEND_AT  # noqa: E402
from treefed.scenario.workload import build_plan  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OWNED = ["queue://Store.{broker}.>"]
#: --orphans: HQ sends to at most this many stores' Returns queues (spread evenly)
ORPHANS_FROM_HQ = 100


class Sink:
    """Keeps only the message lines the extra-hop count needs."""

    def __init__(self) -> None:
        self.forwards: list[tuple[str, str, str]] = []   # (msg, from broker, to peer)
        self.delivered: dict[str, set[str]] = {}          # msg -> brokers delivering it

    def write(self, ts: float, broker: str, event: str, fields: dict | None = None) -> None:
        if event == "message.forwarded":
            self.forwards.append((fields["msg"], broker, fields["peer"]))
        elif event == "message.delivered":
            self.delivered.setdefault(fields["msg"], set()).add(broker)


def run(scenario, label: str, options: dict) -> dict:
    tree = scenario.mode("tree")
    mode = dataclasses.replace(tree, label=label, options={**tree.options, **options})
    sc = dataclasses.replace(scenario, modes=(mode,))
    plan = build_plan(sc)
    sink = Sink()
    rec = Recorder(plan, sink)
    engine = engine_class("replay")(plan, mode, rec)
    started, cpu = time.perf_counter(), time.process_time()
    figures = engine.run()["outcome"]
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    topo = plan.topology
    root = topo.root.id
    parents = {b.id: b.parent for t in (topo, engine.topology) for b in t.brokers}

    def below(broker: str, top: str) -> bool:   # is ``broker`` in ``top``'s subtree?
        while broker is not None:
            if broker == top:
                return True
            broker = parents.get(broker)
        return False

    hq = engine.nodes[root].site
    per_region = {b.peer: len(b.remote) + len(b.covers) for b in hq.links()}
    extra = 0
    down = 0
    for msg, src, peer in sink.forwards:
        if parents.get(peer) != src:
            continue   # up, not down
        down += 1
        if not any(below(b, peer) for b in sink.delivered.get(msg, ())):
            extra += 1
    subtree = sum(n.site.counters.get("subtree_frames", 0)
                  for n in engine.nodes.values() if n.site is not None)
    return {"bench": "tree_summary", "mode": label, "scenario": scenario.name,
            "hq_entries": sum(per_region.values()),
            "hq_entries_max_per_child": max(per_region.values()),
            **{k: figures[k] for k in ("expected", "delivered", "duplicates", "stranded",
                                       "advisory_frames", "forwarded")},
            "subtree_frames": subtree, "forwards_down": down, "extra_hops": extra,
            "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "load": round(os.getloadavg()[0], 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--regions", type=int, default=4)
    p.add_argument("--stores", type=int, default=250)
    p.add_argument("--budget", type=int, default=50)
    p.add_argument("--scenario", help="a scenario file with a tree mode instead of the "
                                      "retail estate (--regions/--stores ignored)")
    p.add_argument("--no-store-consumers", action="store_true",
                   help="stores consume nothing: every store-queue message has no consumer "
                        "(shows where such messages wait and the hops it costs)")
    p.add_argument("--orphans", action="store_true",
                   help="also send, after the workload, one message from HQ to the "
                        "queue://Store.<store>.Returns of up to 100 stores (spread evenly) "
                        "and one from each store to its own: "
                        "queues nobody consumes (where they wait, and the hops it costs)")
    args = p.parse_args(argv)
    if args.scenario:
        scenario = load_scenario(args.scenario)
        args.regions = len(scenario.build_topology().children(
            scenario.build_topology().root.id))
    elif (ROOT / "scenarios" / f"retail-{args.regions}x{args.stores}.toml").is_file():
        scenario = load_scenario(ROOT / "scenarios" / f"retail-{args.regions}x{args.stores}.toml")
    else:   # retail-4x250's workload on R x S stores
        base = load_scenario(ROOT / "scenarios" / "retail-4x250.toml")
        scenario = dataclasses.replace(
            base, name=f"retail-{args.regions}x{args.stores}",
            topology=dataclasses.replace(base.topology, regions=args.regions,
                                         stores_per_region=args.stores))
    if args.no_store_consumers:
        scenario = dataclasses.replace(
            scenario, name=scenario.name + "-noconsumers",
            workload=dataclasses.replace(scenario.workload, store_queue_consumers=False))
    if args.orphans:
        topo = scenario.build_topology()
        at = max([SEND_AT + 1.0] + [e.at for e in scenario.timeline])
        stores = [b.id for b in topo.brokers if b.role == "leaf"]
        # one timeline event per HQ message (the plan snapshots the estate per event, so
        # at most ORPHANS_FROM_HQ of them); one glob event for every store's own
        step = max(1, len(stores) // ORPHANS_FROM_HQ)
        extra = tuple(TimelineEvent(at, "send", target=topo.root.id,
                                    dst=f"queue://Store.{s}.Returns") for s in stores[::step])
        extra += (TimelineEvent(at, "send", target="store-*",
                                dst="queue://Store.{broker}.Returns"),)
        scenario = dataclasses.replace(scenario, name=scenario.name + "-orphans",
                                       timeline=scenario.timeline + extra)
    plain = run(scenario, "tree", {})
    print(json.dumps(plain), flush=True)
    summary = run(scenario, "tree-summary", {"summary_budget": args.budget,
                                             "summary_owned": OWNED})
    summary["budget"] = args.budget
    print(json.dumps(summary), flush=True)
    ok = (summary["hq_entries"] <= args.regions * args.budget
          and summary["delivered"] == plain["delivered"] == summary["expected"]
          and summary["duplicates"] == 0 and summary["stranded"] == plain["stranded"]
          and (args.no_store_consumers or args.orphans or summary["stranded"] == 0))
    print(json.dumps({
        "bench": "tree_summary", "scenario": scenario.name, "budget": args.budget,
        "hq_entries": [plain["hq_entries"], summary["hq_entries"]],
        "bound": args.regions * args.budget,
        "advisory_frames": [plain["advisory_frames"], summary["advisory_frames"]],
        "extra_hops": [plain["extra_hops"], summary["extra_hops"]],
        "forwarded": [plain["forwarded"], summary["forwarded"]],
        "stranded": [plain["stranded"], summary["stranded"]], "ok": ok}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
