"""Broker throughput and latency: producer -> broker -> consumer, three processes on loopback.

What it measures (one JSON line on stdout):

* ``baseline_relay_msgs_per_s`` — the same CBOR Send frames (100-byte bodies) relayed by a
  bare middle process that decodes and re-encodes every frame, with batched reads and
  writes.  That is what the stack (trio + cbor2 + loopback TCP) can do with no broker
  logic at all; the other figures are read as ratios to it, which hold on a noisy machine.
* ``nonpersistent_msgs_per_s`` — N non-persistent messages through a BrokerNode to a
  consumer that acks each one (prefetch 1000): producer's first send to the consumer's
  last receive.
* ``persistent_msgs_per_s`` — N persistent messages (SQLite, WAL, synchronous=FULL),
  the producer pipelining sends and counting receipts; first send to last receipt, with
  the consumer acking (deleting) concurrently.
* ``persistent_sync_msgs_per_s`` — persistent sends ONE AT A TIME (issue #14): each
  ``send`` waits for the receipt, i.e. for the commit (fsync of the WAL with
  synchronous=FULL), before the next is sent — the JMS default; with the receipt round
  trip's p50/p99 and the broker's CPU per message.  ActiveMQ 5.17's figure for the same
  path on the same machine is ``ACTIVEMQ_SINGLE_P_SYNC`` (source below); the target is 2x.
  Each message is also delivered to a consumer that acks it, so the broker commits an
  insert and a delete per message -- unless the consumer's ack comes before the
  commit would end: then neither is written (concurrent store and dispatch, node/node.py
  ``EARLY_PROBE_S``); ``persistent_sync_consumed_before_commit`` is the share of such
  messages.  ``persistent_sync_lone_*``: the same with no
  consumer (one commit per message; the messages stay queued on their own destination).
* ``disk_*`` — the disk's own floor, measured in the same run and directory
  (``bench/disk_floor.py``): ``pwrite`` + ``fdatasync`` and one ``SqliteStore`` commit
  (median wall, CPU per op, and the rate each caps a lone sender at; measured before
  and after the one-at-a-time phases, the two medians averaged);
  ``persistent_sync_*_over_sqlite_floor`` is the one-at-a-time rate over that cap.
* ``hop_*``, ``write_*_peer_us``, ``sync_consumer_cap_msgs_per_s`` — the loopback's own
  floor, measured in the same run before and after the one-at-a-time phases, the two
  averaged (``bench/hop_floor.py``):
  one hop between two bare Python processes, and the rate four such hops (send, Deliver,
  ack, receipt) cap a one-at-a-time sender with a consumer at when nobody does any work;
  ``persistent_sync_over_hop_cap`` is the broker's one-at-a-time rate over that cap;
  ``persistent_sync_lone_cap_msgs_per_s``: two hops and one SQLite commit (the disk
  floor's), a lone sender's cap.
* ``p50_ms_at_1000`` / ``p99_ms_at_1000`` — one-way latency of non-persistent messages
  offered at 1,000 msgs/s (producer send time in a header; CLOCK_MONOTONIC is shared
  by the processes; evenly paced, bench/pacing.py), next to the bare relay's at the same
  rate; ``broker_gc_passes_per_1000_at_1000`` / ``broker_gc_pause_max_ms``: the broker's
  GC passes per generation during that phase and its longest pauses (node/gcwatch.py);
  ``*_cpu_us_per_msg_at_1000`` and ``broker_ctx_switches_per_msg_at_1000`` (voluntary +
  involuntary, all its threads, /proc): what each message costs at that rate, mostly
  wake-ups — counts that a loaded machine's tails do not blur (issue #14).
* ``*_cpu_us_per_msg`` — CPU time of the middle process per message.  When other work
  shares the CPUs the rates drop, but CPU per message barely moves.

Targets (issue #2): non-persistent >= 0.5 x baseline; persistent >= 10,000 msgs/s;
p99 < 5 ms at 1,000 msgs/s.

The relay and the non-persistent broker phase alternate ``--rounds`` times (default 3);
the rates are medians and ``nonpersistent_over_baseline`` is the median of the rounds'
own ratios (each round's figures are listed under ``rounds``).

    python bench/broker_throughput.py [--count N] [--rounds R] [--latency-seconds S]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import disk_floor  # noqa: E402  (bench/disk_floor.py)
import hop_floor  # noqa: E402  (bench/hop_floor.py)
import pacing  # noqa: E402  (bench/pacing.py: even gaps, not trio's 1 ms timer)

BODY = b"x" * 100
DEST = "queue://bench.throughput"
#: ActiveMQ Classic 5.17.2, one broker, persistent sync sends (KahaDB, fsync always),
#: 100-byte messages, Java JMS client, same 2-vCPU machine.  Source: issue #14's
#: side-by-side table (anchors/treefed-vs-activemq/results/tables.md, best repetition).
ACTIVEMQ_SINGLE_P_SYNC = 3_508


#: ``--idle-poll-us``: the broker's ``[broker] idle_poll_us`` and the clients'
#: ``idle_poll_us`` (transport/idlepoll.py), passed to the spawned processes in the
#: environment; 0 (the default) = off, as a broker and a client are by default
IDLE_POLL_ENV = "TREEFED_BENCH_IDLE_POLL_US"


def _idle_poll_us() -> int:
    return int(os.environ.get(IDLE_POLL_ENV, "0"))


# --------------------------------------------------------------------------- processes

def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _ctx_switches(pid: int) -> int:
    """Context switches (voluntary + involuntary) of every thread of ``pid`` so far;
    0 where /proc is missing."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/status") as status:
                for line in status:   # voluntary_ctxt_switches, nonvoluntary_...
                    if "ctxt_switches:" in line:
                        total += int(line.split()[1])
    except OSError:
        return 0
    return total


