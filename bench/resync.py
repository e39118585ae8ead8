"""Delta resync figures (issue 18 part 3): advisory frames after a region<->HQ flap and
after a region restart, with and without ``resync_grace``.

Estate (pure federation code, ``testing.Estate``): HQ, R regions, S stores per region,
tree connectors; every store has a queue consumer on its own queue and a topic
subscriber on ``topic://Prices`` (the retail workload's consumers), HQ a queue consumer.
Measured per grace (0 = today's behaviour, and ``--grace``):

* ``flap``: cut R1 <-> HQ and link it again, no interest changed: advisory frames sent
  on the R1 <-> HQ link after the cut;
* ``flap_with_change``: the same with one store consumer leaving during the outage (the
  removal must arrive; nothing stale: HQ's demand for it is gone);
* ``restart``: R1 loses its memory (a fresh Site) and its links come back: frames on all
  of R1's links.

Prints ONE JSON line: {"bench": "resync", "regions", "stores", "grace", per case
{"plain": frames, "delta": frames, "ratio"}, "stale": ...}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treefed.core.broker import Broker  # noqa: E402
from treefed.federation.settings import LinkSettings, TreeSettings  # noqa: E402
from treefed.federation.site import Site  # noqa: E402
from treefed.federation.testing import Estate  # noqa: E402


def settings(grace: float, node_type: str) -> LinkSettings:
    return LinkSettings(kind="tree", name="tree", node_type=node_type, resync_grace=grace)


def build(regions: int, stores: int, grace: float) -> Estate:
    e = Estate(log_advisories=False)
    e.add("HQ")
    for r in range(1, regions + 1):
        e.add(f"R{r}", tree=TreeSettings("branch"))
        e.link(f"R{r}", "HQ", settings(grace, "branch"))
        for s in range(1, stores + 1):
            name = f"R{r}.{s}"
            e.add(name, tree=TreeSettings("leaf"))
            e.link(name, f"R{r}", settings(grace, "leaf"))
            e.subscribe(name, "q", f"queue://Store.{name}.Incoming")
            e.subscribe(name, "t", "topic://Prices")
    e.subscribe("HQ", "h", "queue://HQ.Incoming")
    e.run_until_quiet()
    return e


def frames_on(e: Estate, since: int, brokers: set[str]) -> int:
    return sum(1 for s, d, _ in e.advisories[since:] if s in brokers or d in brokers)


def flap(e: Estate, grace: float, change: bool) -> tuple[int, bool]:
    e.unlink("R1", "HQ")
    e.run_until_quiet()
    since = len(e.advisories)
    if change:
        e.unsubscribe("R1.1", "q")
        e.run_until_quiet()
    e.link("R1", "HQ", settings(grace, "branch"))
    e.run_until_quiet()
    n = sum(1 for s, d, _ in e.advisories[since:] if {s, d} == {"R1", "HQ"})
    stale = change and any(c["dst"] == "queue://Store.R1.1.Incoming"
                           for c in e.sites["HQ"].broker.statistics().get("consumers", []))
    return n, stale


def restart(e: Estate, grace: float, stores: int) -> int:
    """R1 restarts: its links drop, it comes back empty, children and parent relink."""
    for peer in ["HQ", *(f"R1.{s}" for s in range(1, stores + 1))]:
        e.unlink("R1", peer)
    e.run_until_quiet()
    e.sites["R1"] = Site("R1", broker=Broker("R1"), tree=TreeSettings("branch"),
                         log_advisories=False, sharing=e.sharing)
    since = len(e.advisories)
    e.link("R1", "HQ", settings(grace, "branch"))
    for s in range(1, stores + 1):
        e.link(f"R1.{s}", "R1", settings(grace, "leaf"))
    e.run_until_quiet()
    return frames_on(e, since, {"R1"})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--regions", type=int, default=4)
    p.add_argument("--stores", type=int, default=1000)
    p.add_argument("--grace", type=float, default=30.0)
    args = p.parse_args(argv)
    out: dict = {"bench": "resync", "regions": args.regions, "stores": args.stores,
                 "grace": args.grace}
    t0 = time.perf_counter()
    stale = False
    for case in ("flap", "flap_with_change", "restart"):
        row = {}
        for label, grace in (("plain", 0.0), ("delta", args.grace)):
            e = build(args.regions, args.stores, grace)
            if case == "restart":
                row[label] = restart(e, grace, args.stores)
            else:
                row[label], st = flap(e, grace, case == "flap_with_change")
                stale = stale or st
        row["ratio"] = round(row["plain"] / row["delta"], 1) if row["delta"] else None
        out[case] = row
    out["stale"] = stale
    out["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
