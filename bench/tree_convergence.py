"""Tree convergence benchmark (issue 4): time until every store's interest is in place
under the tree connector, and what it costs.

Estate: HQ, R regions, S stores per region, tree connectors; every store registers one
queue consumer on its own queue and nothing else.  Run on the memory engine (real
BrokerNodes over in-memory streams, one process), with the replay engine on the same
estate as the same-run baseline -- see mesh_convergence.py, whose measuring code this
reuses.  A leaf consumer's advisory climbs one frame per level, so convergence means
demand at exactly the store's region and HQ: ``expected_demand`` = 2 x R x S, and
``advisory_frames`` = 2 x R x S.  Prints ONE JSON line:

    {"bench": "tree_convergence", "regions": R, "stores": S, "demand_total": ...,
     "expected_demand": ..., "converged": true, "advisory_frames": ..., "seconds": ...,
     "peak_rss_mb": ..., "replay_seconds": ..., "vs_replay": ...}
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mesh_convergence import measure, report  # noqa: E402


def tree_doc(regions: int, stores: int) -> dict:
    return {"name": f"tree-converge-{regions}x{stores}",
            "topology": {"regions": regions, "stores_per_region": stores},
            "mode": [{"connector": "tree"}],
            "workload": {"store_queue_consumers": True}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--regions", type=int, default=4)
    p.add_argument("--stores", type=int, default=1000, help="stores per region")
    p.add_argument("--engine", default="memory")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    doc = tree_doc(args.regions, args.stores)
    if args.child:
        print(json.dumps(measure(doc, args.engine)))
        return 0
    report(__file__, ["--regions", str(args.regions), "--stores", str(args.stores)],
           args.engine, 2 * args.regions * args.stores,
           {"bench": "tree_convergence", "regions": args.regions, "stores": args.stores})
    return 0


if __name__ == "__main__":
    sys.exit(main())
