"""STOMP throughput: stomp.py producer -> broker -> stomp.py consumer, against the native
client through the same broker in the same run (one JSON line on stdout).

* ``native_msgs_per_s`` — N non-persistent 100-byte messages, native producer -> broker
  -> native consumer (prefetch 1000, each message acked): first send to last receive.
* ``stomp_msgs_per_s`` — the same through the broker's ``stomp://`` listener with the
  real stomp.py client (``Connection12``): producer ``send`` per message, consumer
  ``ack:auto`` with ``activemq.prefetchSize:1000``.
* ``stomp_over_native`` — median of the rounds' own ratios (target: >= 0.5).  Native and
  STOMP phases alternate ``--rounds`` times, so a neighbour's load that comes or goes hits
  both.
* ``broker_cpu_us_per_msg_{native,stomp}`` — CPU of the broker process per message; the
  producer's and consumer's CPU per message are listed too: on 2 cores shared by three
  processes, the path's total CPU is what bounds the rate.

``--profile SECONDS`` adds one STOMP phase sampled with py-spy (``py-spy record`` on the
broker process, raw collapsed stacks) and lists the functions where the broker spends
its time (self and inclusive share of samples) under ``profile``.

    python bench/stomp_throughput.py [--count N] [--rounds R] [--profile S]
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import queue
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BODY = b"x" * 100
NATIVE_DEST = "queue://bench.native"
STOMP_DEST = "/queue/bench.stomp"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _broker_proc(data_dir: str, ready: mp.Queue, stop: mp.Event, ctl: mp.Queue) -> None:
    import trio

    from treefed.config import parse_config
    from treefed.log import configure_logging
    from treefed.node import BrokerNode

    configure_logging("warning")
    config = parse_config({"broker": {"id": "bench", "data_dir": data_dir,
                                      "listen": ["tcp://127.0.0.1:0",
                                                 "stomp://127.0.0.1:0"],
                                      "heartbeat_interval": 0.0},
                           "logging": {"level": "warning"}})

    async def serve() -> None:
        node = BrokerNode(config)
        async with trio.open_nursery() as nursery:
            addresses = await nursery.start(node.serve)
            ready.put((os.getpid(), addresses[0][1], addresses[1][1]))
            while not stop.is_set():
                try:
                    ctl.get_nowait()
                    ready.put(_cpu())
                except queue.Empty:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()

    trio.run(serve)


# --------------------------------------------------------------------------- native

def _native_consumer(port: int, count: int, ready: mp.Queue, result: mp.Queue) -> None:
    import trio

    from treefed.client import connect

    async def consume() -> None:
        async with connect(f"tcp://127.0.0.1:{port}") as conn:
            sub = await conn.subscribe(NATIVE_DEST, prefetch=1000)
            ready.put("ok")
            cpu = _cpu()
            for _ in range(count):
                msg = await sub.receive()
                msg.ack_nowait()
            result.put(("end", time.monotonic()))
            result.put(("consumer_cpu", _cpu() - cpu))

    trio.run(consume)


def _native_producer(port: int, count: int, result: mp.Queue) -> None:
    import trio

    from treefed.client import connect

    async def produce() -> None:
        async with connect(f"tcp://127.0.0.1:{port}") as conn:
            result.put(("start", time.monotonic()))
            cpu = _cpu()
            for _ in range(count):
                await conn.send(NATIVE_DEST, BODY, confirm=False)
            await conn.flush()
            result.put(("producer_cpu", _cpu() - cpu))

    trio.run(produce)


# --------------------------------------------------------------------------- stomp.py

def _stomp_consumer(port: int, count: int, ready: mp.Queue, result: mp.Queue) -> None:
    import stomp

    done = threading.Event()
    got = [0]

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame) -> None:
            got[0] += 1
            if got[0] == count:
                result.put(("end", time.monotonic()))
                done.set()

    conn = stomp.Connection12([("127.0.0.1", port)], auto_decode=False)
    conn.set_listener("bench", Listener())
    conn.connect(wait=True)
    conn.subscribe(STOMP_DEST, "bench", ack="auto",
                   headers={"activemq.prefetchSize": "1000", "receipt": "sub"})
    time.sleep(0.2)
    ready.put("ok")
    cpu = _cpu()
    done.wait(600)
    result.put(("consumer_cpu", _cpu() - cpu))
    conn.disconnect()


def _stomp_producer(port: int, count: int, result: mp.Queue) -> None:
    import stomp

    conn = stomp.Connection12([("127.0.0.1", port)])
    conn.connect(wait=True)
    result.put(("start", time.monotonic()))
    cpu = _cpu()
    for _ in range(count):
        conn.send(STOMP_DEST, BODY)
    result.put(("producer_cpu", _cpu() - cpu))
    conn.disconnect()


# --------------------------------------------------------------------------- runs

def _collect(result: mp.Queue, keys: set[str], timeout: float = 600.0) -> dict:
    out: dict = {}
    deadline = time.monotonic() + timeout
    while not keys <= out.keys():
        key, value = result.get(timeout=max(0.1, deadline - time.monotonic()))
        out[key] = value
    return out


def _finish(*procs: mp.Process) -> None:
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.terminate()


class BrokerUnderTest:
    def __init__(self, ctx: mp.context.BaseContext, data_dir: str) -> None:
        self.ready, self.stop, self.ctl = ctx.Queue(), ctx.Event(), ctx.Queue()
        self.proc = ctx.Process(target=_broker_proc,
                                args=(data_dir, self.ready, self.stop, self.ctl))
        self.proc.start()
        self.pid, self.tcp_port, self.stomp_port = self.ready.get(timeout=60)

    def cpu(self) -> float:
        self.ctl.put("cpu")
        return self.ready.get(timeout=30)

    def close(self) -> None:
        self.stop.set()
        _finish(self.proc)


def run_phase(ctx: mp.context.BaseContext, broker: BrokerUnderTest, count: int,
              protocol: str, profile: float = 0.0) -> dict:
    ready, result = ctx.Queue(), ctx.Queue()
    if protocol == "stomp":
        port, consumer_fn, producer_fn = broker.stomp_port, _stomp_consumer, _stomp_producer
    else:
        port, consumer_fn, producer_fn = broker.tcp_port, _native_consumer, _native_producer
    consumer = ctx.Process(target=consumer_fn, args=(port, count, ready, result))
    consumer.start()
    ready.get(timeout=60)
    cpu = broker.cpu()
    spy = None
    if profile:
        spy_out = os.path.join(tempfile.gettempdir(), f"stomp-bench-{os.getpid()}.txt")
        spy = subprocess.Popen([_py_spy(), "record", "--pid", str(broker.pid),
                                "--duration", str(int(profile)), "--format", "raw",
                                "--rate", "200", "--nonblocking", "--output", spy_out],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)   # py-spy attaches
    producer = ctx.Process(target=producer_fn, args=(port, count, result))
    producer.start()
    got = _collect(result, {"start", "end", "producer_cpu", "consumer_cpu"})
    got["broker_cpu"] = broker.cpu() - cpu
    _finish(producer, consumer)
    if spy is not None:
        spy.wait(timeout=profile + 60)
        got["profile"] = _summarise(spy_out)
        os.unlink(spy_out)
    return got


def _py_spy() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.path.exists(here) else (shutil.which("py-spy") or "py-spy")


def _summarise(path: str, top: int = 15) -> dict:
    """Collapsed stacks -> the functions with the largest self and inclusive shares."""
    self_n: collections.Counter = collections.Counter()
    incl: collections.Counter = collections.Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            n = int(n)
            total += n
            frames = [_short(fr) for fr in stack.split(";")]
            self_n[frames[-1]] += n
            for fr in set(frames):
                incl[fr] += n
    pct = (lambda c: round(100 * c / total, 1)) if total else (lambda c: 0.0)
    return {"samples": total,
            "self_pct": {k: pct(v) for k, v in self_n.most_common(top)},
            "inclusive_pct": {k: pct(v) for k, v in incl.most_common(top * 2)
                              if "treefed" in k or "stomp" in k}}


def _short(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py)"
    name, _, where = frame.partition(" (")
    where = where.rstrip(")").rpartition(":")[0]
    parts = where.split("/")
    if "treefed" in parts:
        where = "/".join(parts[parts.index("treefed"):])
    else:
        where = parts[-1]
    return f"{name} ({where})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20_000, help="messages per phase")
    parser.add_argument("--rounds", type=int, default=3,
                        help="native / STOMP phases, alternated; medians are reported")
    parser.add_argument("--profile", type=float, default=0.0,
                        help="seconds of py-spy sampling of the broker in an extra STOMP "
                             "phase (0: none)")
    args = parser.parse_args(argv)
    ctx = mp.get_context("spawn")
    n = args.count
    with tempfile.TemporaryDirectory(prefix="treefed-stomp-bench-") as data_dir:
        broker = BrokerUnderTest(ctx, data_dir)
        try:
            rounds = []
            for _ in range(max(1, args.rounds)):
                native = run_phase(ctx, broker, n, "native")
                stomp_ = run_phase(ctx, broker, n, "stomp")
                rounds.append((native, stomp_))
            profiled = (run_phase(ctx, broker, n, "stomp", profile=args.profile)
                        if args.profile else None)
        finally:
            broker.close()

    def rate(r: dict) -> float:
        return n / (r["end"] - r["start"])

    def us(r: dict, key: str) -> float:
        return round(r[key] / n * 1e6, 2)

    ratios = [rate(s) / rate(a) for a, s in rounds]
    middle = sorted(range(len(rounds)), key=ratios.__getitem__)[len(rounds) // 2]
    native, stomp_ = rounds[middle]
    figures = {
        "bench": "stomp_throughput",
        "count": n,
        "body_bytes": len(BODY),
        "cpus": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "native_msgs_per_s": round(statistics.median(rate(a) for a, _ in rounds)),
        "stomp_msgs_per_s": round(statistics.median(rate(s) for _, s in rounds)),
        "stomp_over_native": round(statistics.median(ratios), 3),
        "rounds": [{"native_msgs_per_s": round(rate(a)), "stomp_msgs_per_s": round(rate(s)),
                    "ratio": round(rate(s) / rate(a), 3)} for a, s in rounds],
        "broker_cpu_us_per_msg_native": us(native, "broker_cpu"),
        "broker_cpu_us_per_msg_stomp": us(stomp_, "broker_cpu"),
        "native_producer_cpu_us_per_msg": us(native, "producer_cpu"),
        "native_consumer_cpu_us_per_msg": us(native, "consumer_cpu"),
        "stomp_producer_cpu_us_per_msg": us(stomp_, "producer_cpu"),
        "stomp_consumer_cpu_us_per_msg": us(stomp_, "consumer_cpu"),
        "native_path_cpu_us_per_msg": round(sum(native[k] for k in (
            "producer_cpu", "broker_cpu", "consumer_cpu")) / n * 1e6, 2),
        "stomp_path_cpu_us_per_msg": round(sum(stomp_[k] for k in (
            "producer_cpu", "broker_cpu", "consumer_cpu")) / n * 1e6, 2),
    }
    figures["targets_met"] = {"stomp_ge_half_native": figures["stomp_over_native"] >= 0.5}
    if profiled is not None:
        figures["profile"] = profiled["profile"]
        figures["profile"]["broker_cpu_us_per_msg"] = us(profiled, "broker_cpu")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