def _broker_proc(data_dir: str, ready: mp.Queue, ctl: Connection) -> None:
    """The broker under test; answers each request on ``ctl`` (its end of a Pipe) with
    its CPU seconds and stops at ``None``.  It waits for ``ctl`` to become readable
    instead of polling it: a 10 ms poll here woke the broker 100 times a second, and
    those wake-ups overlapped 4x more of the latency phase's slowest 1 % than of its
    messages as a whole (issue #14; the real broker, ``treefed broker``, has no such
    timer)."""
    import trio

    from treefed.config import parse_config
    from treefed.log import configure_logging
    from treefed.node import BrokerNode, gcwatch
    from treefed.persistence import SqliteStore

    configure_logging("warning")
    config = parse_config({"broker": {"id": "bench", "data_dir": data_dir,
                                      "listen": ["tcp://127.0.0.1:0"],
                                      "heartbeat_interval": 0.0,
                                      "idle_poll_us": _idle_poll_us()},
                           "logging": {"level": "warning"}})
    store = SqliteStore(data_dir)

    async def serve() -> None:
        node = BrokerNode(config, store=store)
        async with trio.open_nursery() as nursery:
            addresses = await nursery.start(node.serve)
            # as the broker process does once it serves (node/run.py, node/gcwatch.py)
            gcwatch.freeze_start_up()
            gcwatch.watch()
            ready.put(addresses[0][1])
            while True:
                await trio.lowlevel.wait_readable(ctl.fileno())
                request = ctl.recv()
                if request is None:
                    break
                ctl.send(gcwatch.statistics() if request == "gc" else
                         [node.early_held, node.early_cancelled] if request == "early"
                         else _cpu())
            nursery.cancel_scope.cancel()

    trio.run(serve)
    store.close()


