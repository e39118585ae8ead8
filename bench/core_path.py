"""One broker's non-persistent path, in process and counted: bytecodes per message.

What it measures (one JSON line on stdout): the per-message work of the pure part of a
broker -- a producer's chunk of client-encoded Send frames through ``FrameDecoder``,
``Site.handle_frame`` and the core ``Broker`` (built from a config exactly as node.py
builds it), the Delivers encoded with ``encode_many``, and one cumulative ``Ack(upto)``
per chunk -- as **bytecodes executed per message**, in total and per function
(``sys.settrace`` opcode events over the measured chunks, after a warm-up).  No sockets,
no tasks, no timing: the count is the same on a quiet and on a loaded machine, so two
trees can be compared on a shared machine where wall-clock and CPU figures swing
(issue #14: the broker's CPU per message is spread over ~25 functions; this says which).

``--cpu`` adds the process CPU µs per message of an untraced pass (load-sensitive).  For
instructions, run it under ``valgrind --tool=callgrind`` with two ``--count`` values and
take the difference.

    python bench/core_path.py [--count N] [--chunk K] [--top T] [--headers] [--cpu]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from treefed.config import parse_config  # noqa: E402
from treefed.core.actions import Out  # noqa: E402
from treefed.core.broker import Broker  # noqa: E402
from treefed.federation.site import Site  # noqa: E402
from treefed.wire.codec import FrameDecoder, encode_many  # noqa: E402
from treefed.wire.frames import Ack, Send, Subscribe  # noqa: E402

DEST = "queue://bench.throughput"
BODY = b"x" * 100


def build(count: int, chunk: int, headers: bool) -> tuple[Site, list[bytes]]:
    config = parse_config({"broker": {"id": "bench", "data_dir": "unused",
                                      "listen": ["tcp://127.0.0.1:0"]},
                           "logging": {"level": "warning"}})
    b = config.broker
    broker = Broker(b.id, config.policy_set(), max_redeliveries=b.max_redeliveries,
                    dlq=b.dlq, log_messages=config.logging.message_events,
                    max_subscriptions_per_conn=b.max_subscriptions_per_connection,
                    max_inflight_per_conn=b.max_inflight_per_connection,
                    max_memory_bytes=b.max_memory_bytes,
                    idle_destination_seconds=b.idle_destination_seconds)
    site = Site(b.id, broker=broker, tree=None, accept_tree_children=True)
    now = time.time()
    site.client_connected("p", now)
    site.client_connected("c", now)
    site.handle_frame("c", Subscribe("s1", DEST, None, 1000), now)
    chunks = []
    for i in range(0, count, chunk):
        chunks.append(encode_many([
            Send(DEST, f"bench-producer-0123456789:{j}", {"ph": "np", "t": 1.5} if headers
                 else {}, BODY) for j in range(i, min(count, i + chunk))]))
    return site, chunks


def run(site: Site, chunks: list[bytes]) -> int:
    """Feed the chunks; the number of messages delivered."""
    decoder = FrameDecoder()
    delivered = 0
    for data in chunks:
        now = time.time()
        decoder.receive_data(data)
        actions: list = []
        for frame in decoder.frames():
            actions += site.handle_frame("p", frame, now)
        frames = [a.frame for a in actions if type(a) is Out]
        encode_many(frames)
        delivered += len(frames)
        site.handle_frame("c", Ack("s1", frames[-1].msg, True), now)
    return delivered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=2048, help="messages measured")
    parser.add_argument("--chunk", type=int, default=64, help="Send frames per chunk")
    parser.add_argument("--top", type=int, default=25, help="functions listed")
    parser.add_argument("--headers", action="store_true",
                        help='messages carry {"ph", "t"} headers (as the chain bench\'s)')
    parser.add_argument("--cpu", action="store_true", help="also time an untraced pass")
    args = parser.parse_args(argv)
    site, chunks = build(args.count * 2, args.chunk, args.headers)
    half = len(chunks) // 2
    run(site, chunks[:half])                   # warm-up: destination, dict sizes, caches
    counts: collections.Counter = collections.Counter()

    def opcode(frame, event, arg):  # noqa: ANN001
        if event == "opcode":
            code = frame.f_code
            counts[(code.co_filename, code.co_firstlineno, code.co_name)] += 1
        return opcode

    def call(frame, event, arg):  # noqa: ANN001
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return opcode

    sys.settrace(call)
    try:
        n = run(site, chunks[half:])
    finally:
        sys.settrace(None)
    root = str(Path(__file__).resolve().parent.parent) + "/"
    out = {
        "bench": "core_path",
        "messages": n,
        "chunk": args.chunk,
        "headers": args.headers,
        "bytecodes_per_msg": round(sum(counts.values()) / n, 1),
        "top": [[round(v / n, 1), f"{k[0].replace(root, '')}:{k[1]} {k[2]}"]
                for k, v in counts.most_common(args.top)],
    }
    if args.cpu:
        site, chunks = build(args.count * 2, args.chunk, args.headers)
        run(site, chunks[:half])
        t0 = time.process_time()
        run(site, chunks[half:])
        out["cpu_us_per_msg"] = round((time.process_time() - t0) / n * 1e6, 2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
