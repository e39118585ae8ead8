"""HQ -> region -> store: throughput, latency, CPU and RSS of a three-broker chain.

What it measures (one JSON line on stdout), for the chain as a TREE (tree connectors:
HQ root, region branch, store leaf) and as a MESH (duplex network connectors store ->
region -> HQ, ``network_ttl = 2``), three ``treefed broker`` processes on loopback, a
producer connected to HQ sending to ``queue://Store1.Incoming`` and a consumer at the
store (prefetch 1000, one ack per message, merged by the client):

* ``np`` — non-persistent, pipelined: first send to last receive;
* ``p_pipe`` — persistent, pipelined (``confirm=False`` then ``wait_confirmed``);
* ``p_sync`` — persistent, ONE AT A TIME: each ``send`` waits for HQ's receipt (the JMS
  default), with the round trip's p50/p99 and the end-to-end p50/p99;
* ``lat`` — non-persistent one-way latency at a fixed 1,000 msgs/s (open loop, evenly
  paced: bench/pacing.py), and the same for ``lat_p`` with one-at-a-time persistent sends
  paced at 1,000 msgs/s; ``lat.gc``: each broker's GC passes per 1,000 messages of the
  phase and its longest pauses (``stat``'s ``gc``, node/gcwatch.py);
* per broker: RSS at idle (once the broker's idle trim ran), right after the run and
  settled (idle again, trimmed) (VmRSS), and CPU µs per message of each phase
  (utime + stime from /proc) and context switches per message of each phase (all
  threads, /proc; ``lat_ctx_switches_per_msg``: the wake-ups a paced message costs);
* ``disk_floor`` — the disk's own floor in the same run and directory
  (``bench/disk_floor.py``: ``fdatasync`` and one ``SqliteStore`` commit, before and
  after the rounds): a persistent message one at a time through three stores waits for
  at least HQ's commit before its receipt, and every hop commits it again;
* ``hop_floor`` — the loopback's own floor (``bench/hop_floor.py``, before and after the
  rounds): one hop between two bare Python processes, and ``p_sync_cap_msgs_per_s``, the
  rate two such hops and one SQLite commit (the disk floor's) cap a one-at-a-time sender
  at whose receipt waits for HQ's commit, with no work done anywhere;
* ``relay`` — the same-run baseline: three bare relay processes (decode every frame,
  re-encode it, batch per read) between the same producer and consumer, non-persistent
  throughput and latency at 1,000 msgs/s over the same three hops.

Rounds alternate relay / tree / mesh (the order rotates each round) so load that comes
and goes hits all; every figure is the median over rounds and each ratio the median of
the rounds' own ratios.  The machine's 1-minute load is recorded before and after.

ActiveMQ figures are constants (``ACTIVEMQ``) with their source: the side-by-side run
quoted in issue #14 (ActiveMQ Classic 5.17.2, Java JMS clients, same 2-vCPU machine,
100-byte messages).  Running a real ActiveMQ is the anchors harness's job.

    python bench/chain_throughput.py [--count N] [--sync-count M] [--latency-count L]
                                     [--rounds R] [--modes tree,mesh] [--idle-poll-us U]

``--idle-poll-us``: the three brokers' ``[broker] idle_poll_us`` and the producer's and
consumer's ``connect(..., idle_poll_us=)`` (transport/idlepoll.py; default 0, off).

The producer and the consumer are two connections in this (driver) process, as the JMS
client in the ActiveMQ run was one JVM with two connections.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "bench"))

import disk_floor  # noqa: E402  (bench/disk_floor.py)
import hop_floor  # noqa: E402  (bench/hop_floor.py)
import pacing  # noqa: E402  (bench/pacing.py: even gaps, not trio's 1 ms timer)

BODY = b"x" * 100
DEST = "queue://Store1.Incoming"

#: ActiveMQ Classic 5.17.2 on the same 2-vCPU machine, Java JMS clients, 100-byte
#: messages, 100,000 per run, latency at 1,000 msgs/s.  Source: the side-by-side table of
#: issue #14 ("Data plane round 2"), measured with /work/shared/anchors/treefed-vs-activemq
#: (results/tables.md: best repetition of the alternated runs) next to the ActiveMQ
#: harness /work/shared/anchors/activemq (results/throughput.md).
ACTIVEMQ = {
    "source": "issue #14 side-by-side table; anchors/treefed-vs-activemq/results/tables.md",
    "version": "ActiveMQ Classic 5.17.2 (Debian), OpenJDK 17, KahaDB fsync=always",
    "single_np_msgs_per_s": 29_959,
    "single_p_sync_msgs_per_s": 3_508,
    "chain_np_msgs_per_s": 11_796,
    "chain_p_sync_msgs_per_s": 1_656,
    "chain_lat_p50_ms": 0.34,
    "chain_lat_p99_ms": 1.37,
    "chain_p_lat_p50_ms": 0.59,
    "chain_p_lat_p99_ms": 4.2,
    "rss_mib": [127, 176],
}
#: issue #14's targets, as ratios of the constants above (and absolute bounds)
TARGETS = {
    "chain_p_sync_msgs_per_s": 2 * ACTIVEMQ["chain_p_sync_msgs_per_s"],   # >= 3,300
    "chain_p_sync_p99_ms": 4.0,
    "chain_np_msgs_per_s": 4 * ACTIVEMQ["chain_np_msgs_per_s"],           # >= 47,000
    "chain_np_over_relay": 0.75,
    "chain_lat_p50_ms": 0.35,
    "chain_lat_p99_ms": 1.4,
    "rss_idle_mib": 35,
    "rss_after_mib": 50,
}


# --------------------------------------------------------------------------- helpers

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_cpu(pid: int) -> float:
    """utime + stime of ``pid`` in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ctx_switches(pid: int) -> int:
    """Context switches (voluntary + involuntary) of every thread of ``pid`` so far."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
                if "ctxt_switches:" in line:   # voluntary_..., nonvoluntary_...
                    total += int(line.split()[1])
    except OSError:   # a thread ended meanwhile
        pass
    return total


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _q_ms(samples: list[float]) -> dict:
    if len(samples) < 2:
        return {"p50": None, "p99": None}
    q = statistics.quantiles(sorted(samples), n=100, method="inclusive")
    return {"p50": round(q[49] * 1000, 3), "p99": round(q[98] * 1000, 3)}


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


# --------------------------------------------------------------------------- brokers

class Chain:
    """HQ <- REGION <- STORE1 as three ``treefed broker`` processes."""

    NAMES = ("hq", "region", "store1")

    def __init__(self, root: Path, mode: str, idle_poll_us: int = 0) -> None:
        from treefed.config import dump_config, parse_config

        self.mode = mode
        self.root = root / mode
        self.root.mkdir(parents=True)
        self.ports = {n: _free_port() for n in self.NAMES}
        self.procs: dict[str, subprocess.Popen] = {}
        parent = {"region": "hq", "store1": "region"}
        node_type = {"region": "branch", "store1": "leaf"}
        self.configs = {}
        for name in self.NAMES:
            doc: dict = {"broker": {"id": name, "data_dir": str(self.root / f"{name}-data"),
                                    "listen": [f"tcp://127.0.0.1:{self.ports[name]}"],
                                    "idle_poll_us": idle_poll_us},
                         "logging": {"level": "warning",
                                     "file": str(self.root / f"{name}.log")}}
            if name in parent:
                up = f"tcp://127.0.0.1:{self.ports[parent[name]]}"
                if mode == "tree":
                    doc["tree_connector"] = {"uri": f"failover:({up})",
                                             "node_type": node_type[name]}
                else:
                    doc["network_connector"] = [{"name": "up", "uri": f"static:({up})",
                                                 "duplex": True, "network_ttl": 2}]
            path = self.root / f"{name}.toml"
            path.write_text(dump_config(parse_config(doc)))
            self.configs[name] = path

    def uri(self, name: str) -> str:
        return f"tcp://127.0.0.1:{self.ports[name]}"

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        for name in self.NAMES:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "treefed.cli", "broker", "--config",
                 str(self.configs[name])], env=env, cwd=str(REPO),
                stdout=subprocess.DEVNULL, stderr=open(self.root / f"{name}.err", "wb"))

    def cpu(self) -> dict[str, float]:
        return {n: _proc_cpu(p.pid) for n, p in self.procs.items()}

    def switches(self) -> dict[str, int]:
        return {n: _ctx_switches(p.pid) for n, p in self.procs.items()}

    def rss(self) -> dict[str, float]:
        return {n: _rss_mib(p.pid) for n, p in self.procs.items()}

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


# --------------------------------------------------------------------------- relay

def _relay_node(downstream: int | None, ready: mp.Queue) -> None:
    """One bare relay hop: dial ``downstream`` (or, for the last hop, accept the consumer
    first), then accept the upstream and pump decoded, re-encoded frames."""
    import trio

    from treefed.transport.framed import FramedStream

    async def run() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        ready.put(listeners[0].socket.getsockname()[1])
        if downstream is None:
            down = FramedStream(await listeners[0].accept())
        else:
            down = FramedStream(await trio.open_tcp_stream("127.0.0.1", downstream))
        up = FramedStream(await listeners[0].accept())
        try:
            while True:
                await down.send_frames(await up.receive_frames())
        except (trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    trio.run(run)


class Relay:
    def __init__(self, ctx: mp.context.BaseContext) -> None:
        self.ctx = ctx
        self.procs: list[mp.Process] = []
        self.ports: list[int] = []

    def start_last(self) -> int:
        q = self.ctx.Queue()
        p = self.ctx.Process(target=_relay_node, args=(None, q), daemon=True)
        p.start()
        self.procs.append(p)
        port = q.get(timeout=30)
        self.ports.append(port)
        return port

    def start_before(self, downstream: int) -> int:
        q = self.ctx.Queue()
        p = self.ctx.Process(target=_relay_node, args=(downstream, q), daemon=True)
        p.start()
        self.procs.append(p)
        port = q.get(timeout=30)
        self.ports.append(port)
        return port

    def cpu(self) -> float:
        return sum(_proc_cpu(p.pid) for p in self.procs if p.is_alive())

    def stop(self) -> None:
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(5)


async def relay_round(ctx: mp.context.BaseContext, count: int, lat_count: int) -> dict:
    import trio

    from treefed.transport.framed import FramedStream
    from treefed.wire.frames import Send

    out: dict = {}
    for phase, n, rate in (("np", count, 0.0), ("lat", lat_count, 1000.0)):
        relay = Relay(ctx)
        last = relay.start_last()
        consumer = FramedStream(await trio.open_tcp_stream("127.0.0.1", last))
        mid = relay.start_before(last)
        first = relay.start_before(mid)
        await trio.sleep(0.3)
        producer = FramedStream(await trio.open_tcp_stream("127.0.0.1", first))
        if rate:
            pacing.settle_heap()   # the driver's collector: only what the phase makes
        cpu0 = relay.cpu()
        lat: list[float] = []
        ends: list[float] = []

        async def consume(n: int = n) -> None:
            got = 0
            while got < n:
                frames = await consumer.receive_frames()
                now = time.monotonic()
                if rate:
                    lat.extend(now - f.headers["t"] for f in frames)
                got += len(frames)
            ends.append(now)

        start = time.monotonic()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            if rate:
                t0 = time.monotonic()   # pacing's clock
                for i in range(n):
                    await pacing.sleep_until(t0 + i / rate)
                    await producer.send_frames([Send(DEST, f"r{i}", {"t": time.monotonic()},
                                                     BODY)])
            else:
                for i in range(0, n, 256):
                    await producer.send_frames([Send(DEST, f"r{j}", {}, BODY)
                                                for j in range(i, min(i + 256, n))])
        cpu = relay.cpu() - cpu0
        await producer.aclose()
        await consumer.aclose()
        relay.stop()
        if rate:
            out["lat"] = _q_ms(lat[len(lat) // 10:])
        else:
            out["np_msgs_per_s"] = round(n / (ends[0] - start))
            out["np_cpu_us_per_msg_per_hop"] = round(cpu / n / 3 * 1e6, 2)
    return out


# --------------------------------------------------------------------------- the chain

async def _wait_serving(uri: str, timeout: float = 30.0) -> None:
    import trio

    from treefed.client import connect
    from treefed.errors import TreefedError

    deadline = time.monotonic() + timeout
    while True:
        try:
            with trio.fail_after(2):
                async with connect(uri, client_id="bench-probe") as conn:
                    await conn.stat()
                    return
        except (TreefedError, OSError, trio.TooSlowError):
            if time.monotonic() > deadline:
                raise
            await trio.sleep(0.1)


async def _gc_figures(chain: Chain) -> dict:
    """Each broker's collector (``stat``'s ``gc``, node/gcwatch.py; None before it)."""
    from treefed.client import connect

    out = {}
    for name in Chain.NAMES:
        async with connect(chain.uri(name), client_id="bench-gc") as conn:
            out[name] = (await conn.stat("summary")).get("gc")
    return out


def _gc_per_1000(before: dict, after: dict, n: int) -> dict:
    """Per broker: GC passes per 1,000 messages of the phase, per generation, and the
    longest pause per generation since the broker started (counts: load-proof)."""
    out = {}
    for name, a in after.items():
        b = before.get(name)
        if a is None or b is None or "passes" not in a:
            out[name] = None
            continue
        out[name] = {"passes_per_1000": [round((y - x) / n * 1000, 2)
                                         for x, y in zip(b["passes"], a["passes"])],
                     "pause_max_ms": a["pause_max_ms"]}
    return out


async def _phase(chain: Chain, prod, sub, n: int, kind: str, tag: str) -> dict:
    """One phase: ``kind`` is np | p_pipe | p_sync | lat | lat_p."""
    import trio

    rate = 1000.0 if kind in ("lat", "lat_p") else 0.0
    persistent = kind in ("p_pipe", "p_sync", "lat_p")
    e2e: list[float] = []
    rtt: list[float] = []
    done = trio.Event()
    end = [0.0]

    async def consume() -> None:
        got = 0
        while got < n:
            msg = await sub.receive()
            if msg.headers.get("ph") != tag:
                msg.ack_nowait()
                continue        # a straggler of an earlier phase (never expected)
            now = time.monotonic()
            e2e.append(now - msg.headers["t"])
            msg.ack_nowait()
            got += 1
        end[0] = time.monotonic()
        done.set()

    if rate:
        pacing.settle_heap()   # the driver keeps every earlier phase: not walked again
    cpu0 = chain.cpu()
    switches0 = chain.switches()
    start = time.monotonic()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(consume)
        t0 = time.monotonic()   # pacing's clock
        for i in range(n):
            if rate:
                await pacing.sleep_until(t0 + i / rate)
            headers = {"ph": tag, "t": time.monotonic()}
            if kind in ("p_sync", "lat_p"):
                a = time.monotonic()
                await prod.send(DEST, BODY, headers=headers, persistent=True)
                rtt.append(time.monotonic() - a)
            else:
                await prod.send(DEST, BODY, headers=headers, persistent=persistent,
                                confirm=False)
        if kind == "p_pipe":
            await prod.wait_confirmed()
        await prod.flush()
        with trio.fail_after(120):
            await done.wait()
    cpu1 = chain.cpu()
    switches1 = chain.switches()
    out = {"cpu_us_per_msg": {b: round((cpu1[b] - cpu0[b]) / n * 1e6, 1) for b in cpu0},
           # wake-ups per message (issue #14): a count a loaded machine's tails do not blur
           "ctx_switches_per_msg": {b: round((switches1[b] - switches0[b]) / n, 2)
                                    for b in switches0}}
    if rate:
        skip = n // 10
        out["e2e"] = _q_ms(e2e[skip:])
        if rtt:
            out["rtt"] = _q_ms(rtt[skip:])
    else:
        out["msgs_per_s"] = round(n / (end[0] - start))
        if rtt:
            out["rtt"] = _q_ms(rtt)
            out["e2e"] = _q_ms(e2e)
    return out


async def chain_round(root: Path, mode: str, args: argparse.Namespace, rnd: int) -> dict:
    import trio

    from treefed.client import connect

    chain = Chain(root, f"{mode}-{rnd}", args.idle_poll_us)
    chain.start()
    try:
        for name in Chain.NAMES:
            await _wait_serving(chain.uri(name))
        # idle = after the broker's idle trim (node/trim.py: IDLE_TRIM_S without a batch)
        from treefed.node.trim import IDLE_TRIM_S

        await trio.sleep(2 * IDLE_TRIM_S + 1.5)   # a trim comes 1-2 intervals after the last batch
        idle = chain.rss()
        out: dict = {"rss_idle_mib": idle}
        async with connect(chain.uri("store1"), client_id="bench-consumer",
                           idle_poll_us=args.idle_poll_us) as cons, \
                connect(chain.uri("hq"), client_id="bench-producer",
                        idle_poll_us=args.idle_poll_us) as prod:
            sub = await cons.subscribe(DEST, prefetch=1000)
            # interest has to reach HQ before the first send, or it waits at HQ
            with trio.fail_after(30):
                while True:
                    await prod.send(DEST, BODY, headers={"ph": "probe", "t": 0.0})
                    try:
                        with trio.fail_after(0.5):
                            # acked: an unacked message at the head of the subscription
                            # turns every later ack into a frame of its own (the client's
                            # cumulative ack cannot pass it), one Ack per message at the store
                            (await sub.receive()).ack_nowait()
                        break
                    except trio.TooSlowError:
                        continue
            await _phase(chain, prod, sub, args.warmup, "np", "w")
            for kind, n in (("np", args.count), ("p_pipe", args.count),
                            ("p_sync", args.sync_count), ("lat", args.latency_count),
                            ("lat_p", args.latency_count)):
                gc0 = await _gc_figures(chain) if kind == "lat" else None
                out[kind] = await _phase(chain, prod, sub, n, kind, f"{kind}{rnd}")
                if gc0 is not None:
                    out[kind]["gc"] = _gc_per_1000(gc0, await _gc_figures(chain), n)
                await trio.sleep(0.5)
        out["rss_after_mib"] = chain.rss()
        await trio.sleep(2 * IDLE_TRIM_S + 1.5)   # a trim comes 1-2 intervals after the last batch
        out["rss_settled_mib"] = chain.rss()    # idle again, after the trim
        return out
    finally:
        chain.stop()


def _summary(rounds: dict[str, list[dict]], relay: list[dict]) -> dict:
    summary: dict = {"relay": {
        "np_msgs_per_s": _median([r["np_msgs_per_s"] for r in relay]),
        "np_cpu_us_per_msg_per_hop": _median([r["np_cpu_us_per_msg_per_hop"] for r in relay]),
        "lat_p50_ms": _median([r["lat"]["p50"] for r in relay]),
        "lat_p99_ms": _median([r["lat"]["p99"] for r in relay]),
    }}
    for mode, rs in rounds.items():
        if not rs:
            continue
        m: dict = {}
        for kind in ("np", "p_pipe", "p_sync"):
            m[f"{kind}_msgs_per_s"] = _median([r[kind]["msgs_per_s"] for r in rs])
        m["np_over_relay"] = _median([r["np"]["msgs_per_s"] / x["np_msgs_per_s"]
                                      for r, x in zip(rs, relay)])
        m["p_sync_rtt_p50_ms"] = _median([r["p_sync"]["rtt"]["p50"] for r in rs])
        m["p_sync_rtt_p99_ms"] = _median([r["p_sync"]["rtt"]["p99"] for r in rs])
        m["lat_p50_ms"] = _median([r["lat"]["e2e"]["p50"] for r in rs])
        m["lat_p99_ms"] = _median([r["lat"]["e2e"]["p99"] for r in rs])
        m["lat_p_p50_ms"] = _median([r["lat_p"]["e2e"]["p50"] for r in rs])
        m["lat_p_p99_ms"] = _median([r["lat_p"]["e2e"]["p99"] for r in rs])
        for kind in ("np", "p_pipe", "p_sync", "lat"):
            m[f"{kind}_cpu_us_per_msg"] = {
                b: _median([r[kind]["cpu_us_per_msg"][b] for r in rs]) for b in Chain.NAMES}
        m["lat_ctx_switches_per_msg"] = {
            b: _median([r["lat"]["ctx_switches_per_msg"][b] for r in rs])
            for b in Chain.NAMES}
        m["rss_idle_mib"] = {b: _median([r["rss_idle_mib"][b] for r in rs])
                             for b in Chain.NAMES}
        m["rss_after_mib"] = {b: _median([r["rss_after_mib"][b] for r in rs])
                              for b in Chain.NAMES}
        m["rss_settled_mib"] = {b: _median([r["rss_settled_mib"][b] for r in rs])
                                for b in Chain.NAMES}
        m["vs_activemq"] = {
            "np": round(m["np_msgs_per_s"] / ACTIVEMQ["chain_np_msgs_per_s"], 3),
            "p_sync": round(m["p_sync_msgs_per_s"] / ACTIVEMQ["chain_p_sync_msgs_per_s"], 3),
        }
        m["targets_met"] = {
            "p_sync_ge_2x_activemq": m["p_sync_msgs_per_s"] >= TARGETS["chain_p_sync_msgs_per_s"],
            "p_sync_p99_le_4ms": (m["lat_p_p99_ms"] or 1e9) <= TARGETS["chain_p_sync_p99_ms"],
            "np_ge_4x_activemq": m["np_msgs_per_s"] >= TARGETS["chain_np_msgs_per_s"],
            "np_ge_0_75_relay": (m["np_over_relay"] or 0) >= TARGETS["chain_np_over_relay"],
            "lat_p50_le_0_35ms": (m["lat_p50_ms"] or 1e9) <= TARGETS["chain_lat_p50_ms"],
            "lat_p99_le_1_4ms": (m["lat_p99_ms"] or 1e9) <= TARGETS["chain_lat_p99_ms"],
            "rss_idle_le_35mib": max(m["rss_idle_mib"].values()) <= TARGETS["rss_idle_mib"],
            "rss_after_le_50mib": max(m["rss_after_mib"].values()) <= TARGETS["rss_after_mib"],
        }
        summary[mode] = m
    return summary


def main(argv: list[str] | None = None) -> int:
    import trio

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000,
                        help="messages per pipelined phase")
    parser.add_argument("--sync-count", type=int, default=10_000,
                        help="messages of the one-at-a-time persistent phase")
    parser.add_argument("--latency-count", type=int, default=5_000,
                        help="messages per latency phase (at 1,000 msgs/s)")
    parser.add_argument("--warmup", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="tree,mesh")
    parser.add_argument("--idle-poll-us", type=int, default=0,
                        help="the brokers' and the two clients' idle_poll_us (0: off)")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    ctx = mp.get_context("spawn")
    load_before = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="treefed-chain-"))
    relay: list[dict] = []
    rounds: dict[str, list[dict]] = {m: [] for m in modes}
    floors: list[dict] = []
    hops: list[dict] = []
    try:
        # the disk's own floor where the brokers' data dirs are, and the loopback's
        # (bench/hop_floor.py), before and after
        floors.append(disk_floor.measure(str(root), 300))
        hops.append(hop_floor.measure(1000))
        for rnd in range(max(1, args.rounds)):
            order = ["relay", *modes]
            order = order[rnd % len(order):] + order[:rnd % len(order)]
            for what in order:
                if what == "relay":
                    relay.append(trio.run(relay_round, ctx, args.count, args.latency_count))
                else:
                    rounds[what].append(trio.run(chain_round, root, what, args, rnd))
        floors.append(disk_floor.measure(str(root), 300))
        hops.append(hop_floor.measure(1000))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    figures = {
        "bench": "chain_throughput",
        "counts": {"count": args.count, "sync_count": args.sync_count,
                   "latency_count": args.latency_count, "warmup": args.warmup,
                   "rounds": args.rounds, "body_bytes": len(BODY)},
        "cpus": os.cpu_count(),
        "idle_poll_us": args.idle_poll_us,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "activemq": ACTIVEMQ,
        "targets": TARGETS,
        "disk_floor": disk_floor.combine(floors),
        "hop_floor": {**hop_floor.combine(hops),
                      # HQ's receipt: the send, HQ's commit, the receipt
                      "p_sync_cap_msgs_per_s": hop_floor.commit_cap(
                          hop_floor.combine(hops)["hop_trio_us"],
                          disk_floor.combine(floors)["sqlite_commit_p50_ms"])},
        "summary": _summary(rounds, relay),
        "rounds": {"relay": relay, **rounds},
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
