"""What the memory engine's start-up wait and teardown cost in trio machinery (issue #14,
in-process estate): the run's end cancels one scope per site (its own), none per
connection, and the root nursery gathers no exception; the engine's main task waits for
the estate to come up without a task step per site.  Counts, not timings."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from treefed.node.late_writer import ConnTasks
from treefed.scenario.engines.memory import MemoryEngine
from treefed.scenario.results import Recorder
from treefed.scenario.spec import load_scenario
from treefed.scenario.workload import build_plan
from treefed.transport.memory import aclose_forcefully, frame_link

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


class _Lines:
    def write(self, *args) -> None:
        pass


class _MainSteps(trio.abc.Instrument):
    def __init__(self, main: trio.lowlevel.Task) -> None:
        self.main = main
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.main:
            self.steps += 1


class _Counted(MemoryEngine):
    main_steps: _MainSteps | None = None

    async def _main(self):
        self.main_steps = _MainSteps(trio.lowlevel.current_task())
        trio.lowlevel.add_instrument(self.main_steps)
        return await super()._main()


@pytest.fixture
def cancels(monkeypatch) -> list:
    """Every ``CancelScope.cancel()`` call made while the test runs."""
    calls: list = []
    cancel = trio.CancelScope.cancel

    def counted(self, *args, **kwargs):
        calls.append(self)
        return cancel(self, *args, **kwargs)

    monkeypatch.setattr(trio.CancelScope, "cancel", counted)
    return calls


def _run() -> tuple[_Counted, int, dict]:
    sc = load_scenario(SCENARIOS / "retail-small.toml")
    plan = build_plan(sc)
    engine = _Counted(plan, sc.mode("tree"), Recorder(plan, _Lines()))
    figures = engine.run()["outcome"]
    return engine, len(plan.topology.brokers), figures


def test_a_run_cancels_one_scope_per_site(cancels) -> None:
    """The end of a run is one ``cancel()`` per site (its own scope, ``_stop_sites``);
    closing each frame link and ending each connection's block cancel nothing more (75
    calls at retail-small's 13 sites before: trio's ``aclose_forcefully`` per closed
    link end and a ``ConnTasks`` scope per connection, each a cancel status walk and a
    ``repr`` of the task)."""
    engine, brokers, figures = _run()
    assert figures["delivered"] == figures["expected"] > 0
    assert figures["stranded"] == 0
    assert len(cancels) == brokers, len(cancels)
    assert len({id(scope) for scope in cancels}) == len(cancels)   # each once


def test_the_main_task_waits_for_the_estate_without_a_step_per_site() -> None:
    """Sites that are up by the time the main task looks cost it nothing (16 steps of
    the main task at retail-small's 13 sites before: one per site, then the plan)."""
    engine, brokers, figures = _run()
    assert figures["delivered"] == figures["expected"] > 0
    assert engine.main_steps.steps <= 6, engine.main_steps.steps


def test_aclose_forcefully_closes_a_frame_link_at_once(cancels) -> None:
    """No cancel scope, no checkpoint: the end is closed when the call returns, the
    peer's stream has ended, even from a task that is not cancelled."""

    async def main() -> None:
        near, far = frame_link()
        await aclose_forcefully(far)
        with pytest.raises(trio.BrokenResourceError):
            near.send_now(["x"]) or await near.send_frames(["x"])
        with pytest.raises(trio.EndOfChannel):
            await near.receive_frames()
        with pytest.raises(trio.ClosedResourceError):
            await far.receive_frames()

    trio.run(main)
    assert cancels == []


def test_a_connection_block_without_a_task_cancels_nothing(cancels) -> None:
    """``ConnTasks`` cancels its children's scope only when a child was started, and
    makes that scope only then."""

    async def main() -> None:
        async with trio.open_nursery() as host:
            async with ConnTasks(host) as idle:
                assert idle.children is None and not idle.started
            async with ConnTasks(host) as tasks:
                tasks.start_soon(trio.sleep_forever)
                await trio.sleep(0)

    trio.run(main)
    assert len(cancels) == 1   # the second block's: its writer was running


def test_connect_now_hello_then_direct_or_refused() -> None:
    """The hello goes in the call; the broker's Hello makes the App direct (what it
    queued meanwhile goes at once, deliveries are acked in the broker's call) and calls
    ``ready``; an Error calls ``failed`` with the broker's reason."""
    from treefed.errors import RemoteError
    from treefed.scenario.engines.live import App
    from treefed.wire.frames import PROTOCOL_VERSION, Ack, Deliver, Error, Hello, Subscribe

    async def main() -> None:
        near, far = frame_link()
        app, seen = App("s1"), []
        app.connect_now(near, lambda: seen.append("ready"), seen.append)
        (hello,) = await far.receive_frames()
        assert type(hello) is Hello and hello.name == "s1-app"
        app.queue(Subscribe("sub-1", "queue://q", None))   # before the answer: waits
        assert far._in.frames == []
        far.send_now([Hello(PROTOCOL_VERSION, "broker", name="s1"),
                      Deliver("sub-1", "m1", "queue://q", {}, b"x", False, 0)])
        assert seen == ["ready"]
        got = await far.receive_frames()
        assert [type(f) for f in got] == [Subscribe, Ack]
        assert got[1].msg == "m1"

        near, far = frame_link()
        app, seen = App("s2"), []
        app.connect_now(near, lambda: seen.append("ready"), seen.append)
        await far.receive_frames()
        far.send_now([Error("auth_failed", "no")])
        (exc,) = seen
        assert type(exc) is RemoteError and exc.code == "auth_failed"

    trio.run(main)


def test_the_root_nursery_gathers_no_exception_at_the_end(monkeypatch) -> None:
    """Each site's scope catches its node's Cancelled, so no site task ends with an
    exception for the root nursery to group and split (one per site before)."""
    from trio._core._run import Nursery   # the one place trio records a child's error

    added: list = []
    add_exc = Nursery._add_exc

    def counted(self, exc, reason):
        added.append(self)
        return add_exc(self, exc, reason)

    monkeypatch.setattr(Nursery, "_add_exc", counted)
    engine, brokers, figures = _run()
    assert figures["delivered"] == figures["expected"] > 0
    assert figures["stranded"] == 0
    assert engine._root not in added, added.count(engine._root)
    assert added   # the nodes' own nurseries did see their tasks cancelled


def test_a_site_seeds_its_random_only_when_drawn_from() -> None:
    """No site of a converging run draws reconnect jitter, so none pays for a seeded
    Mersenne Twister (2.5 KiB each); drawing gives the seeded Random's own sequence."""
    import random

    from treefed.scenario.engines.live import _SeededLater

    engine, brokers, figures = _run()
    assert figures["delivered"] == figures["expected"] > 0
    assert all(site.rng._rng is None for site in engine.sites.values())
    lazy, real = _SeededLater(1234), random.Random(1234)
    assert [lazy.random() for _ in range(3)] == [real.random() for _ in range(3)]
    items, same = list(range(10)), list(range(10))
    lazy.shuffle(items)
    real.shuffle(same)
    assert items == same
