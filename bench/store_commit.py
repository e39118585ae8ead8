"""Group-commit benchmark for the message store: inserts/s by batch size and fsync policy.

Commits batches of 1, 10, 100 and 1000 persistent messages through SqliteStore with
synchronous=FULL (fsync per commit: survives power loss) and NORMAL (survives kill -9),
and through MemoryStore as the same-run baseline, then prints ONE JSON line:

    {"bench": "store_commit", "inserts_per_s": {store: {batch: rate}},
     "vs_memory": {store: {batch: rate / memory rate}}, ...}

Only apply() is timed (building the messages is not), with the garbage collector paused so
that the baseline measures the store and not GC passes over the growing heap.  Each
(store, batch) cell runs for about --seconds or --max-messages, whichever comes first.  Where the files live matters (tmpfs makes fsync free): pass --dir to
measure the disk a broker's data_dir would really use.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treefed.core.message import Message  # noqa: E402
from treefed.persistence import MemoryStore, MessageStore, SqliteStore  # noqa: E402

BATCHES = (1, 10, 100, 1000)


def rate(store: MessageStore, batch: int, seconds: float, cap: int, body: bytes, tag: str) -> float:
    """Messages per second committed in batches of ``batch`` over about ``seconds``."""
    done, spent, n = 0, 0.0, 0
    while spent < seconds and done < cap:
        msgs = [
            Message(f"{tag}-{i}", "queue://BENCH.Store1", headers={"seq": i}, body=body,
                    persistent=True, timestamp=1_700_000_000.0)
            for i in range(n, n + batch)
        ]
        n += batch
        t0 = time.perf_counter()
        store.apply(msgs, [])
        spent += time.perf_counter() - t0
        done += batch
    return done / spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="parent directory for the store files (default: system temp)")
    ap.add_argument("--seconds", type=float, default=0.4, help="time per (store, batch) cell")
    ap.add_argument("--max-messages", type=int, default=100_000, help="cap per cell")
    ap.add_argument("--body", type=int, default=256, help="message body bytes")
    args = ap.parse_args()
    body = os.urandom(args.body)

    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="treefed-bench-") as root:
        factories = {
            "memory": MemoryStore,
            "sqlite_full": lambda: SqliteStore(Path(root) / "full", synchronous="FULL"),
            "sqlite_normal": lambda: SqliteStore(Path(root) / "normal", synchronous="NORMAL"),
        }
        for name, make in factories.items():
            results[name] = {}
            for b in BATCHES:
                gc.collect()
                gc.disable()
                try:
                    with make() as store:
                        r = rate(store, b, args.seconds, args.max_messages, body, f"{name}{b}")
                finally:
                    gc.enable()
                results[name][str(b)] = round(r, 1)
        where = os.path.dirname(root)

    vs_memory = {
        name: {b: round(r / results["memory"][b], 5) for b, r in cells.items()}
        for name, cells in results.items() if name != "memory"
    }
    print(json.dumps({
        "bench": "store_commit",
        "dir": where,
        "body_bytes": args.body,
        "seconds_per_cell": args.seconds,
        "inserts_per_s": results,
        "vs_memory": vs_memory,
    }))


if __name__ == "__main__":
    main()
