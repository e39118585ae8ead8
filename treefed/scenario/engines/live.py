"""Live engines: real BrokerNodes in one trio process, over memory streams or loopback TCP.

Theory of operation
-------------------
Every site is a real ``node.BrokerNode`` (site task, reader and writer tasks per
connection, reconnecting dialers) built from a generated, validated ``BrokerConfig``
(common.py decides the connector settings; ``SiteConfigs`` parses each shape of site
once).  Each node is served in one task of the root nursery under its own cancel scope,
so ``kill_broker`` is one ``cancel()``: its tasks stop, its streams close, its peers see
the link drop -- exactly a dead process, minus the process.  The node's MemoryStore
outlives it; ``restart_broker`` builds a new node on it.  On frame links a connection's
writer task starts only when it closes (node/late_writer.py) and the App has no task of
its own, not even to connect (``App.connect_now``; issue #14: a site costs 5 tasks, not
12, to start and to cancel).

Time is a ``trio.testing.MockClock`` with autojump: virtual time stands still while any
task can run and jumps to the next timer when all are blocked.  So the plan's ``at``
times are honoured, interest has always settled before ``SEND_AT`` (the clock only moves
once nothing is left to do), and a run that would take minutes of timeline takes the
seconds its work needs.  Event ``ts`` is virtual time, as in replay.

Links are dialed through the node's ``open_stream`` hook into ``_dial``, which knows
the child's *current* parent: it waits while the link is cut or the parent is down, then
returns one end of an in-process frame link (``transport.memory.frame_link``, handing the
other end to the parent's ``serve_stream``; the node and the App use a frame link in
place of a ``FramedStream``) or a loopback TCP connection.  Cutting a link closes that
stream; the child's dialer retries and waits in ``_dial`` until the link is restored.
``insert_layer`` closes the moved children's links and their next dial reaches the new
parent.

Applications are one raw protocol client per site (``App``): hello, subscriptions with
the plan's ids, sends with the plan's message ids, an ack for every delivery.  Events
reach the Recorder through the node's ``event_logs`` hook (a step's lines in one call); the
node's own structlog lines are not part of the event log.
"""

from __future__ import annotations

import dataclasses
import random
from functools import partial
from typing import Any, Callable

import trio
import trio.testing

from treefed.config import BrokerConfig, parse_config
from treefed.errors import RemoteError
from treefed.federation.sharing import Sharing
from treefed.persistence.memory import MemoryStore
from treefed.scenario.baselines import store_options
from treefed.scenario.engines.common import (
    LINK_NAME, RUNNER, broker_info, run_fields, run_params,
)
from treefed.scenario.results import Recorder
from treefed.scenario.spec import Mode
from treefed.scenario.topology import BrokerSpec, Topology
from treefed.scenario.workload import Plan, PlannedConsumer, Step
from treefed.transport.framed import FramedStream
from treefed.transport.memory import FrameEnd, frame_link
from treefed.transport.streams import open_tcp
from treefed.transport.uri import Endpoint
from treefed.wire.frames import (PROTOCOL_VERSION, Ack, Deliver, Error, Hello, Send,
                                 Subscribe, Unsubscribe)

__all__ = ["LiveEngine", "site_config", "App", "QUIET_S", "apply_traffic"]

_GONE = (trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError)
#: Virtual seconds of silence after the last step before the run is declared over.
QUIET_S = 5.0
_LINK_PORT = 61616  # config URIs need a port; _dial resolves links by broker id


def _link_uri(broker_id: str) -> str:
    return f"tcp://{broker_id}:{_LINK_PORT}"


def site_config(mode: Mode, spec: BrokerSpec, *, parent_uri: str | None,
                listen: tuple[str, ...] = (), data_dir: str = "",
                log_file: str = "", level: str = "warning") -> BrokerConfig:
    """A validated BrokerConfig for one scenario site: the child dials its parent with a
    tree connector or a mesh ``uplink`` connector carrying the mode's options."""
    return parse_config(site_doc(mode, spec, parent_uri=parent_uri, listen=listen,
                                 data_dir=data_dir, log_file=log_file, level=level))


