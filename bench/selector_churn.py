"""Selector churn benchmark (issue 12 defect 5): a canary's latency through
store -> region -> HQ while a client at the store changes selectors 1,000 times a second.

Estate: three ``treefed broker`` processes (HQ root, region branch, store leaf, tree
connectors over loopback TCP, SQLite stores).  The canary sends one persistent message
every 10 ms at the store to ``queue://HQ.Canary``, consumed at HQ; its latency is the
receive time minus the send time carried in a header.  The churn client at the store
keeps ``--pool`` consumers on one queue, each with its own ~45-character selector, and
replaces the oldest every change pair (unsubscribe + subscribe = 2 changes), at
``--rate`` changes per second: every change is an advisory up the tree and a conduit
member change at the region and at HQ.

Same-run baseline: the canary alone (``quiet``) before the churn (``churn``).  Prints ONE
JSON line: {"bench": "selector_churn", "rate": R, "pool": P, "achieved_rate": ...,
"quiet": {"n", "p50_ms", "p99_ms", "max_ms"}, "churn": {...}, "p99_vs_quiet": ...,
"target": "churn.p99_ms < 50", "refused": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trio  # noqa: E402

from treefed.client import connect  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CANARY = "queue://HQ.Canary"
CHURN = "queue://Store.S1.Churn"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def summary(latencies: list[float]) -> dict:
    return {"n": len(latencies), "p50_ms": round(percentile(latencies, 0.5) * 1e3, 2),
            "p99_ms": round(percentile(latencies, 0.99) * 1e3, 2),
            "max_ms": round(max(latencies, default=float("nan")) * 1e3, 2)}


class Broker:
    """One ``treefed broker`` process; ``uri`` read from its log."""

    def __init__(self, root: Path, name: str, tree: str | None) -> None:
        self.dir = root / name
        self.dir.mkdir(parents=True)
        self.log = self.dir / "broker.log"
        conf = [f'[broker]\nid = "{name}"\ndata_dir = "{self.dir / "data"}"\n'
                'listen = ["tcp://127.0.0.1:0"]\nheartbeat_interval = 5.0\n'
                f'accept_tree_children = {"false" if name == "store" else "true"}\n'
                '[logging]\nlevel = "info"\n']
        if tree is not None:
            node_type = "leaf" if name == "store" else "branch"
            conf.append(f'[tree_connector]\nuri = "{tree}"\nnode_type = "{node_type}"\n')
        self.config = self.dir / "broker.toml"
        self.config.write_text("".join(conf), encoding="utf-8")
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen([sys.executable, "-m", "treefed.cli", "broker",
                                      "--config", str(self.config)],
                                     stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
                                     env=env, cwd=str(REPO))
        self.uri = self._wait_uri()

    def _wait_uri(self) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.log.exists():
                for line in self.log.read_text().splitlines():
                    if '"broker.listening"' in line:
                        return json.loads(line)["uri"]
            if self.proc.poll() is not None:
                raise SystemExit(f"broker exited: {self.log.read_text()}")
            time.sleep(0.05)
        raise SystemExit(f"broker did not start: {self.log.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


async def measure(store: str, hq: str, *, rate: int, pool: int, quiet_s: float,
                  churn_s: float) -> dict:
    latencies: dict[str, list[float]] = {"quiet": [], "churn": []}
    phase = ["quiet"]
    changes = [0]
    refused = [0]
    done = trio.Event()

    async with connect(store) as producer, connect(hq) as consumer, \
            connect(store) as churner:
        sub = await consumer.subscribe(CANARY, prefetch=1000)
        # wait until the canary's interest reached the store (a first message arrives)
        await producer.send(CANARY, b"warm", persistent=True, headers={"t": time.time()})
        with trio.fail_after(30):
            msg = await sub.receive()
            await msg.ack()

        async def receive() -> None:
            async for msg in sub:
                latencies[phase[0]].append(time.time() - msg.headers["t"])
                msg.ack_nowait()

        async def produce() -> None:
            while not done.is_set():
                await producer.send(CANARY, b"c", persistent=True,
                                    headers={"t": time.time()})
                await trio.sleep(0.01)

        async def churn() -> None:
            subs = []
            n = 0
            for n in range(pool):
                subs.append(await churner.subscribe(
                    CHURN, selector=f"region = 'north-east-{n:06d}' AND amount > {n}"))
            await trio.sleep(1.0)         # let the pool's advisories settle
            phase[0] = "churn"
            t0 = time.monotonic()
            interval = 2.0 / rate          # one unsubscribe + one subscribe
            next_at = t0

            async def add(k: int) -> None:
                try:   # the client waits for the broker's confirmation: pipelined
                    subs.append(await churner.subscribe(
                        CHURN, selector=f"region = 'north-east-{k:06d}' AND amount > {k}"))
                except Exception:   # noqa: BLE001 - a refusal is a figure, not a crash
                    refused[0] += 1

            async with trio.open_nursery() as adds:
                while time.monotonic() - t0 < churn_s:
                    n += 1
                    if subs:
                        await subs.pop(0).close()
                    adds.start_soon(add, n)
                    changes[0] += 2
                    next_at += interval
                    delay = next_at - time.monotonic()
                    if delay > 0:
                        await trio.sleep(delay)
            changes.append(time.monotonic() - t0)
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            nursery.start_soon(produce)
            await trio.sleep(quiet_s)
            await churn()
            await trio.sleep(0.5)
            nursery.cancel_scope.cancel()
    return {"quiet": summary(latencies["quiet"]), "churn": summary(latencies["churn"]),
            "achieved_rate": round(changes[0] / changes[1], 1), "refused": refused[0]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=int, default=1000, help="selector changes per second")
    p.add_argument("--pool", type=int, default=200, help="live churn consumers")
    p.add_argument("--quiet", type=float, default=5.0, help="seconds of canary alone")
    p.add_argument("--seconds", type=float, default=10.0, help="seconds of churn")
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="selector-churn-"))
    brokers = []
    try:
        hq = Broker(root, "hq", None)
        brokers.append(hq)
        region = Broker(root, "region", hq.uri)
        brokers.append(region)
        store = Broker(root, "store", region.uri)
        brokers.append(store)
        figures = trio.run(lambda: measure(store.uri, hq.uri, rate=args.rate,
                                           pool=args.pool, quiet_s=args.quiet,
                                           churn_s=args.seconds))
    finally:
        for b in reversed(brokers):
            b.stop()
        shutil.rmtree(root, ignore_errors=True)
    quiet, churn = figures["quiet"]["p99_ms"], figures["churn"]["p99_ms"]
    print(json.dumps({"bench": "selector_churn", "rate": args.rate, "pool": args.pool,
                      **figures, "p99_vs_quiet": round(churn / quiet, 2) if quiet else None,
                      "target": "churn.p99_ms < 50", "load": os.getloadavg()[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