def _relay_proc(ready: mp.Queue, result: mp.Queue) -> None:
    """Bare relay: the consumer connects first, then the producer; every frame from the
    producer is decoded and re-encoded to the consumer, a whole received batch per write.
    Reports its CPU seconds from the producer's arrival to its end of stream."""
    import trio

    from treefed.transport.framed import FramedStream

    async def relay() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        ready.put(listeners[0].socket.getsockname()[1])
        consumer = FramedStream(await listeners[0].accept())
        producer = FramedStream(await listeners[0].accept())
        cpu = _cpu()
        try:
            while True:
                await consumer.send_frames(await producer.receive_frames())
        except (trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        result.put(("relay_cpu", _cpu() - cpu))

    trio.run(relay)


def _relay_consumer(port: int, count: int, ready: mp.Queue, result: mp.Queue,
                    latency: bool) -> None:
    import trio

    from treefed.transport.framed import FramedStream

    async def consume() -> None:
        stream = FramedStream(await trio.open_tcp_stream("127.0.0.1", port))
        if latency:
            pacing.settle_heap()   # its collector walks only what the phase makes
        ready.put("ok")
        cpu = _cpu()
        got = 0
        lat: list[float] = []
        while got < count:
            frames = await stream.receive_frames()
            if latency:
                now = time.monotonic()
                lat += [now - f.headers["t"] for f in frames]
            got += len(frames)
        result.put(("end", time.monotonic()))
        result.put(("consumer_cpu", _cpu() - cpu))
        if latency:
            result.put(("latency", lat))
        await stream.aclose()

    trio.run(consume)


def _relay_producer(port: int, count: int, rate: float, result: mp.Queue) -> None:
    import trio

    from treefed.transport.framed import FramedStream
    from treefed.wire.frames import Send

    async def produce() -> None:
        stream = FramedStream(await trio.open_tcp_stream("127.0.0.1", port))
        if rate:
            pacing.settle_heap()   # its collector walks only what the phase makes
        result.put(("start", time.monotonic()))
        cpu = _cpu()
        if rate:
            t0 = time.monotonic()   # pacing's clock
            for i in range(count):
                await pacing.sleep_until(t0 + i / rate)
                await stream.send_frames([Send(DEST, f"p:{i}", {"t": time.monotonic()},
                                               BODY)])
        else:
            batch = 256
            for i in range(0, count, batch):
                await stream.send_frames([Send(DEST, f"p:{j}", {}, BODY)
                                          for j in range(i, min(i + batch, count))])
        result.put(("producer_cpu", _cpu() - cpu))
        await trio.sleep(1)
        await stream.aclose()

    trio.run(produce)


def _consumer(uri: str, count: int, ready: mp.Queue, result: mp.Queue,
              latency: bool) -> None:
    import trio

    from treefed.client import connect

    async def consume() -> None:
        async with connect(uri, client_id="bench-consumer",
                           idle_poll_us=_idle_poll_us()) as conn:
            sub = await conn.subscribe(DEST, prefetch=1000)
            if latency:
                pacing.settle_heap()   # its collector walks only what the phase makes
            ready.put("ok")
            cpu = _cpu()
            lat: list[float] = []
            got = 0
            while got < count:
                msg = await sub.receive()
                if latency:
                    lat.append(time.monotonic() - msg.headers["t"])
                msg.ack_nowait()
                got += 1
            result.put(("end", time.monotonic()))
            result.put(("consumer_cpu", _cpu() - cpu))
            if latency:
                result.put(("latency", lat))

    trio.run(consume)


def _sync_producer(uri: str, count: int, result: mp.Queue, dest: str = DEST) -> None:
    """Persistent sends one at a time: each waits for its receipt."""
    import trio

    from treefed.client import connect

    async def produce() -> None:
        async with connect(uri, client_id="bench-sync-producer",
                           idle_poll_us=_idle_poll_us()) as conn:
            result.put(("start", time.monotonic()))
            cpu = _cpu()
            rtt = []
            for _ in range(count):
                began = time.monotonic()
                await conn.send(dest, BODY, persistent=True)
                rtt.append(time.monotonic() - began)
            result.put(("confirmed", time.monotonic()))
            result.put(("rtt", rtt))
            result.put(("producer_cpu", _cpu() - cpu))

    trio.run(produce)


def _producer(uri: str, count: int, persistent: bool, rate: float, result: mp.Queue) -> None:
    import trio

    from treefed.client import connect

    async def produce() -> None:
        async with connect(uri, client_id="bench-producer",
                           idle_poll_us=_idle_poll_us()) as conn:
            if rate:
                pacing.settle_heap()   # its collector walks only what the phase makes
            result.put(("start", time.monotonic()))
            cpu = _cpu()
            if rate:
                t0 = time.monotonic()   # pacing's clock
                for i in range(count):
                    await pacing.sleep_until(t0 + i / rate)
                    await conn.send(DEST, BODY, headers={"t": time.monotonic()})
            else:
                for _ in range(count):
                    await conn.send(DEST, BODY, persistent=persistent, confirm=False)
            if persistent:
                await conn.wait_confirmed()
                result.put(("confirmed", time.monotonic()))
            await conn.flush()
            result.put(("producer_cpu", _cpu() - cpu))

    trio.run(produce)


# --------------------------------------------------------------------------- runs

def _collect(result: mp.Queue, keys: set[str], timeout: float = 300.0) -> dict:
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


def run_relay(ctx: mp.context.BaseContext, count: int, *, rate: float = 0.0) -> dict:
    ready, result = ctx.Queue(), ctx.Queue()
    relay = ctx.Process(target=_relay_proc, args=(ready, result))
    relay.start()
    port = ready.get(timeout=30)
    consumer = ctx.Process(target=_relay_consumer,
                           args=(port, count, ready, result, bool(rate)))
    consumer.start()
    ready.get(timeout=30)
    producer = ctx.Process(target=_relay_producer, args=(port, count, rate, result))
    producer.start()
    got = _collect(result, {"start", "end", "relay_cpu", "producer_cpu", "consumer_cpu"}
                   | ({"latency"} if rate else set()))
    _finish(consumer, producer, relay)
    return got


class BrokerUnderTest:
    """The broker process, with its CPU seconds readable between phases."""

    def __init__(self, ctx: mp.context.BaseContext, data_dir: str) -> None:
        self.ready = ctx.Queue()
        self.ctl, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=_broker_proc, args=(data_dir, self.ready, theirs))
        self.proc.start()
        self.uri = f"tcp://127.0.0.1:{self.ready.get(timeout=60)}"

    def cpu(self) -> float:
        return self._ask("cpu")

    def gc(self) -> dict:
        """The broker's collector (node/gcwatch.py): passes per generation, pauses."""
        return self._ask("gc")

    def early(self) -> list[int]:
        """Batches held for their consumers' acks so far, and messages consumed before
        their commit (node/node.py ``EARLY_PROBE_S``)."""
        return self._ask("early")

    def _ask(self, what: str) -> Any:
        self.ctl.send(what)
        if not self.ctl.poll(30):
            raise TimeoutError("the broker under test did not answer")
        return self.ctl.recv()

    def close(self) -> None:
        try:
            self.ctl.send(None)
        except OSError:   # already gone
            pass
        _finish(self.proc)