def site_doc(mode: Mode, spec: BrokerSpec, *, parent_uri: str | None,
             listen: tuple[str, ...] = (), data_dir: str = "",
             log_file: str = "", level: str = "warning") -> dict[str, Any]:
    """``site_config``'s document, before it is parsed."""
    doc: dict[str, Any] = {
        "broker": {"id": spec.id, "listen": list(listen), "heartbeat_interval": 0.0,
                   "accept_tree_children": mode.connector == "tree" and spec.role != "leaf"},
        "logging": {"level": level, "message_events": True, "advisory_events": True,
                    "file": log_file},
    }
    if data_dir:
        doc["broker"]["data_dir"] = data_dir
    if parent_uri is not None:
        opts = dict(mode.options) if mode.connector == "tree" else store_options(mode, spec)
        if mode.connector == "tree":
            doc["tree_connector"] = {"uri": parent_uri, "node_type": spec.role, **opts}
        else:
            doc["network_connector"] = [{"name": LINK_NAME["mesh"],
                                         "uri": f"static:({parent_uri})", **opts}]
    return doc


def still_clock(autojump_threshold: float) -> trio.testing.MockClock:
    """The engines' virtual clock: a MockClock at rate 0 with autojump.  Its time moves
    only when it jumps, so it is the jumped-to base, read without the real clock and the
    rate conversion (issue #14: ~190,000 reads in a 4 x 1,000 memory run -- every
    reader's ``last_rx``, every cancel scope's deadline).  Only while its rate stays 0,
    which the engines never change; on a trio whose MockClock keeps its time otherwise,
    it is MockClock's own reading."""
    clock = trio.testing.MockClock(autojump_threshold=autojump_threshold)
    if clock.rate == 0.0 and getattr(clock, "_virtual_base", None) == clock.current_time():
        clock.current_time = partial(getattr, clock, "_virtual_base")   # type: ignore
    return clock


class SiteConfigs:
    """``site_config`` for the sites of one run, parsed once per shape (issue #14: 4,005
    parses were ~5 % of a 4 x 1,000 memory run's start-up).  Sites whose documents differ
    only in the broker id and the parent's id share one parse of that shape; each gets
    a copy with its own id, name, data_dir and connector URI (the config is frozen, so
    the rest is shared safely).  The id and the URI are checked by the checkers
    ``parse_config`` uses."""

    _ID = "site-template"
    _PARENT = "parent-template"

    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        self._shapes: dict[str, BrokerConfig] = {}
        # (shape, parent URI) -> the shape's connectors with that URI, checked: a parent's
        # children share them (issue #14: a URI check and a copy per site before)
        self._links: dict[tuple[int, str], tuple] = {}

    def get(self, spec: BrokerSpec, *, parent: str | None, uri: Callable[[str], str],
            listen: tuple[str, ...] = ()) -> BrokerConfig:
        """The config of site ``spec``; ``parent`` its parent's id, ``uri(id)`` the URI
        that dials a broker by id."""
        parent_uri = uri(parent) if parent is not None else None
        doc = site_doc(self.mode, spec, parent_uri=parent_uri, listen=listen)
        shape = repr(self._template(doc, spec.id, parent_uri, uri))
        cfg = self._shapes.get(shape)
        if cfg is None:
            cfg = self._shapes[shape] = parse_config(
                self._template(doc, spec.id, parent_uri, uri))
        return self._fill(cfg, spec.id, parent_uri, uri, self._links)

    def _template(self, doc: dict, site: str, parent_uri: str | None,
                  uri: Callable[[str], str]) -> dict:
        t = {**doc, "broker": {**doc["broker"], "id": self._ID}}
        if parent_uri is not None:
            tmpl_uri = uri(self._PARENT)
            if "tree_connector" in t:
                t["tree_connector"] = {**t["tree_connector"], "uri": tmpl_uri}
            else:
                (nc,) = t["network_connector"]
                t["network_connector"] = [{**nc, "uri": f"static:({tmpl_uri})"}]
        return t

    @staticmethod
    def _fill(cfg: BrokerConfig, site: str, parent_uri: str | None,
              uri: Callable[[str], str], links: dict | None = None) -> BrokerConfig:
        """``cfg`` (a shape's parse) for ``site``; ``links``: the connectors already
        filled in for a (shape, parent URI), kept while ``cfg`` is (configs are frozen)."""
        from treefed.config import _identifier, _uri   # parse_config's own checks

        _identifier(site, "broker.id")
        broker = dataclasses.replace(cfg.broker, id=site, name=site, data_dir=f"data/{site}")
        tc, ncs = cfg.tree_connector, cfg.network_connectors
        if parent_uri is not None:
            key = (id(cfg), parent_uri)
            hit = links.get(key) if links is not None else None
            if hit is not None and hit[0] is cfg:
                tc, ncs = hit[1], hit[2]
            elif tc is not None:
                tc = dataclasses.replace(
                    tc, uri=_uri("tcp://", "ssl://", "failover:")(parent_uri,
                                                                 "tree_connector.uri"))
            else:
                mesh = _uri("static:", "tcp://", "ssl://", "failover:")(
                    f"static:({parent_uri})", "network_connector[0].uri")
                ncs = (dataclasses.replace(ncs[0], uri=mesh),)
            if links is not None and hit is None:
                links[key] = (cfg, tc, ncs)
        return dataclasses.replace(cfg, broker=broker, tree_connector=tc,
                                   network_connectors=ncs)


