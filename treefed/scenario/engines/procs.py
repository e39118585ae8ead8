"""The procs engine: one ``treefed broker`` process per site, as deployed.

Theory of operation
-------------------
Each site gets a generated config (live.site_config, written with
``config.dump_config``), its own data directory (a real SqliteStore) and its own event
log file, and runs as ``python -m treefed.cli broker --config FILE``.  The runner process
holds everything else in one trio loop on the real clock:

* a TCP **proxy per link**: the child's connector dials the proxy, which connects to the
  child's *current* parent.  Cutting a link closes the proxied connections and holds new
  ones until the link is restored; a killed parent holds them until it is back;
  ``insert_layer`` re-points the proxy.  The brokers never know.
* one raw client (live.App) per site for the workload, reconnected after a restart;
* ``kill_broker`` is SIGKILL, ``restart_broker`` starts the same config again (same
  port, same data directory: confirmed persistent messages survive), the end of the run
  is SIGTERM (graceful shutdown) for all.

Time: brokers log epoch seconds; ``ts`` in the run's log is seconds since the engine
started.  After start-up the engine waits until the estate is quiet (no broker log grew
for ``QUIET_S``), and the plan's step times count from there; after a step that reshapes
the estate (cut, restore, kill, restart, insert) it waits for quiet again, so a step is
taken at its time or once the previous one has settled, whichever is later.  When the run is over the
brokers' logs are merged in time order and fed to the Recorder (kill notices interleaved
at their times), so the summary is computed exactly as for the other engines.  Meant for
estates of a few dozen sites: ``MAX_BROKERS``.

``estate=DIR`` runs the plan on a generated estate (``treefed estate generate``; the plan
from ``estate.scenario.estate_scenario``): each site starts from its own config in DIR
(``estate.sites.EstateSites`` moves only its listener, uplink -- to the proxy -- data and
log), so links are TLS with the estate's certificates end to end through the proxy, and
the workload clients log in over TLS as the estate's application users.  Before the plan
starts every link must be up within ``link_timeout`` seconds (with or without ``estate``),
else the run stops with what the brokers logged (a refused certificate, a failed login).
``workdir`` keeps the sites' configs, data and logs there instead of a temporary folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import trio

from treefed.config import dump_config
from treefed.errors import LocalError, RemoteError
from treefed.events import EVENTS
from treefed.scenario.engines.common import RUNNER, broker_info, run_fields, run_params
from treefed.scenario.engines.live import App, apply_traffic, site_config
from treefed.scenario.results import Recorder
from treefed.scenario.spec import Mode
from treefed.scenario.topology import BrokerSpec, Topology
from treefed.scenario.workload import Plan, PlannedConsumer, Step
from treefed.transport.ports import free_port
from treefed.transport.streams import open_tcp
from treefed.transport.uri import Endpoint

__all__ = ["ProcsEngine", "MAX_BROKERS", "QUIET_S"]

#: More processes than this is not what this engine is for (use memory or tcp).
MAX_BROKERS = 64
#: Seconds without any broker log growing that count as "the estate is quiet".
QUIET_S = 0.6
#: Longest wait for a broker process to listen, or for the estate to go quiet.
START_TIMEOUT = 60.0
_COMMON = {"ts", "broker", "event", "level", "v", "run"}
#: Steps after which the engine waits for the estate to be quiet: processes take real
#: seconds to start and links real back-off to return, which the plan's gaps may not cover.
_RESHAPING = {"cut_link", "restore_link", "kill_broker", "restart_broker", "insert_layer"}


class _Site:
    __slots__ = ("spec", "port", "dir", "config", "log", "proc", "app", "scope", "alive",
                 "up", "proxy")

    def __init__(self, spec: BrokerSpec, root: Path) -> None:
        self.spec = spec
        self.port = free_port()
        self.dir = root / spec.id
        self.dir.mkdir(parents=True)
        self.config = self.dir / "broker.toml"
        self.log = self.dir / "events.jsonl"
        self.proc: trio.Process | None = None
        self.app: App | None = None
        self.scope: trio.CancelScope | None = None   # the app client's
        self.alive = False
        self.up = trio.Event()
        self.proxy: _Proxy | None = None             # its uplink


class _Proxy:
    """The child's link to its parent, through this process (see module docstring)."""

    def __init__(self, engine: ProcsEngine, child: str) -> None:
        self.engine = engine
        self.child = child
        self.port = 0
        self.cut = False
        self.restored = trio.Event()
        self._live: set[trio.CancelScope] = set()

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    def drop(self) -> None:
        """Close every proxied connection (cut, re-parent)."""
        for scope in list(self._live):
            scope.cancel()

    async def _handle(self, down: trio.SocketStream) -> None:
        engine = self.engine
        with trio.CancelScope() as scope:
            self._live.add(scope)
            try:
                while True:
                    parent = engine.sites[engine.topology.broker(self.child).parent]
                    if self.cut:
                        await self.restored.wait()
                    elif not parent.alive:
                        await parent.up.wait()
                    else:
                        break
                up = await open_tcp(Endpoint("tcp", "127.0.0.1", parent.port))
                async with up, trio.open_nursery() as nursery:
                    nursery.start_soon(_pump, down, up, nursery.cancel_scope)
                    nursery.start_soon(_pump, up, down, nursery.cancel_scope)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                    LocalError, RemoteError):
                # RemoteError: open_tcp's "unreachable" -- the parent held alive refused
                # (not listening yet, or just gone); like a reset, the child redials
                pass
            finally:
                self._live.discard(scope)
                await trio.aclose_forcefully(down)


