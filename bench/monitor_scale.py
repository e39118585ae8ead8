"""Monitoring figures (issue #16): /metrics on a broker holding many demand entries, and
the RSS the monitor costs.

What it measures (one JSON line on stdout):

* A BrokerNode with ``[monitor]`` on gets ``--demand`` demand entries (default 100,000):
  a raw mesh peer on loopback TCP advertises that many consumers, each on its own queue
  (the worst case for per-destination series: the cardinality cap keeps 500).  Then, in
  alternating rounds, a real HTTP client (httpx, another thread's event loop is not
  needed: the client runs in the same process but over TCP) times GET /metrics and the
  same-run baseline GET /healthz (the HTTP round trip with no work); medians are given
  and ``metrics_over_healthz`` is the median of the rounds' ratios.  Also: the scrape's
  size, the series count (parsed by prometheus_client), /demandz?limit=1000 and /linkz.
* RSS: two idle ``treefed broker`` processes, one without and one with ``[monitor]``
  (after 20 scrapes), VmRSS read from /proc.

    python bench/monitor_scale.py [--demand N] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from treefed.config import parse_config  # noqa: E402
from treefed.node import BrokerNode  # noqa: E402
from treefed.transport.framed import FramedStream  # noqa: E402
from treefed.wire.codec import encode_many  # noqa: E402
from treefed.wire.frames import PROTOCOL_VERSION, Advisory, Hello  # noqa: E402


def uptime() -> str:
    return open("/proc/loadavg").read().split(" ", 3)[:3].__str__()


async def demand_broker(n: int, rounds: int, data_dir: str) -> dict:
    config = parse_config({
        "broker": {"id": "big", "data_dir": data_dir, "listen": ["tcp://127.0.0.1:0"],
                   "heartbeat_interval": 0.0},
        "logging": {"level": "warning"},
        "monitor": {"listen": "127.0.0.1:0"}})
    node = BrokerNode(config)
    out: dict = {"demand_entries": n}
    async with trio.open_nursery() as nursery:
        (host, port), = await nursery.start(node.serve)
        stream = await trio.open_tcp_stream(host, port)
        framed = FramedStream(stream)
        options = {"network_ttl": 1, "max_demand_per_link": n + 10,
                   "conduit_subscriptions": True}
        await framed.send_frames([Hello(PROTOCOL_VERSION, "broker", broker_id="peer",
                                        connector="mesh", node_type="mesh",
                                        link_name="bench", duplex=True,
                                        options=options)])
        await framed.receive_frames()   # its hello
        began = time.perf_counter()
        batch = 5000
        for start in range(0, n, batch):
            frames = [Advisory("add", f"peer/c{i}/s", f"queue://Q.{i}", "peer", None, 4,
                               []) for i in range(start, min(n, start + batch))]
            await stream.send_all(encode_many(frames))

        def loaded() -> bool:
            links = node.site.statistics()["links"]
            return bool(links) and links[0]["demand"] >= n

        while not loaded():
            await trio.sleep(0.1)
        out["load_seconds"] = round(time.perf_counter() - began, 2)
        base = node.monitor.uri
        times: dict[str, list[float]] = {"metrics": [], "healthz": [], "demandz": [],
                                         "linkz": [], "ratio": []}
        async with httpx.AsyncClient(timeout=60) as client:
            body = b""
            for _ in range(rounds):
                t = time.perf_counter()
                r = await client.get(f"{base}/healthz")
                h = time.perf_counter() - t
                t = time.perf_counter()
                r = await client.get(f"{base}/metrics")
                m = time.perf_counter() - t
                body = r.content
                times["healthz"].append(h)
                times["metrics"].append(m)
                times["ratio"].append(m / h)
                t = time.perf_counter()
                await client.get(f"{base}/demandz", params={"limit": 1000})
                times["demandz"].append(time.perf_counter() - t)
                t = time.perf_counter()
                await client.get(f"{base}/linkz")
                times["linkz"].append(time.perf_counter() - t)
        series = sum(len(f.samples) for f in text_string_to_metric_families(body.decode()))
        out.update({
            "metrics_ms": round(statistics.median(times["metrics"]) * 1000, 2),
            "healthz_ms": round(statistics.median(times["healthz"]) * 1000, 2),
            "metrics_over_healthz": round(statistics.median(times["ratio"]), 1),
            "demandz_1000_ms": round(statistics.median(times["demandz"]) * 1000, 2),
            "linkz_ms": round(statistics.median(times["linkz"]) * 1000, 2),
            "metrics_bytes": len(body), "metrics_series": series,
            "broker_rss_mb": round(int(open("/proc/self/statm").read().split()[1])
                                   * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)})
        await stream.aclose()
        nursery.cancel_scope.cancel()
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kb(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def monitor_rss(folder: Path) -> dict:
    """VmRSS of an idle broker process without and with the monitor (after scrapes)."""
    results = {}
    for monitored in (False, True):
        port = free_port()
        cfg = folder / f"b{int(monitored)}.toml"
        text = (f'[broker]\nid = "b{int(monitored)}"\ndata_dir = "{folder}/d{int(monitored)}"\n'
                f'listen = ["tcp://127.0.0.1:{port}"]\n[logging]\nlevel = "warning"\n')
        mport = free_port()
        if monitored:
            text += f'[monitor]\nlisten = "127.0.0.1:{mport}"\n'
        cfg.write_text(text)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.Popen([sys.executable, "-m", "treefed.cli", "broker", "--config",
                                 str(cfg)], env=env, stderr=subprocess.DEVNULL)
        try:
            subprocess.run([sys.executable, "-m", "treefed.cli", "wait",
                            f"tcp://127.0.0.1:{port}", "--timeout", "30"], env=env,
                           check=True)
            if monitored:
                with httpx.Client() as client:
                    for _ in range(20):
                        client.get(f"http://127.0.0.1:{mport}/metrics").raise_for_status()
            time.sleep(0.5)
            results["with_monitor_kb" if monitored else "without_monitor_kb"] = \
                rss_kb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(10)
    results["monitor_cost_kb"] = results["with_monitor_kb"] - results["without_monitor_kb"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--demand", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from treefed.log import configure_logging

    configure_logging("warning")
    with tempfile.TemporaryDirectory(prefix="issue16-") as folder:
        figures = trio.run(demand_broker, args.demand, args.rounds, folder)
        figures.update(monitor_rss(Path(folder)))
    figures["load"] = uptime()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
