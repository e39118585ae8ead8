"""Downward advertisement per kind (issue 18 part 4): the tree's spill with and without
queue interest sent down, and proof that delivery does not change.

For each scenario file given (default: every one in scenarios/ but retail-4x1000), its
tree mode runs twice on the replay engine: ``plain`` (``advertise_down = ["queue",
"topic"]``, the AMQ-2875 rule 4) and ``default`` (topics only, since route_unknown_up is
on).  From each run's event log: advisory frames (adds sent), receipts, and *spilled*
receipts -- ``advisory.received`` (add) at a broker that never had a local consumer of
that destination, never produced, forwarded or delivered a message of it -- split by
direction (down: from the broker's parent) and destination kind; and the delivery figures of the run summary (expected, delivered,
duplicates, stranded).  Prints ONE JSON line per scenario and a final
{"bench": "advertise_down", "same_delivery": true|false}.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treefed.scenario.runner import run_scenario  # noqa: E402
from treefed.scenario.spec import load_scenario  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PLAIN = ["queue", "topic"]


def kind(dst: str) -> str:
    return "topic" if "topic://" in dst else "queue"


def spill(run_dir: Path) -> dict:
    interested: set[tuple[str, str]] = set()
    received: list[tuple[str, str, str]] = []
    parent: dict[str, str] = {}
    frames = 0
    for part in sorted(run_dir.glob("events*.jsonl*")):
        opener = gzip.open if part.suffix == ".gz" else open
        with opener(part, "rt", encoding="utf-8") as f:
            for line in f:
                e = json.loads(line)
                ev = e["event"]
                if ev == "advisory.received" and e.get("kind") == "add":
                    received.append((e["broker"], e["dst"], e["peer"]))
                elif ev == "broker.info" and e.get("parent"):
                    parent[e["broker"]] = e["parent"]
                elif ev == "advisory.sent" and e.get("kind") == "add":
                    frames += 1
                elif ev in ("consumer.added", "message.produced", "message.forwarded",
                            "message.delivered"):
                    interested.add((e["broker"], e["dst"]))
    spilled: dict[str, int] = defaultdict(int)
    for broker, dst, peer in received:
        if (broker, dst) not in interested:
            way = "down" if parent.get(broker) == peer else "up"
            spilled[f"{way}_{kind(dst)}"] += 1
    return {"advisory_frames": frames, "advisory_receipts": len(received),
            **{f"spilled_{k}": spilled[k] for k in ("down_queue", "down_topic", "up_queue",
                                                     "up_topic")}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenarios", nargs="*")
    args = p.parse_args(argv)
    files = args.scenarios or [str(f) for f in sorted((ROOT / "scenarios").glob("*.toml"))
                               if f.stem != "retail-4x1000"]
    same = True
    out = Path(tempfile.mkdtemp(prefix="advertise-down-"))
    try:
        for path in files:
            scenario = load_scenario(path)
            tree = [m for m in scenario.modes if m.connector == "tree"]
            if not tree:
                continue
            base = tree[0]
            row: dict = {"bench": "advertise_down", "scenario": scenario.name}
            deliveries: dict[str, dict] = {}
            for label, down in (("plain", PLAIN), ("default", None)):
                options = {k: v for k, v in base.options.items() if k != "advertise_down"}
                if down is not None:
                    options["advertise_down"] = tuple(down)
                mode = dataclasses.replace(base, label=f"tree-{label}", options=options)
                spec = dataclasses.replace(scenario, modes=(mode,))
                [result] = run_scenario(spec, engine="replay", out=out / label)
                s = result.summary
                deliveries[label] = {m: sorted(map(tuple, w))
                                     for m, w in result.deliveries.items()}
                row[label] = {**spill(Path(result.path)),
                              **{k: s[k] for k in ("expected", "delivered", "duplicates",
                                                   "stranded")}}
            keys = ("expected", "delivered", "duplicates", "stranded")
            row["same_delivery"] = all(row["plain"][k] == row["default"][k] for k in keys)
            # which consumer took each message (queue dispatch may pick another one)
            row["same_consumers"] = deliveries["plain"] == deliveries["default"]
            same = same and row["same_delivery"]
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print(json.dumps({"bench": "advertise_down", "same_delivery": same}))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
