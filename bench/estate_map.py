"""`treefed map` on a big tree estate (issue #16).

A retail-shaped estate — 1 root, ``--regions`` branches, ``--stores`` leaves under each
(default 4 x 1000 = 4,005 brokers) — runs as real BrokerNodes in ONE host process, every
link and listener a loopback TCP socket (what the tcp engine does, on the real clock).
Each store holds one local consumer on its own queue, so every link carries demand.
Then the real CLI, ``treefed map ROOT --json``, runs as a separate process, alternating
with the same-run baseline ``treefed stat ROOT`` (one broker asked: process start, import,
one connection); medians of ``--rounds`` each, with the CPU seconds the map process and
the estate's host process spent during the walk (what the wall time costs on a quiet
machine; on a shared one the wall time mostly measures the queue for a core).  One JSON
line on stdout.

    python bench/estate_map.py [--regions R] [--stores S] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from treefed.config import parse_config  # noqa: E402
from treefed.log import configure_logging  # noqa: E402
from treefed.node import BrokerNode  # noqa: E402
from treefed.wire.frames import Subscribe  # noqa: E402


def config(broker_id: str, folder: str, parent: str | None, node_type: str) -> object:
    doc: dict = {"broker": {"id": broker_id, "data_dir": f"{folder}/{broker_id}",
                            "listen": ["tcp://127.0.0.1:0"], "heartbeat_interval": 0.0},
                 "logging": {"level": "error"}}
    if parent is not None:
        doc["tree_connector"] = {"uri": parent, "node_type": node_type}
    return parse_config(doc)


async def local_consumer(node: BrokerNode, dst: str) -> None:
    """A consumer held by the broker itself (no client socket: 4,000 more sockets would
    only measure the kernel): the same Site calls a client's hello and subscribe make."""
    now = time.time()
    actions = node.site.client_connected("bench", now)
    actions += node.site.handle_frame("bench", Subscribe("s", dst, None, 10, 4), now)
    async with node._batch_lock:   # noqa: SLF001 - a bench harness, as the site task does
        await node._perform(actions, now)   # noqa: SLF001


async def host(regions: int, stores: int, rounds: int, folder: str) -> dict:
    out: dict = {"brokers": 1 + regions + regions * stores}
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    began = time.perf_counter()
    async with trio.open_nursery() as nursery:
        root = BrokerNode(config("root", folder, None, "root"))
        (h, p), = await nursery.start(root.serve)
        root_uri = f"tcp://{h}:{p}"
        leaves = []
        for r in range(regions):
            region = BrokerNode(config(f"r{r}", folder, root_uri, "branch"))
            (h, p), = await nursery.start(region.serve)
            for s in range(stores):
                leaf = BrokerNode(config(f"r{r}s{s}", folder, f"tcp://{h}:{p}", "leaf"))
                await nursery.start(leaf.serve)
                leaves.append(leaf)
        while not all(n.dialers[0].state == "operational" for n in leaves):
            await trio.sleep(0.2)
        for leaf in leaves:
            await local_consumer(leaf, f"queue://Store.{leaf.broker_id}.orders")
        while root.site.statistics()["interest"] < len(leaves):
            await trio.sleep(0.2)
        out["estate_up_seconds"] = round(time.perf_counter() - began, 1)
        maps, stats, ratios, cpu_client, cpu_host = [], [], [], [], []
        last = {}
        for _ in range(rounds):
            t = time.perf_counter()
            await trio.run_process([sys.executable, "-m", "treefed.cli", "stat", root_uri],
                                   capture_stdout=True, env=env)
            s = time.perf_counter() - t
            t = time.perf_counter()
            kids, me = (resource.getrusage(resource.RUSAGE_CHILDREN),
                        resource.getrusage(resource.RUSAGE_SELF))
            done = await trio.run_process([sys.executable, "-m", "treefed.cli", "map",
                                           root_uri, "--json", "--timeout", "30"],
                                          capture_stdout=True, env=env, check=False)
            m = time.perf_counter() - t
            kids2, me2 = (resource.getrusage(resource.RUSAGE_CHILDREN),
                          resource.getrusage(resource.RUSAGE_SELF))
            cpu_client.append(kids2.ru_utime + kids2.ru_stime - kids.ru_utime - kids.ru_stime)
            cpu_host.append(me2.ru_utime + me2.ru_stime - me.ru_utime - me.ru_stime)
            last = json.loads(done.stdout)
            maps.append(m)
            stats.append(s)
            ratios.append(m / s)
        out.update({"map_seconds": round(statistics.median(maps), 2),
                    "stat_seconds": round(statistics.median(stats), 2),
                    "map_over_stat": round(statistics.median(ratios), 1),
                    "walk_seconds_reported": last.get("seconds"),
                    "map_cpu_seconds_client": round(statistics.median(cpu_client), 2),
                    "map_cpu_seconds_estate_host": round(statistics.median(cpu_host), 2),
                    "found": last.get("brokers"), "unreachable": last.get("unreachable"),
                    "root_demand": sum(l["demand"] for l in
                                       last["estate"]["root"]["links"])})
        nursery.cancel_scope.cancel()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--regions", type=int, default=4)
    parser.add_argument("--stores", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    configure_logging("error")
    with tempfile.TemporaryDirectory(prefix="issue16-map-") as folder:
        figures = trio.run(host, args.regions, args.stores, args.rounds, folder)
    figures["load"] = open("/proc/loadavg").read().split()[:3]
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
