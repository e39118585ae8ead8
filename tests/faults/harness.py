"""Fault-suite harness: a small estate of real ``treefed broker`` processes on loopback,
the faults we inflict on it, and a ledger that proves nothing was lost or duplicated.

Theory of operation
-------------------
``Estate(tmp_path, mode)`` writes one config per site with ``treefed.config.dump_config``
— HQ (the root, optionally a master/slave pair on one data directory), region ``r1``
(a branch) and stores ``s1`` (and ``s2``) — linked by tree connectors (``mode="tree"``)
or by duplex mesh connectors with ``network_ttl = 2`` (``mode="mesh"``: HQ <-> store
crosses two links).  Listen ports are fixed at generation time (bound to port 0 and
released), because a restarted broker must come back where its children and clients
look for it.  A store's uplink can run through a ``ProxyProcess`` so a test can cut or
black-hole it.  Reconnect back-off is shortened through the URI options (100 ms up to
1 s) so a link that returns is used within a second.

Readiness is observed, never assumed: a broker is *serving* once a client ``stat``
round trip succeeds, the estate is *linked* once every dialed connector reports
``operational`` and the consumers' interest has reached the producers' brokers (in tree
mode, a queue consumer above the producer is not advertised down: its message climbs,
so its own subscription is what counts, see ``Estate.climbs``).

``Ledger`` records every persistent send (its id ``<producer>:<seq>``, whether and when
it was confirmed or refused) and every delivery a consumer accepted (acked).
``Ledger.check()`` is the suite's verdict: every confirmed message accepted exactly once;
nothing accepted that was never sent; a message handed to an application a second time
carries the redelivered flag; per producer and destination the accepted sequence numbers
only grow.

``python -m tests.faults.harness consume URI DST --ack N`` is a consumer *process* that a
test can SIGKILL with unacknowledged messages in hand: it acks the first N deliveries,
proves the acks were processed with a stat round trip, prints one JSON line per delivery
and ``{"ready": ...}``, and then holds everything else.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import signal
import subprocess
import sys
import time
import tomllib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import trio

from treefed.client import ConnectionClosed, connect
from treefed.config import dump_config, parse_config
from treefed.errors import RemoteError, TreefedError
from treefed.transport.ports import free_port

from tests.faults.proxy import REPO_ROOT, ProxyProcess

__all__ = ["MODES", "Estate", "BrokerProc", "Ledger", "Producer", "Consumer",
           "ConsumerProcess", "free_port", "wait_until", "child_env"]

MODES = ("tree", "mesh")
#: back-off of every test link: fast enough that a returning link is used within a second
RECONNECT = "initialReconnectDelay=100&maxReconnectDelay=1000"


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


async def wait_until(predicate: Callable[[], Any], timeout: float, what: str,
                     interval: float = 0.02) -> Any:
    """Poll ``predicate`` (sync or async) until truthy; AssertionError naming ``what``."""
    deadline = trio.current_time() + timeout
    while True:
        value = predicate()
        if hasattr(value, "__await__"):
            value = await value
        if value:
            return value
        if trio.current_time() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await trio.sleep(interval)


# --------------------------------------------------------------------------- processes


class BrokerProc:
    """One ``python -m treefed.cli broker --config F`` child process."""

    def __init__(self, name: str, config_path: Path, log_path: Path, port: int) -> None:
        self.name = name
        self.config_path = config_path
        self.log_path = log_path
        self.port = port
        self.uri = f"tcp://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        """Spawn (does not wait: see ``wait_serving``)."""
        assert not self.alive, f"{self.name} is already running"
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f'{{"event": "harness.start", "n": {self.starts}}}\n'.encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "treefed.cli", "broker", "--config",
                 str(self.config_path)], stdout=log, stderr=log, env=child_env(),
                cwd=str(REPO_ROOT))

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL and reap: no flush, no bye, no cleanup of any kind."""
        if self.alive:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM; returns the exit status (raises if it does not exit in time)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    async def stat(self, timeout: float = 2.0) -> dict | None:
        """The broker's statistics, or None if it does not answer right now."""
        try:
            with trio.move_on_after(timeout):
                async with connect(f"{self.uri}", client_id="harness-stat") as conn:
                    return await conn.stat()
        except (TreefedError, OSError):
            return None
        return None

    async def wait_serving(self, timeout: float = 30.0) -> dict:
        """Until a client stat round trip succeeds; fails early if the process died."""
        async def serving() -> dict | None:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.proc.returncode}:\n"
                                     f"{self.log_tail()}")
            return await self.stat(timeout=1.0)

        return await wait_until(serving, timeout, f"{self.name} serving", interval=0.05)

    def events(self, name: str | None = None) -> list[dict]:
        """Parsed JSON log lines (optionally only events called ``name``)."""
        out = []
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return out
        for line in text.splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict) and (name is None or item.get("event") == name):
                out.append(item)
        return out

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(f"  [{self.name}] {line}" for line in text[-lines:])