class App:
    """One site's applications over one raw client connection (plan ids kept as is)."""

    def __init__(self, broker_id: str, *, username: str | None = None,
                 password: str | None = None) -> None:
        self.broker_id = broker_id
        self.username, self.password = username, password   # a generated estate's user
        self.errors = 0
        self._out: list = []
        self._wake = trio.Event()
        self._direct: FrameEnd | None = None   # a frame link once hello is done

    def queue(self, frame: Any) -> None:
        direct = self._direct
        if direct is not None and direct.send_now((frame,)):   # no writer task to wake
            return
        self._out.append(frame)
        self._wake.set()

    def subscribe(self, c: PlannedConsumer) -> None:
        self.queue(Subscribe(c.sub, c.dst, c.selector))

    def unsubscribe(self, sub: str) -> None:
        self.queue(Unsubscribe(sub))

    def send(self, msg_id: str, dst: str, headers: dict, body: bytes,
             persistent: bool) -> None:
        self.queue(Send(dst, msg_id, dict(headers), body, persistent))

    def _hello(self) -> Hello:
        return Hello(PROTOCOL_VERSION, "client", name=f"{self.broker_id}-app",
                     username=self.username, password=self.password)

    def _check_hello(self, first: list) -> None:
        """The broker's answer to our hello: a Hello, or a RemoteError saying why not."""
        if type(first[0]) is Error:
            raise RemoteError(f"{self.broker_id}: the broker refused the workload client"
                              f"{' ' + self.username if self.username else ''}: "
                              f"{first[0].code} {first[0].message}", code=first[0].code)
        if type(first[0]) is not Hello:
            raise RemoteError(f"{self.broker_id}: expected hello, got {first[0]!r}")

    def _go_direct(self, end: FrameEnd, frames: list) -> None:
        """After the hello on an in-process frame link: what the App queues goes into
        the link at once, in order (no writer task), and the link hands the App what the
        broker sends in the broker's own call, which the App acks synchronously (no
        reader task) -- issue #14.  ``frames``: what came with the broker's hello."""
        self._direct = end
        early, self._out = self._out, []
        end.send_now(early)
        self._handle(frames)
        end.deliver_to(self._handle)

    def connect_now(self, end: FrameEnd, ready: Callable[[], None],
                    failed: Callable[[Exception], None]) -> None:
        """``run`` for an in-process frame link, without a task (issue #14: one task
        fewer per site to start): the hello goes now; the broker's answer arrives in the
        broker's own call, which then makes the App direct (``_go_direct``) and calls
        ``ready()`` -- or ``failed(RemoteError)`` when the broker refused it.  (A broker
        that stops before it answers never calls back: its site ends anyway.)"""
        def answer(first: list) -> None:
            try:
                self._check_hello(first)
            except RemoteError as exc:
                end.deliver_to(_ignore)
                failed(exc)
                return
            self._go_direct(end, first[1:])
            ready()

        end.send_now((self._hello(),))
        end.deliver_to(answer)

    async def run(self, stream: trio.abc.Stream, *,
                  task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Hello, then read (acking deliveries) and write until the stream ends; on an
        in-process frame link, return after the hello (the link hands the App its
        frames, the App writes into it directly)."""
        framed = stream if type(stream) is FrameEnd else FramedStream(stream)
        await framed.send_frame(self._hello())
        try:
            first = await framed.receive_frames()
        except _GONE as exc:   # e.g. TLS 1.3: a refused client certificate shows up here
            why = getattr(exc.__cause__, "reason", None) or "connection closed"
            raise RemoteError(f"{self.broker_id}: the broker closed the workload client's "
                              f"connection before its hello: {why}") from exc
        self._check_hello(first)
        task_status.started()
        if type(framed) is FrameEnd:
            self._go_direct(framed, first[1:])
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._writer, framed)
            await self._read(framed, first[1:])
            nursery.cancel_scope.cancel()

    def _handle(self, frames: list) -> None:
        acks = []
        for frame in frames:
            kind = type(frame)
            if kind is Deliver:
                acks.append(Ack(frame.sub, frame.msg))
            elif kind is Error:
                self.errors += 1
        if acks:
            direct = self._direct
            if direct is None or not direct.send_now(acks):
                self._out += acks
                self._wake.set()

    async def _read(self, framed, frames: list) -> None:
        """Handle ``frames``, then every frame the broker sends until it goes away."""
        self._handle(frames)
        try:
            while True:
                self._handle(await framed.receive_frames())
        except _GONE:
            pass   # the broker went away (stopped, killed): so does its application

    async def _writer(self, framed: FramedStream) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                if self._out:
                    frames, self._out = self._out, []
                    await framed.send_frames(frames)
        except _GONE:
            pass   # the reader sees the end too and stops the connection



def _ignore(frames: list) -> None:
    """Frames nobody reads (a refused App's link)."""


def apply_traffic(step: Step, sites: dict, consumers: dict, body: bytes) -> bool:
    """The timeline steps every live engine performs alike (sends, consumers coming and
    going) through each site's App; False for any other action."""
    action = step.action
    if action == "send":
        for m in step.messages:
            site = sites[m.broker]
            if site.alive:
                site.app.send(m.id, m.dst, m.headers, body, m.persistent)
    elif action == "add_consumer":
        for c in step.consumers:
            consumers.setdefault(c.broker, {})[c.sub] = c
            if sites[c.broker].alive:
                sites[c.broker].app.subscribe(c)
    elif action == "remove_consumer":
        for c in step.consumers:
            consumers.get(c.broker, {}).pop(c.sub, None)
            if sites[c.broker].alive:
                sites[c.broker].app.unsubscribe(c.sub)
    else:
        return False
    return True


class _Started:
    """A ``task_status`` whose ``started(value)`` calls ``call(value)``."""

    __slots__ = ("call",)

    def __init__(self, call: Callable[[Any], None]) -> None:
        self.call = call

    def started(self, value: Any = None) -> None:
        self.call(value)


class _SeededLater:
    """``random.Random(seed)``, seeded when first drawn from: a converging estate's nodes
    never draw (a first dial has no delay to jitter), and 4,005 Mersenne Twisters cost
    ~10 MiB and ~45 ms to seed (issue #14).  The same sequence as the seeded Random."""

    __slots__ = ("_seed", "_rng")

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._rng: random.Random | None = None

    def __getattr__(self, name: str) -> Any:   # random(), shuffle(), ...: the real one
        rng = self._rng
        if rng is None:
            rng = self._rng = random.Random(self._seed)
        return getattr(rng, name)


class _Site:
    __slots__ = ("spec", "node", "store", "app", "scope", "nursery", "alive", "port",
                 "up", "stopped", "link_stream", "rng")

    def __init__(self, spec: BrokerSpec, seed: int) -> None:
        self.spec = spec
        self.node: Any = None
        self.store = MemoryStore()           # the site's "disk": survives kill_broker
        self.app: App | None = None
        self.scope: trio.CancelScope | None = None
        self.nursery: trio.Nursery | None = None
        self.alive = False
        self.port = 0                        # tcp: the listening port, kept over restarts
        self.up = trio.Event()               # set while alive (dialers wait on it)
        self.stopped = trio.Event()          # set when the node's tasks have all ended
        self.link_stream: Any = None         # the child side of its parent link, to cut
        self.rng = _SeededLater(seed)        # its node's reconnect jitter


class LiveEngine:
    """Real BrokerNodes in one process (see the module docstring)."""

    name = "live"
    tcp = False
    autojump = 0.0   # real seconds all tasks must be blocked before the clock jumps

    def __init__(self, plan: Plan, mode: Mode, recorder: Recorder, *,
                 progress: Callable[[dict], None] | None = None) -> None:
        self.plan = plan
        self.mode = mode
        self.rec = recorder
        self.progress = progress
        self.topology: Topology = plan.topology
        self.sites: dict[str, _Site] = {}
        self.cut: set[str] = set()
        self.restored: dict[str, trio.Event] = {}
        self.consumers: dict[str, dict[str, PlannedConsumer]] = {}
        self._t0 = 0.0
        self._root: trio.Nursery | None = None
        self._body = b"x" * plan.scenario.workload.body_bytes
        self._sharing = Sharing()   # memory-saving tables shared by all its Sites
        self._configs = SiteConfigs(mode)   # parsed once per shape of site

    # ------------------------------------------------------------------ the run
    def run(self) -> dict[str, Any]:
        _quiet_structlog()
        clock = still_clock(self.autojump)
        return trio.run(self._main, clock=clock)

    def now(self) -> float:
        return trio.current_time() - self._t0

    async def _main(self) -> dict[str, Any]:
        self._t0 = trio.current_time()
        plan, rec = self.plan, self.rec
        params = run_params(plan, self.mode)
        rec.emit(0.0, RUNNER, "run.started",
                 run_fields(plan, self.mode, self.name, self.topology, params))
        for c in plan.consumers:
            self.consumers.setdefault(c.broker, {})[c.sub] = c
        async with trio.open_nursery() as root:
            self._root = root
            for i, spec in enumerate(self.topology.brokers):
                self.sites[spec.id] = _Site(spec, plan.scenario.seed * 100_003 + i)
            # all at once: dials wait for their parent in _dial
            ready = [self._launch(self.sites[spec.id], info=True)
                     for spec in self.topology.brokers]
            for up in ready:
                if not up.is_set():   # a set one costs no task step (4,005 of them)
                    await up.wait()
            for step in plan.steps:
                await trio.sleep_until(self._t0 + step.at)
                await self._step(step)
                if self.progress is not None:
                    self.progress({"t": self.now(), "frames": sum(rec.counts.values())})
            await trio.sleep(QUIET_S)
            end = self.now()
            self._stop_sites(root)
        outcome = rec.finish(end)
        rec.emit(end, RUNNER, "run.finished",
                 run_fields(plan, self.mode, self.name, self.topology, params))
        errors = sum(s.app.errors for s in self.sites.values() if s.app is not None)
        return {"virtual_s": end, "frames": 0, "client_errors": errors, "outcome": outcome}

    def _stop_sites(self, root: trio.Nursery) -> None:
        """End the run: cancel every site's own scope, which catches its node's
        Cancelled, so each site task ends normally and the root nursery gathers no
        exception (cancelling the root made it group and split one per site: ~0.1 s of
        a 4 x 1,000 teardown, issue #14).  Every task of the root nursery is a site's;
        if one is not inside its scope (never, after the quiet period), the root's
        cancel ends everything as before."""
        scopes = [s.scope for s in self.sites.values() if s.scope is not None]
        if len(scopes) != len(root.child_tasks):
            root.cancel_scope.cancel()
            return
        for scope in scopes:
            scope.cancel()

    # ------------------------------------------------------------------ sites
    async def _start(self, site: _Site, *, info: bool) -> None:
        await self._launch(site, info=info).wait()

    def _launch(self, site: _Site, *, info: bool) -> trio.Event:
        """Start the site's node in the root nursery; the event is set once it is up
        (its App connected) -- or gone: an error goes to the root nursery."""
        spec = self.topology.broker(site.spec.id)
        site.spec = spec
        if info:
            self.rec.emit(self.now(), spec.id, "broker.info", broker_info(self.mode, spec))
        ready = trio.Event()
        self._root.start_soon(self._run_site, site, ready)
        return ready

    def _config(self, site: _Site) -> BrokerConfig:
        spec = site.spec
        parent = self.sites[spec.parent] if spec.parent is not None else None
        # The parent URI names the parent; _dial (the node's open_stream hook) resolves it
        # to the parent's current memory listener or loopback port.
        listen = (f"tcp://127.0.0.1:{site.port}",) if self.tcp else ()
        return self._configs.get(spec, parent=parent.spec.id if parent is not None else None,
                                 uri=_link_uri, listen=listen)

    async def _run_site(self, site: _Site, ready: trio.Event) -> None:
        """The site's node, served in this task (one task per site: no nursery of its
        own, issue #14); its App connects from a task in the node's nursery."""
        from treefed.node import BrokerNode

        broker_id = site.spec.id

        def sink(event: str, fields: dict) -> None:
            self.rec.emit(trio.current_time() - self._t0, broker_id, event, fields)

        def sink_logs(logs: list) -> None:   # a step's Log actions: one call (issue #14)
            self.rec.emit_logs(trio.current_time() - self._t0, broker_id, logs)

        async def dial(endpoint: Endpoint) -> trio.abc.Stream:
            return await self._dial(site)

        node = BrokerNode(self._config(site), store=site.store, rng=site.rng,
                          event_sink=sink, open_stream=dial, sharing=self._sharing,
                          event_logs=sink_logs)
        if site.store.stats()["rows"] or site.store.load_consumed():
            node.restore()   # messages, and the ids its consumers already took
        site.stopped = trio.Event()
        try:
            with trio.CancelScope() as scope:
                site.scope = scope
                site.node = node
                await node.serve(task_status=_Started(partial(self._served, site, ready)))
        finally:
            site.scope = None   # this task is out of it (``_stop_sites``)
            site.stopped.set()
            ready.set()

    def _served(self, site: _Site, ready: trio.Event, addresses: list) -> None:
        """The site's node is serving (its ``task_status.started``)."""
        site.nursery = site.node._nursery   # its connections' tasks, the App's
        if self.tcp and not site.port:
            site.port = addresses[0][1]
        if self.tcp:
            site.nursery.start_soon(self._connect_app, site, ready)
            return
        # in-process: the App connects without a task of its own (issue #14)
        app = site.app = App(site.spec.id)
        near, far = frame_link()
        site.nursery.start_soon(site.node.serve_stream, far)
        app.connect_now(near, partial(self._app_ready, site, ready),
                        partial(self._app_failed, site))

    def _app_ready(self, site: _Site, ready: trio.Event) -> None:
        """The site's App is connected: its consumers subscribe, the site is up."""
        app = site.app
        for c in self.consumers.get(site.spec.id, {}).values():
            app.subscribe(c)
        site.alive = True
        site.up.set()
        ready.set()

    @staticmethod
    def _app_failed(site: _Site, exc: Exception) -> None:
        """The broker refused the site's App: the run fails with that error, raised in
        the node's nursery as ``_connect_app`` raises it."""
        async def fail() -> None:
            raise exc

        site.nursery.start_soon(fail)

    async def _connect_app(self, site: _Site, ready: trio.Event) -> None:
        """The tcp engine's App: a loopback connection, its reader and writer tasks in
        the node's nursery (the memory engine's connects in ``_served``, taskless)."""
        app = site.app = App(site.spec.id)
        stream = await open_tcp(Endpoint("tcp", "127.0.0.1", site.port))
        await site.nursery.start(app.run, stream)
        self._app_ready(site, ready)

    async def _dial(self, child: _Site) -> trio.abc.Stream:
        """The child's link to its current parent, once the link may exist."""
        while True:
            spec = self.topology.broker(child.spec.id)
            parent = self.sites[spec.parent]
            if spec.id in self.cut:
                await self.restored.setdefault(spec.id, trio.Event()).wait()
                continue
            if not parent.alive:
                await parent.up.wait()
                continue
            break
        if self.tcp:
            stream = await open_tcp(Endpoint("tcp", "127.0.0.1", parent.port))
        else:
            stream, far = frame_link()
            parent.nursery.start_soon(parent.node.serve_stream, far)
        child.link_stream = stream
        return stream

    async def _drop_link(self, child: _Site) -> None:
        stream, child.link_stream = child.link_stream, None
        if stream is not None:
            await trio.aclose_forcefully(stream)

    # ------------------------------------------------------------------ timeline
    async def _step(self, step: Step) -> None:
        action = step.action
        sites = self.sites
        if apply_traffic(step, sites, self.consumers, self._body):
            return
        if action == "cut_link":
            for t in step.targets:
                self.cut.add(t)
                self.restored[t] = trio.Event()
                await self._drop_link(sites[t])
        elif action == "restore_link":
            for t in step.targets:
                self.cut.discard(t)
                self.restored.pop(t, trio.Event()).set()
        elif action == "kill_broker":
            for t in step.targets:
                await self._kill(sites[t])
        elif action == "restart_broker":
            for t in step.targets:
                site = sites[t]
                if site.alive:
                    await self._kill(site)
                await self._start(site, info=False)
        elif action == "insert_layer":
            await self._insert_layer(step)
        else:  # pragma: no cover - spec.py validates actions
            raise ValueError(f"unknown step {action!r}")

    async def _kill(self, site: _Site) -> None:
        site.alive = False
        site.up = trio.Event()
        self.rec.killed(site.spec.id)
        site.scope.cancel()
        await site.stopped.wait()   # its listener is closed and its links are down
        site.link_stream = None

    async def _insert_layer(self, step: Step) -> None:
        old = self.topology
        self.topology = step.topology
        for i, spec in enumerate(step.topology.brokers):
            if spec.id not in self.sites:
                self.sites[spec.id] = _Site(spec, self.plan.scenario.seed * 100_003
                                            + len(self.sites))
                await self._start(self.sites[spec.id], info=True)
        for spec in step.topology.brokers:
            if spec.id in old and spec.parent is not None \
                    and old.broker(spec.id).parent != spec.parent:
                site = self.sites[spec.id]
                site.spec = spec
                await self._drop_link(site)   # its dialer's next attempt reaches the new parent


def _quiet_structlog() -> None:
    """Scenario runs log events through the Recorder; node chatter only from warnings."""
    import structlog

    if not structlog.is_configured():
        from treefed.log import configure_logging

        configure_logging("warning")
