"""The loopback's own floor for a message that crosses processes one at a time.

A persistent message sent one at a time costs a round trip of hops between processes:
with a consumer whose ack the receipt waits for (concurrent store and dispatch,
node/node.py), four — the send, the Deliver, the consumer's ack, the receipt — and with
no consumer two plus the commit.  Each hop is a loopback write, a wake-up of the
process that sleeps on the other end and its read.  ``measure()`` times, on this
machine, what such a hop costs with no broker at all, so a broker's one-at-a-time
figure can be read against what any program in this language could do here
(issue #14):

* ``hop_blocking_us`` — one way of a 100-byte ping-pong between two Python processes
  over TCP loopback (TCP_NODELAY, blocking reads): the median round trip / 2;
* ``hop_trio_us`` — the same with both ends on trio, reading as treefed's framed stream
  does (wait until readable, then ``os.read``; ``os.write``): the stack's own hop;
* ``write_sleeping_peer_us`` / ``write_busy_peer_us`` — the median time of the
  ``os.write`` itself when the peer sleeps in ``epoll_wait`` and when it polls without
  sleeping: what the writer pays for waking the other process (on a virtual machine,
  an inter-processor interrupt through the hypervisor);
* ``sync_consumer_cap_msgs_per_s`` — 1 / (4 × ``hop_trio_us``): the most one-at-a-time
  sends a second with a consumer could reach if the broker, the producer and the
  consumer did no work at all; ``commit_cap()`` gives the same for a receipt that waits
  for a commit between two hops (a lone sender; the first broker of a chain).

Every figure is the median of ``rounds`` alternated runs (the two hops, then the two
writes).  On a shared machine the wake-up cost drifts with the neighbours: read a
broker's figure as a ratio to the floor measured in the same run.

    python bench/hop_floor.py [--count N] [--rounds R]      # one JSON line
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import select
import socket
import statistics
import sys
import time

BODY = b"x" * 100
#: hops of a one-at-a-time persistent send whose receipt waits for the consumer's ack
SYNC_CONSUMER_HOPS = 4


# ------------------------------------------------------------------ peer processes

def _listen() -> socket.socket:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    return listener


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _echo(port: int, mode: str) -> None:
    """The far end: echo every read until the peer closes.  ``mode``: "blocking"
    (blocking reads), "trio" (wait_readable + os.read, as transport/framed.py),
    "sleep" (epoll_wait before every read), "busy" (non-blocking reads in a loop)."""
    sock = _connect(port)
    fd = sock.fileno()
    if mode == "trio":
        import trio

        async def loop() -> None:
            sock.setblocking(False)
            while True:
                await trio.lowlevel.wait_readable(sock)
                data = os.read(fd, 65536)
                if not data:
                    return
                os.write(fd, data)

        trio.run(loop)
    elif mode == "blocking":
        while True:
            data = sock.recv(65536)
            if not data:
                return
            sock.sendall(data)
    else:
        sock.setblocking(False)
        poller = select.epoll()
        poller.register(fd, select.EPOLLIN)
        while True:
            if mode == "sleep":
                poller.poll(-1)
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not data:
                return
            os.write(fd, data)
    sock.close()


def _start_peer(ctx: mp.context.BaseContext, mode: str) -> tuple:
    """An ``_echo(mode)`` process and this end's connected socket to it."""
    listener = _listen()
    peer = ctx.Process(target=_echo, args=(listener.getsockname()[1], mode), daemon=True)
    peer.start()
    sock, _ = listener.accept()
    listener.close()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return peer, sock


def _ping(ctx: mp.context.BaseContext, mode: str, count: int) -> list[float]:
    """``count`` round trips against an ``_echo(mode)`` peer; for "trio" this end runs
    on trio too.  Returns each round trip (s)."""
    peer, sock = _start_peer(ctx, mode)
    fd = sock.fileno()
    clock = time.perf_counter
    rtts: list[float] = []
    try:
        if mode == "trio":
            import trio

            async def loop() -> None:
                sock.setblocking(False)
                for _ in range(count):
                    began = clock()
                    os.write(fd, BODY)
                    got = 0
                    while got < len(BODY):   # the echo may come back in pieces
                        await trio.lowlevel.wait_readable(sock)
                        got += len(os.read(fd, 65536))
                    rtts.append(clock() - began)

            trio.run(loop)
        else:
            for _ in range(count):
                began = clock()
                sock.sendall(BODY)
                got = 0
                while got < len(BODY):
                    got += len(sock.recv(65536))
                rtts.append(clock() - began)
    finally:
        sock.close()
        peer.join(10)
    return rtts