class ConsumerProcess:
    """``python -m tests.faults.harness consume``: acks the first ``ack`` messages and
    holds the rest until it is killed."""

    def __init__(self, uri: str, dst: str, *, ack: int, prefetch: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.harness", "consume", uri, dst,
             "--ack", str(ack), "--prefetch", str(prefetch)],
            stdout=subprocess.PIPE, env=child_env(), cwd=str(REPO_ROOT))
        self.lines: list[dict] = []
        self._buffer = b""

    def read_until_ready(self, timeout: float = 30.0) -> dict:
        """Read its JSON lines up to ``{"ready": ...}`` (blocking; run in a thread)."""
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                item = json.loads(line)
                self.lines.append(item)
                if "ready" in item:
                    return item
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("consumer process never became ready")
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise AssertionError(f"consumer process ended: {self.proc.wait()}")
                self._buffer += chunk

    def kill(self) -> None:
        """SIGKILL (idempotent): whatever it holds unacked goes back to the broker."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        if not self.proc.stdout.closed:
            self.proc.stdout.close()


# --------------------------------------------------------------------------- estate


@dataclass
class _Site:
    name: str                       # also the broker id (a slave shares its master's)
    broker_id: str
    port: int
    data_dir: Path
    parent: str | None              # site name this one dials
    proxied: bool = False           # the uplink goes through a ProxyProcess
    node_type: str = "root"
    broker: dict = field(default_factory=dict)
    policies: list = field(default_factory=list)


class Estate:
    """HQ (optionally a master/slave pair), region r1, stores s1..sN, in one mode."""

    def __init__(self, tmp_path: Path, mode: str, *, stores: int = 1,
                 proxied: tuple[str, ...] = (), hq_slave: bool = False,
                 tree_options: dict | None = None,
                 heartbeat: float = 2.0, broker: dict[str, dict] | None = None,
                 policies: dict[str, list] | None = None) -> None:
        assert mode in MODES
        self.mode = mode
        self.tree_options = dict(tree_options or {})   # extra [tree_connector] keys
        self.root = tmp_path / mode
        self.root.mkdir(parents=True, exist_ok=True)
        broker = broker or {}
        policies = policies or {}
        sites = [_Site("hq", "hq", free_port(), self.root / "hq-data", None)]
        if hq_slave:
            sites.append(_Site("hq-slave", "hq", free_port(), self.root / "hq-data", None))
        sites.append(_Site("r1", "r1", free_port(), self.root / "r1-data", "hq",
                           node_type="branch"))
        for i in range(1, stores + 1):
            name = f"s{i}"
            sites.append(_Site(name, name, free_port(), self.root / f"{name}-data", "r1",
                               proxied=name in proxied, node_type="leaf"))
        for s in sites:
            s.broker = {"heartbeat_interval": heartbeat, **broker.get(s.name, {})}
            s.policies = policies.get(s.name, [])
        self.sites = {s.name: s for s in sites}
        self.proxies: dict[str, ProxyProcess] = {}
        self.brokers: dict[str, BrokerProc] = {}

    # -- addresses
    def uri(self, name: str) -> str:
        """Where a client of site ``name`` connects: failover over the HQ pair."""
        if name == "hq" and "hq-slave" in self.sites:
            return (f"failover:(tcp://127.0.0.1:{self.sites['hq'].port},"
                    f"tcp://127.0.0.1:{self.sites['hq-slave'].port})"
                    "?randomize=false&initialReconnectDelay=50&maxReconnectDelay=500")
        return f"tcp://127.0.0.1:{self.sites[name].port}"

    def _uplink(self, site: _Site) -> str:
        parent = self.sites[site.parent]
        ports = [parent.port]
        if site.parent == "hq" and "hq-slave" in self.sites:
            ports.append(self.sites["hq-slave"].port)
        if site.proxied:
            ports = [self.proxies[site.name].port]
        inner = ",".join(f"tcp://127.0.0.1:{p}" for p in ports)
        if self.mode == "tree" or len(ports) > 1:
            return f"failover:({inner})?randomize=false&{RECONNECT}"
        return f"static:({inner})?{RECONNECT}"

    def _config_text(self, site: _Site) -> str:
        doc: dict = {
            "broker": {"id": site.broker_id, "data_dir": str(site.data_dir),
                       "listen": [f"tcp://127.0.0.1:{site.port}"], **site.broker},
            "logging": {"level": "info", "file": str(self.root / f"{site.name}.log")},
        }
        if site.policies:
            doc["policy"] = site.policies
        if site.parent is not None:
            uri = self._uplink(site)
            if self.mode == "tree":
                doc["tree_connector"] = {"uri": uri, "node_type": site.node_type,
                                         **self.tree_options}
            else:
                doc["network_connector"] = [{"name": "up", "uri": uri, "duplex": True,
                                             "network_ttl": 2}]
        text = dump_config(parse_config(doc))
        parse_config(tomllib.loads(text))   # what we write must load
        return text

    # -- lifecycle
    async def start(self, *, link: bool = True, timeout: float = 40.0) -> None:
        """Proxies, then every broker at once; wait until all serve (and are linked)."""
        for site in self.sites.values():
            if site.proxied:
                parent = self.sites[site.parent]
                self.proxies[site.name] = await trio.to_thread.run_sync(
                    ProxyProcess, parent.port)
        for site in self.sites.values():
            path = self.root / f"{site.name}.toml"
            path.write_text(self._config_text(site), encoding="utf-8")
            proc = BrokerProc(site.name, path, self.root / f"{site.name}.log", site.port)
            self.brokers[site.name] = proc
        for name, proc in self.brokers.items():
            proc.start()
            if name == "hq" and "hq-slave" in self.brokers:
                # the master must win the lock: the slave starts once HQ serves
                await proc.wait_serving(timeout)
        for name, proc in self.brokers.items():
            if name != "hq-slave":
                await proc.wait_serving(timeout)
        if link:
            await self.wait_linked(timeout)

    async def wait_linked(self, timeout: float = 30.0, names: tuple[str, ...] | None = None,
                          ) -> None:
        """Until every dialed connector of the running brokers is operational."""
        todo = names or tuple(n for n in self.brokers if self.sites[n].parent is not None)

        async def linked() -> bool:
            for name in todo:
                stats = await self.brokers[name].stat()
                if stats is None or not stats.get("connectors") or any(
                        c["state"] != "operational" for c in stats["connectors"]):
                    return False
            return True

        await wait_until(linked, timeout, f"{self.mode} links of {', '.join(todo)}",
                         interval=0.05)

    def climbs(self, producer: str, consumer: str, dst: str) -> bool:
        """Tree mode, a queue, the consumer's broker an ancestor of the producer's: the
        message climbs (route_unknown_up) and no interest is advertised down for it."""
        if self.mode != "tree" or dst.startswith("topic://"):
            return False
        site = self.sites[producer].parent
        while site is not None:
            if self.sites[site].broker_id == self.sites[consumer].broker_id:
                return True
            site = self.sites[site].parent
        return False

    async def wait_demand(self, at: str, dst: str, timeout: float = 20.0) -> None:
        """Until broker ``at`` holds a consumer (local or network demand) for ``dst``."""
        async def present() -> bool:
            stats = await self.brokers[at].stat()
            return stats is not None and any(c["dst"] == dst for c in stats["consumers"])

        await wait_until(present, timeout, f"demand for {dst} at {at}", interval=0.05)

    async def stop(self) -> dict[str, int | None]:
        """SIGTERM everything still running (in parallel); returns exit statuses."""
        codes: dict[str, int | None] = {}
        running = [p for p in self.brokers.values() if p.alive]
        for p in running:
            p.proc.send_signal(signal.SIGTERM)
        for p in running:
            try:
                codes[p.name] = await trio.to_thread.run_sync(p.proc.wait, 20)
            except subprocess.TimeoutExpired:
                p.kill()
                codes[p.name] = None
        for proxy in self.proxies.values():
            await trio.to_thread.run_sync(proxy.stop)
        return codes

    def cleanup(self) -> None:
        """Kill whatever is left (teardown after a failure)."""
        for p in self.brokers.values():
            if p.alive:
                p.kill()
        for proxy in self.proxies.values():
            proxy.stop()

    def logs(self, lines: int = 25) -> str:
        return "\n".join(p.log_tail(lines) for p in self.brokers.values())

    async def dropped(self, reason: str) -> int:
        """Sum over the running brokers of core messages dropped for ``reason``."""
        total = 0
        for p in self.brokers.values():
            if p.alive:
                stats = await p.stat()
                if stats is not None:
                    total += stats.get("dropped", {}).get(reason, 0)
        return total


# --------------------------------------------------------------------------- workload


def seq_of(msg_id: str) -> tuple[str, int]:
    producer, _, seq = msg_id.rpartition(":")
    return producer, int(seq)


@dataclass
class Delivery:
    msg: str
    dst: str
    redelivered: int
    at: float                     # trio clock
    consumer: str
    acked: bool = True


class Ledger:
    """Sends and accepted deliveries of one run, and the exactly-once-in-order verdict."""

    def __init__(self) -> None:
        self.sent: dict[str, tuple[str, float]] = {}       # id -> (dst, when sent)
        self.confirmed: dict[str, float] = {}              # id -> when confirmed
        self.refused: dict[str, str] = {}                  # id -> error code
        self.deliveries: list[Delivery] = []

    # -- recording
    def record_delivery(self, d: Delivery) -> None:
        self.deliveries.append(d)

    def confirmed_between(self, start: float, end: float, dst: str | None = None) -> int:
        return sum(1 for m, t in self.confirmed.items() if start <= t < end
                   and (dst is None or self.sent[m][0] == dst))

    def accepted(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for d in self.deliveries:
            if d.acked:
                counts[d.msg] += 1
        return counts

    def all_confirmed_accepted(self) -> bool:
        got = self.accepted()
        return all(got.get(m, 0) >= 1 for m in self.confirmed)

    def last_acceptance(self, ids: set[str] | None = None) -> float:
        times = [d.at for d in self.deliveries if d.acked and (ids is None or d.msg in ids)]
        return max(times) if times else math.nan

    # -- the verdict
    def check(self) -> dict:
        """Raise AssertionError listing every violation; return summary figures."""
        problems: list[str] = []
        accepted = self.accepted()
        for msg_id in self.confirmed:
            n = accepted.get(msg_id, 0)
            if n != 1:
                problems.append(f"confirmed {msg_id} ({self.sent[msg_id][0]}) accepted "
                                f"{n} times")
        for msg_id, n in accepted.items():
            if msg_id not in self.sent:
                problems.append(f"{msg_id} accepted but never sent")
            elif n > 1 and msg_id not in self.confirmed:
                problems.append(f"unconfirmed {msg_id} accepted {n} times")
            if msg_id in self.refused:
                problems.append(f"{msg_id} was refused ({self.refused[msg_id]}) yet "
                                "delivered")
        seen: set[str] = set()
        silent_repeats = 0
        last: dict[tuple[str, str], int] = {}
        for d in self.deliveries:
            if d.msg in seen and not d.redelivered:
                silent_repeats += 1
                problems.append(f"{d.msg} handed to {d.consumer} again without the "
                                "redelivered flag")
            seen.add(d.msg)
            if not d.acked:
                continue
            producer, seq = seq_of(d.msg)
            key = (producer, d.dst)
            if seq <= last.get(key, 0):
                problems.append(f"out of order on {d.dst}: {d.msg} after "
                                f"{producer}:{last[key]}")
            last[key] = max(seq, last.get(key, 0))
        if problems:
            shown = "\n  ".join(problems[:20])
            more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
            raise AssertionError(f"{len(problems)} delivery violations:\n  {shown}{more}")
        return {"sent": len(self.sent), "confirmed": len(self.confirmed),
                "refused": len(self.refused), "accepted": sum(accepted.values()),
                "redelivered": sum(1 for d in self.deliveries if d.redelivered)}


class Producer:
    """Persistent sends to ``dst`` at ``rate`` per second, each awaiting its receipt,
    until ``stop`` is set or ``count`` were sent.  Refusals are recorded, not raised."""

    def __init__(self, ledger: Ledger, uri: str, dst: str, name: str, *,
                 rate: float = 50.0, count: int | None = None, body_size: int = 0,
                 ) -> None:
        self.ledger = ledger
        self.padding = "x" * body_size
        self.uri = uri
        self.dst = dst
        self.name = name
        self.rate = rate
        self.count = count
        self.stop = trio.Event()
        self.done = trio.Event()
        self.sent = 0
        self.refusals: list[str] = []

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        ledger = self.ledger
        try:
            async with connect(self.uri, client_id=self.name) as conn:
                task_status.started()
                start = trio.current_time()
                while not self.stop.is_set() and (self.count is None
                                                  or self.sent < self.count):
                    await trio.sleep_until(start + self.sent / self.rate)   # pacing
                    msg_id = conn.next_id()
                    ledger.sent[msg_id] = (self.dst, trio.current_time())
                    self.sent += 1
                    try:
                        await conn.send(self.dst, f"{self.name}#{self.sent}{self.padding}",
                                        persistent=True, msg_id=msg_id)
                    except RemoteError as exc:
                        ledger.refused[msg_id] = exc.code
                        self.refusals.append(exc.code)
                        continue
                    ledger.confirmed[msg_id] = trio.current_time()
        finally:
            self.done.set()


class Consumer:
    """Receives from ``dst`` and acks everything, recording each accepted delivery."""

    def __init__(self, ledger: Ledger, uri: str, dst: str, name: str, *,
                 prefetch: int = 100) -> None:
        self.ledger = ledger
        self.uri = uri
        self.dst = dst
        self.name = name
        self.prefetch = prefetch
        self.received = 0
        self.redelivered = 0
        self.reconnects = 0
        self.cancel = trio.CancelScope()

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with self.cancel:
            async with connect(self.uri, client_id=self.name) as conn:
                sub = await conn.subscribe(self.dst, prefetch=self.prefetch)
                task_status.started()
                record = self.ledger.record_delivery
                try:
                    while True:
                        msg = await sub.receive()
                        record(Delivery(msg.id, msg.dst, msg.redelivered,
                                        trio.current_time(), self.name))
                        self.received += 1
                        self.reconnects = conn.reconnects
                        if msg.redelivered:
                            self.redelivered += 1
                        msg.ack_nowait()
                except ConnectionClosed:
                    pass


# --------------------------------------------------------------------------- consume CLI


async def _consume_process(uri: str, dst: str, ack: int, prefetch: int) -> None:
    async with connect(uri, client_id="doomed-consumer") as conn:
        sub = await conn.subscribe(dst, prefetch=prefetch)
        held = []
        while len(held) < prefetch:
            msg = await sub.receive()
            acked = ack > 0
            if acked:
                ack -= 1
                msg.ack_nowait()
            else:
                held.append(msg)
            print(json.dumps({"id": msg.id, "redelivered": msg.redelivered,
                              "acked": acked}), flush=True)
        await conn.stat()     # its reply follows the acks: they were processed
        print(json.dumps({"ready": len(held)}), flush=True)
        await trio.sleep_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.harness")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("consume", help="ack N messages, hold the rest, wait to be killed")
    p.add_argument("uri")
    p.add_argument("dst")
    p.add_argument("--ack", type=int, default=0)
    p.add_argument("--prefetch", type=int, default=50)
    args = parser.parse_args(argv)
    trio.run(_consume_process, args.uri, args.dst, args.ack, args.prefetch)
    return 0


if __name__ == "__main__":
    sys.exit(main())


class Traffic:
    """Paced persistent producers and acking consumers over an estate.

    ``flows`` lists ``(producer site, consumer site, destination)``; one consumer per
    destination (so order per producer is observable), one producer per flow."""

    def __init__(self, estate: Estate, ledger: Ledger, flows: list[tuple[str, str, str]],
                 *, rate: float = 50.0, prefetch: int = 100,
                 uris: dict[str, str] | None = None) -> None:
        self.estate = estate
        self.uris = uris or {}          # site -> URI the clients use instead (a proxy)
        self.ledger = ledger
        self.flows = flows
        self.rate = rate
        self.prefetch = prefetch
        self.consumers: dict[str, Consumer] = {}
        self.producers: list[Producer] = []

    async def start(self, nursery: trio.Nursery, *, demand_timeout: float = 20.0) -> None:
        """Consumers first; producers once the interest reached their brokers."""
        for _, to_site, dst in self.flows:
            if dst not in self.consumers:
                c = Consumer(self.ledger, self.uri(to_site), dst, f"c-{to_site}",
                             prefetch=self.prefetch)
                self.consumers[dst] = c
                await nursery.start(c.run)
        for from_site, to_site, dst in self.flows:
            # tree: queue interest is not advertised down (issue 18 part 4), a message
            # for a consumer above climbs to it: ready once the consumer is subscribed
            at = to_site if self.estate.climbs(from_site, to_site, dst) else from_site
            await self.estate.wait_demand(at, dst, demand_timeout)
        for i, (from_site, _, dst) in enumerate(self.flows):
            p = Producer(self.ledger, self.uri(from_site), dst,
                         f"p{i}-{from_site}", rate=self.rate)
            self.producers.append(p)
            await nursery.start(p.run)

    def uri(self, site: str) -> str:
        return self.uris.get(site) or self.estate.uri(site)

    async def stop_producers(self, timeout: float = 30.0) -> None:
        for p in self.producers:
            p.stop.set()
        with trio.fail_after(timeout):
            for p in self.producers:
                await p.done.wait()

    async def drained(self, timeout: float) -> float:
        """Wait until every confirmed message was accepted; returns the trio time."""
        await wait_until(self.ledger.all_confirmed_accepted, timeout,
                         "every confirmed message to be delivered", interval=0.02)
        return trio.current_time()

    def stop_consumers(self) -> None:
        for c in self.consumers.values():
            c.cancel.cancel()