async def _pump(src: trio.abc.Stream, dst: trio.abc.Stream, scope: trio.CancelScope) -> None:
    try:
        while data := await src.receive_some(65536):
            await dst.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    scope.cancel()   # either direction ending ends the connection, like a socket reset


def _stop_now(procs: list) -> None:
    """After a failed run: SIGTERM (a broker's graceful stop, its log complete), SIGKILL
    for any still running 5 s later."""
    running = [p for p in procs if p.returncode is None]
    for p in running:
        p.terminate()
    deadline = time.monotonic() + 5.0
    while any(p.poll() is None for p in running) and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in running:
        if p.poll() is None:
            p.kill()


def _one_error(main: Callable) -> Any:
    """``trio.run(main)``; a failure of one task is raised as itself, not in the
    nurseries' exception groups (the caller reads which broker failed, and why)."""
    try:
        return trio.run(main)
    except BaseExceptionGroup as group:
        leaves = []
        todo = [group]
        while todo:
            for e in todo.pop().exceptions:
                (todo if isinstance(e, BaseExceptionGroup) else leaves).append(e)
        if len(leaves) == 1 and isinstance(leaves[0], Exception):
            raise leaves[0] from group
        raise


class ProcsEngine:
    """One broker process per site (see the module docstring)."""

    name = "procs"

    def __init__(self, plan: Plan, mode: Mode, recorder: Recorder, *,
                 progress: Callable[[dict], None] | None = None,
                 estate: str | Path | None = None, link_timeout: float = 30.0,
                 workdir: str | Path | None = None) -> None:
        if len(plan.final_topology) > MAX_BROKERS:
            raise ValueError(f"the procs engine runs at most {MAX_BROKERS} brokers; "
                             f"{plan.scenario.name} has {len(plan.final_topology)}: use the "
                             "memory or tcp engine")
        self.plan = plan
        self.mode = mode
        self.rec = recorder
        self.progress = progress
        self.topology: Topology = plan.topology
        self.sites: dict[str, _Site] = {}
        self.consumers: dict[str, dict[str, PlannedConsumer]] = {}
        self.kills: list[tuple[float, str]] = []
        self.infos: list[tuple[float, str, dict]] = []
        self._epoch = 0.0
        self._body = b"x" * plan.scenario.workload.body_bytes
        self._root_dir: Path | None = None
        self._nursery: trio.Nursery | None = None
        # a generated estate's own configs (TLS, users) instead of site_config's
        self.estate = None
        self.link_timeout = link_timeout
        self.workdir = workdir   # keep the sites' configs, data and logs there
        if estate is not None:
            from treefed.estate.sites import EstateSites

            self.estate = EstateSites(estate, plan)

    def run(self) -> dict[str, Any]:
        if self.workdir is not None:
            self._root_dir = Path(self.workdir)
            self._root_dir.mkdir(parents=True, exist_ok=True)
            return _one_error(self._main)
        self._root_dir = Path(tempfile.mkdtemp(prefix="treefed-procs-"))
        try:
            return _one_error(self._main)
        finally:
            shutil.rmtree(self._root_dir, ignore_errors=True)

    def now(self) -> float:
        return time.time() - self._epoch

    # ------------------------------------------------------------------ the run
    async def _main(self) -> dict[str, Any]:
        self._epoch = time.time()
        for c in self.plan.consumers:
            self.consumers.setdefault(c.broker, {})[c.sub] = c
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for spec in self.topology.brokers:
                    self.sites[spec.id] = _Site(spec, self._root_dir)
                async with trio.open_nursery() as starting:   # processes start in parallel
                    for spec in self.topology.brokers:
                        starting.start_soon(lambda s: self._add(s, info=True),
                                            self.sites[spec.id])
                await self._linked()   # a child still in its redial back-off is quiet too
                await self._quiet()
                t0 = trio.current_time()
                for step in self.plan.steps:
                    await trio.sleep_until(t0 + step.at)
                    await self._step(step)
                    if step.action in _RESHAPING:   # let links settle before going on
                        await self._quiet()
                    if self.progress is not None:
                        self.progress({"t": self.now(), "frames": 0})
                await self._quiet()
                end = self.now()
                await self._stop_all()
                nursery.cancel_scope.cancel()
        finally:
            _stop_now([s.proc for s in self.sites.values() if s.proc is not None])
        return self._replay_logs(end)

    async def _add(self, site: _Site, *, info: bool) -> None:
        """Proxy for its uplink, config, process, wait until it listens, client."""
        spec = self.topology.broker(site.spec.id)
        site.spec = spec
        if spec.parent is not None and site.proxy is None:
            site.proxy = _Proxy(self, spec.id)
            await self._nursery.start(site.proxy.serve)
        parent_uri = f"tcp://127.0.0.1:{site.proxy.port}" if site.proxy else None
        if self.estate is not None:
            config = self.estate.config(spec.id, port=site.port,
                                        uplink_port=site.proxy.port if site.proxy else None,
                                        data_dir=str(site.dir / "data"), log_file=str(site.log))
        else:
            config = site_config(self.mode, spec, parent_uri=parent_uri,
                                 listen=(f"tcp://127.0.0.1:{site.port}",),
                                 data_dir=str(site.dir / "data"), log_file=str(site.log),
                                 level="info")
        site.config.write_text(dump_config(config), encoding="utf-8")
        if info:
            self.infos.append((self.now(), spec.id, broker_info(self.mode, spec)))
        await self._spawn(site)

    async def _spawn(self, site: _Site) -> None:
        site.proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "treefed.cli", "broker", "--config", str(site.config)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(site.dir / "stderr.txt", "ab"),
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if self.estate is not None:
            await self._spawn_estate_app(site)
            return
        with trio.fail_after(START_TIMEOUT):
            while True:
                if site.proc.returncode is not None:
                    raise RuntimeError(f"broker {site.spec.id} exited with "
                                       f"{site.proc.returncode}: "
                                       + (site.dir / "stderr.txt").read_text()[-2000:])
                try:
                    stream = await open_tcp(Endpoint("tcp", "127.0.0.1", site.port))
                    break
                except Exception:
                    await trio.sleep(0.05)
        site.alive = True
        site.up.set()
        site.app = App(site.spec.id)
        await self._nursery.start(self._run_app, site, stream)
        for c in self.consumers.get(site.spec.id, {}).values():
            site.app.subscribe(c)

    async def _spawn_estate_app(self, site: _Site) -> None:
        """Wait until the estate site listens; its workload client logs in as the
        estate's application user, over TLS when it listens on ssl://."""
        sid = site.spec.id
        try:
            stream = await self.estate.connect(
                sid, site.port, lambda: site.proc.returncode is None, START_TIMEOUT)
        except RuntimeError:
            raise RuntimeError(f"broker {sid} exited with {site.proc.returncode}: "
                               + (site.dir / "stderr.txt").read_text()[-2000:]) from None
        site.alive = True
        site.up.set()
        if stream is None:
            return   # the plan never uses this site
        client = self.estate.clients[sid]
        site.app = App(sid, username=client.username, password=client.password)
        await self._nursery.start(self._run_app, site, stream)
        for c in self.consumers.get(sid, {}).values():
            site.app.subscribe(c)

    async def _linked(self) -> None:
        """Every child -> parent link up, or stop with what the logs say.  Quiet logs alone
        do not mean linked: a child whose first dial came before its parent listened waits
        out its redial back-off in silence (under load longer than ``QUIET_S``), and a plan
        started then runs on a partial estate."""
        from treefed.estate.sites import EstateSites
        parents = {s.spec.id: s.spec.parent for s in self.sites.values()}
        logs = {sid: s.log for sid, s in self.sites.items()}
        deadline = trio.current_time() + self.link_timeout
        while missing := EstateSites.missing_links(parents, logs):
            if trio.current_time() > deadline:
                raise RuntimeError(f"the estate did not link within {self.link_timeout} s:\n"
                                   + EstateSites.why(missing, logs))
            await trio.sleep(0.1)

    async def _run_app(self, site: _Site, stream: trio.abc.Stream, *,
                       task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            site.scope = scope
            async with stream:
                await site.app.run(stream, task_status=task_status)

    async def _quiet(self) -> None:
        """Wait until no broker log has grown for QUIET_S seconds."""
        def sizes() -> tuple:
            return tuple(s.log.stat().st_size if s.log.exists() else 0
                         for s in self.sites.values())

        with trio.fail_after(START_TIMEOUT):
            last, since = sizes(), trio.current_time()
            while trio.current_time() - since < QUIET_S:
                await trio.sleep(0.1)
                now = sizes()
                if now != last:
                    last, since = now, trio.current_time()

    async def _stop_all(self) -> None:
        for site in self.sites.values():
            if site.proc is not None and site.proc.returncode is None:
                site.proc.terminate()
        with trio.move_on_after(15):
            for site in self.sites.values():
                if site.proc is not None:
                    await site.proc.wait()

    # ------------------------------------------------------------------ timeline
    async def _step(self, step: Step) -> None:
        action, sites = step.action, self.sites
        if apply_traffic(step, sites, self.consumers, self._body):
            return
        if action == "cut_link":
            for t in step.targets:
                proxy = sites[t].proxy
                proxy.cut = True
                proxy.restored = trio.Event()
                proxy.drop()
        elif action == "restore_link":
            for t in step.targets:
                proxy = sites[t].proxy
                proxy.cut = False
                proxy.restored.set()
        elif action == "kill_broker":
            for t in step.targets:
                self._kill(sites[t])
        elif action == "restart_broker":
            for t in step.targets:
                site = sites[t]
                if site.alive:
                    self._kill(site)
                await site.proc.wait()
                await self._spawn(site)
        elif action == "insert_layer":
            old = self.topology
            self.topology = step.topology
            for spec in step.topology.brokers:
                if spec.id not in sites:
                    sites[spec.id] = _Site(spec, self._root_dir)
                    await self._add(sites[spec.id], info=True)
            for spec in step.topology.brokers:
                if spec.id in old and spec.parent is not None \
                        and old.broker(spec.id).parent != spec.parent:
                    sites[spec.id].spec = spec
                    sites[spec.id].proxy.drop()   # the next dial reaches the new parent
        else:  # pragma: no cover - spec.py validates actions
            raise ValueError(f"unknown step {action!r}")

    def _kill(self, site: _Site) -> None:
        site.alive = False
        site.up = trio.Event()
        self.kills.append((self.now(), site.spec.id))
        site.proc.kill()
        if site.scope is not None:
            site.scope.cancel()

    # ------------------------------------------------------------------ the log
    def _replay_logs(self, end: float) -> dict[str, Any]:
        """Merge the brokers' logs in time order into the Recorder."""
        rec, plan = self.rec, self.plan
        lines: list[tuple[float, int, str, str, dict]] = []
        n = 0
        for site in self.sites.values():
            if not site.log.exists():
                continue
            with open(site.log, encoding="utf-8") as f:
                for raw in f:
                    try:
                        line = json.loads(raw)
                    except ValueError:
                        continue   # a line cut short by SIGKILL
                    event = line.get("event")
                    if event not in EVENTS or event == "broker.info":
                        continue
                    fields = {k: v for k, v in line.items() if k not in _COMMON}
                    n += 1
                    ts = line["ts"] - self._epoch
                    if ts <= end:   # not the shutdown after the run
                        lines.append((ts, n, site.spec.id, event, fields))
        for ts, broker, fields in self.infos:
            n += 1
            lines.append((ts, n, broker, "broker.info", fields))
        lines.sort()
        params = run_params(plan, self.mode)
        rec.emit(0.0, RUNNER, "run.started",
                 run_fields(plan, self.mode, self.name, self.topology, params))
        kills = sorted(self.kills)
        k = 0
        for ts, _, broker, event, fields in lines:
            while k < len(kills) and kills[k][0] <= ts:
                rec.killed(kills[k][1])
                k += 1
            rec.emit(max(ts, 0.0), broker, event, fields)
        for _, broker in kills[k:]:
            rec.killed(broker)
        outcome = rec.finish(end)
        rec.emit(end, RUNNER, "run.finished",
                 run_fields(plan, self.mode, self.name, self.topology, params))
        errors = sum(s.app.errors for s in self.sites.values() if s.app is not None)
        return {"virtual_s": end, "frames": 0, "client_errors": errors, "outcome": outcome}