def _writes(ctx: mp.context.BaseContext, mode: str, count: int) -> list[float]:
    """``count`` timed ``os.write`` calls of 100 bytes to a peer that sleeps ("sleep")
    or polls ("busy"); each waits for the echo before the next."""
    peer, sock = _start_peer(ctx, mode)
    fd = sock.fileno()
    clock = time.perf_counter
    took: list[float] = []
    try:
        for _ in range(count):
            time.sleep(0.0002)   # the peer goes back to its wait (sleep) or loop (busy)
            began = clock()
            os.write(fd, BODY)
            took.append(clock() - began)
            got = 0
            while got < len(BODY):
                got += len(os.read(fd, 65536))
    finally:
        sock.close()
        peer.join(10)
    return took


# ------------------------------------------------------------------ the figures

def summarize(rounds: list[dict[str, list[float]]]) -> dict:
    """The JSON figures from alternated rounds of raw timings (seconds): per round the
    median of each series, then the median over rounds.  Pure."""
    def per_round(key: str, scale: float) -> float:
        return statistics.median(statistics.median(r[key]) * scale for r in rounds)

    hop_blocking = per_round("blocking", 1e6 / 2)
    hop_trio = per_round("trio", 1e6 / 2)
    return {
        "hop_blocking_us": round(hop_blocking, 1),
        "hop_trio_us": round(hop_trio, 1),
        "write_sleeping_peer_us": round(per_round("sleep", 1e6), 1),
        "write_busy_peer_us": round(per_round("busy", 1e6), 1),
        "sync_consumer_cap_msgs_per_s": round(1e6 / (SYNC_CONSUMER_HOPS * hop_trio)),
        "hop_rounds": len(rounds),
    }


def measure(count: int = 2000, rounds: int = 3) -> dict:
    """Alternate the four measurements ``rounds`` times (``count`` each) and summarise."""
    ctx = mp.get_context("spawn")
    raw = []
    for i in range(max(1, rounds)):
        order = ["blocking", "trio"] if i % 2 == 0 else ["trio", "blocking"]
        got = {mode: _ping(ctx, mode, count) for mode in order}
        writes = ["sleep", "busy"] if i % 2 == 0 else ["busy", "sleep"]
        got.update({mode: _writes(ctx, mode, max(1, count // 4)) for mode in writes})
        raw.append(got)
    return summarize(raw)


def commit_cap(hop_us: float, commit_ms: float, hops: int = 2) -> int:
    """The most one-at-a-time sends a second whose receipt waits for one commit
    (``commit_ms``, e.g. bench/disk_floor.py's SQLite commit) between ``hops`` hops of
    ``hop_us`` each -- a lone sender's send and receipt -- with no other work.  Pure."""
    return round(1e6 / (hops * hop_us + commit_ms * 1e3))


def combine(runs: list[dict]) -> dict:
    """Several ``measure`` results as one: each time averaged, the cap recomputed."""
    out = {key: round(statistics.fmean(r[key] for r in runs), 1)
           for key in ("hop_blocking_us", "hop_trio_us", "write_sleeping_peer_us",
                       "write_busy_peer_us")}
    out["sync_consumer_cap_msgs_per_s"] = round(
        1e6 / (SYNC_CONSUMER_HOPS * out["hop_trio_us"]))
    out["hop_rounds"] = sum(r["hop_rounds"] for r in runs)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000, help="round trips per run")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps({"bench": "hop_floor", "cpus": os.cpu_count(),
                      "loadavg_1m": round(os.getloadavg()[0], 2),
                      **measure(args.count, args.rounds)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