def run_broker_phase(ctx: mp.context.BaseContext, broker: BrokerUnderTest, count: int, *,
                     persistent: bool = False, rate: float = 0.0) -> dict:
    ready, result = ctx.Queue(), ctx.Queue()
    consumer = ctx.Process(target=_consumer,
                           args=(broker.uri, count, ready, result, bool(rate)))
    consumer.start()
    ready.get(timeout=30)
    cpu = broker.cpu()
    producer = ctx.Process(target=_producer,
                           args=(broker.uri, count, persistent, rate, result))
    producer.start()
    keys = {"start", "end", "producer_cpu", "consumer_cpu"} \
        | ({"confirmed"} if persistent else set()) \
        | ({"latency"} if rate else set())
    got = _collect(result, keys)
    got["broker_cpu"] = broker.cpu() - cpu
    _finish(producer, consumer)
    return got


def run_lone_phase(ctx: mp.context.BaseContext, broker: BrokerUnderTest, count: int) -> dict:
    """Persistent sends one at a time with no consumer: one commit per message."""
    result = ctx.Queue()
    cpu = broker.cpu()
    producer = ctx.Process(target=_sync_producer,
                           args=(broker.uri, count, result, DEST + ".lone"))
    producer.start()
    got = _collect(result, {"start", "confirmed", "rtt", "producer_cpu"})
    got["broker_cpu"] = broker.cpu() - cpu
    _finish(producer)
    return got


def run_sync_phase(ctx: mp.context.BaseContext, broker: BrokerUnderTest, count: int) -> dict:
    ready, result = ctx.Queue(), ctx.Queue()
    consumer = ctx.Process(target=_consumer, args=(broker.uri, count, ready, result, False))
    consumer.start()
    ready.get(timeout=30)
    cpu = broker.cpu()
    held, cancelled = broker.early()
    producer = ctx.Process(target=_sync_producer, args=(broker.uri, count, result))
    producer.start()
    got = _collect(result, {"start", "end", "confirmed", "rtt", "producer_cpu",
                            "consumer_cpu"})
    got["broker_cpu"] = broker.cpu() - cpu
    held2, cancelled2 = broker.early()
    got["held"], got["cancelled"] = held2 - held, cancelled2 - cancelled
    _finish(producer, consumer)
    return got


def _quantiles_ms(samples: list[float]) -> tuple[float, float]:
    # the first tenth is warm-up (connections, caches)
    q = statistics.quantiles(sorted(samples[len(samples) // 10:]), n=100,
                             method="inclusive")
    return round(q[49] * 1000, 3), round(q[98] * 1000, 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000,
                        help="messages per throughput phase")
    parser.add_argument("--latency-seconds", type=float, default=5.0)
    parser.add_argument("--sync-count", type=int, default=10_000,
                        help="persistent messages sent one at a time")
    parser.add_argument("--rounds", type=int, default=3,
                        help="relay / non-persistent broker phases, alternated; medians "
                             "are reported (a shared machine's load drifts)")
    parser.add_argument("--idle-poll-us", type=int, default=0,
                        help="the broker's and the clients' idle_poll_us (default 0: off)")
    args = parser.parse_args(argv)
    os.environ[IDLE_POLL_ENV] = str(args.idle_poll_us)   # for the spawned processes
    ctx = mp.get_context("spawn")
    n = args.count
    lat_count = int(1000 * args.latency_seconds)

    with tempfile.TemporaryDirectory(prefix="treefed-bench-") as data_dir:
        broker = BrokerUnderTest(ctx, data_dir)
        try:
            # relay and broker phases alternate, so a neighbour's load that comes or goes
            # during the run hits both; each round gives its own ratio
            rounds = []
            for _ in range(max(1, args.rounds)):
                relay_round = run_relay(ctx, n)
                np_round = run_broker_phase(ctx, broker, n)
                rounds.append((relay_round, np_round))
            pp = run_broker_phase(ctx, broker, n, persistent=True)
            # the disk's floor, before and after the one-at-a-time phases (it drifts)
            floor_n = min(500, max(50, args.sync_count // 4))
            floors = [disk_floor.measure(data_dir, floor_n)]
            hop_n = max(200, min(1500, args.sync_count // 2))
            hops = [hop_floor.measure(hop_n)]   # before and after too: wake-ups drift
            sp = run_sync_phase(ctx, broker, args.sync_count)
            lone = run_lone_phase(ctx, broker, args.sync_count)
            floors.append(disk_floor.measure(data_dir, floor_n))
            hops = hop_floor.combine([*hops, hop_floor.measure(hop_n)])
            gc0 = broker.gc()
            switches = _ctx_switches(broker.proc.pid)
            lp = run_broker_phase(ctx, broker, lat_count, rate=1000.0)
            switches = _ctx_switches(broker.proc.pid) - switches
            gc1 = broker.gc()
        finally:
            broker.close()
    relay_p50, relay_p99 = _quantiles_ms(run_relay(ctx, lat_count, rate=1000.0)["latency"])

    relay_rates = [n / (r["end"] - r["start"]) for r, _ in rounds]
    broker_rates = [n / (b["end"] - b["start"]) for _, b in rounds]
    ratios = [b / r for r, b in zip(relay_rates, broker_rates)]
    # the round whose ratio is the median supplies the CPU figures
    middle = sorted(range(len(rounds)), key=ratios.__getitem__)[len(rounds) // 2]
    relay, np = rounds[middle]
    relay_rate = statistics.median(relay_rates)
    nonpersistent = statistics.median(broker_rates)
    persistent = n / (pp["confirmed"] - pp["start"])
    p50, p99 = _quantiles_ms(lp["latency"])
    relay_cpu = relay["relay_cpu"] / n * 1e6
    broker_cpu = np["broker_cpu"] / n * 1e6
    figures = {
        "bench": "broker_throughput",
        "count": n,
        "body_bytes": len(BODY),
        "cpus": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "idle_poll_us": args.idle_poll_us,
        "baseline_relay_msgs_per_s": round(relay_rate),
        "nonpersistent_msgs_per_s": round(nonpersistent),
        "nonpersistent_over_baseline": round(statistics.median(ratios), 3),
        "rounds": [{"relay_msgs_per_s": round(r), "nonpersistent_msgs_per_s": round(b),
                    "ratio": round(b / r, 3)}
                   for r, b in zip(relay_rates, broker_rates)],
        "persistent_msgs_per_s": round(persistent),
        "persistent_delivered_msgs_per_s": round(n / (pp["end"] - pp["start"])),
        "persistent_sync_msgs_per_s": round(args.sync_count / (sp["confirmed"] - sp["start"])),
        "persistent_sync_rtt_p50_ms": _quantiles_ms(sp["rtt"])[0],
        "persistent_sync_rtt_p99_ms": _quantiles_ms(sp["rtt"])[1],
        # delivered before the commit, then acked before it: never written (issue #14)
        "persistent_sync_consumed_before_commit": round(sp["cancelled"] / args.sync_count,
                                                        3),
        "persistent_sync_held_batches": sp["held"],
        "broker_cpu_us_per_msg_persistent_sync": round(
            sp["broker_cpu"] / args.sync_count * 1e6, 2),
        "producer_cpu_us_per_msg_persistent_sync": round(
            sp["producer_cpu"] / args.sync_count * 1e6, 2),
        "persistent_sync_lone_msgs_per_s": round(
            args.sync_count / (lone["confirmed"] - lone["start"])),
        "persistent_sync_lone_rtt_p50_ms": _quantiles_ms(lone["rtt"])[0],
        "persistent_sync_lone_rtt_p99_ms": _quantiles_ms(lone["rtt"])[1],
        "broker_cpu_us_per_msg_persistent_sync_lone": round(
            lone["broker_cpu"] / args.sync_count * 1e6, 2),
        "producer_cpu_us_per_msg_persistent_sync_lone": round(
            lone["producer_cpu"] / args.sync_count * 1e6, 2),
        **disk_floor.combine(floors),
        **hops,
        # against what four loopback hops between bare processes allow (bench/hop_floor.py)
        "persistent_sync_lone_cap_msgs_per_s": hop_floor.commit_cap(
            hops["hop_trio_us"], disk_floor.combine(floors)["sqlite_commit_p50_ms"]),
        "persistent_sync_over_hop_cap": round(
            args.sync_count / (sp["confirmed"] - sp["start"])
            / hops["sync_consumer_cap_msgs_per_s"], 3),
        "activemq_single_p_sync_msgs_per_s": ACTIVEMQ_SINGLE_P_SYNC,
        "p50_ms_at_1000": p50,
        "p99_ms_at_1000": p99,
        # the broker's GC passes per 1,000 messages of the latency phase, per generation,
        # and its longest pause per generation over the whole run (counts: load-proof)
        "broker_gc_passes_per_1000_at_1000": [
            round((b - a) / lat_count * 1000, 2)
            for a, b in zip(gc0["passes"], gc1["passes"])],
        "broker_gc_pause_max_ms": gc1["pause_max_ms"],
        "broker_cpu_us_per_msg_at_1000": round(lp["broker_cpu"] / lat_count * 1e6, 1),
        "producer_cpu_us_per_msg_at_1000": round(lp["producer_cpu"] / lat_count * 1e6, 1),
        "consumer_cpu_us_per_msg_at_1000": round(lp["consumer_cpu"] / lat_count * 1e6, 1),
        "broker_ctx_switches_per_msg_at_1000": round(switches / lat_count, 2),
        "baseline_p50_ms_at_1000": relay_p50,
        "baseline_p99_ms_at_1000": relay_p99,
        "relay_cpu_us_per_msg": round(relay_cpu, 2),
        "broker_cpu_us_per_msg_nonpersistent": round(broker_cpu, 2),
        "broker_cpu_us_per_msg_persistent": round(pp["broker_cpu"] / n * 1e6, 2),
        "cpu_ratio_relay_over_broker": round(relay_cpu / broker_cpu, 3),
        # the three processes share 2 CPUs: the whole path's CPU bounds the throughput
        "relay_path_cpu_us_per_msg": round(
            (relay["producer_cpu"] + relay["relay_cpu"] + relay["consumer_cpu"]) / n * 1e6, 2),
        "broker_path_cpu_us_per_msg": round(
            (np["producer_cpu"] + np["broker_cpu"] + np["consumer_cpu"]) / n * 1e6, 2),
        "producer_cpu_us_per_msg": round(np["producer_cpu"] / n * 1e6, 2),
        "consumer_cpu_us_per_msg": round(np["consumer_cpu"] / n * 1e6, 2),
        "relay_producer_cpu_us_per_msg": round(relay["producer_cpu"] / n * 1e6, 2),
        "relay_consumer_cpu_us_per_msg": round(relay["consumer_cpu"] / n * 1e6, 2),
    }
    # The throughput ratio with the CPU taken out: what it would be if the whole path
    # were CPU-bound; on a loaded machine the broker's credit round trips cost more.
    figures["path_cpu_ratio_relay_over_broker"] = round(
        figures["relay_path_cpu_us_per_msg"] / figures["broker_path_cpu_us_per_msg"], 3)
    cap = figures["sqlite_commit_cap_msgs_per_s"] or 0
    for key in ("persistent_sync", "persistent_sync_lone"):
        figures[f"{key}_over_sqlite_floor"] = (
            round(figures[f"{key}_msgs_per_s"] / cap, 3) if cap else None)
    figures["targets_met"] = {
        "nonpersistent_ge_half_baseline": figures["nonpersistent_over_baseline"] >= 0.5,
        "persistent_ge_10000": persistent >= 10_000,
        "p99_lt_5ms": p99 < 5.0,
        "persistent_sync_ge_2x_activemq": args.sync_count / (sp["confirmed"] - sp["start"])
        >= 2 * ACTIVEMQ_SINGLE_P_SYNC,
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
