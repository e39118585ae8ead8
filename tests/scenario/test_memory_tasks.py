"""The memory engine's cost per broker in trio tasks (issue #14, in-process estate): the
tasks a site needs are few, and the run still equals replay."""

from __future__ import annotations

from pathlib import Path

import trio

from treefed.scenario.engines.memory import MemoryEngine
from treefed.scenario.results import Recorder
from treefed.scenario.spec import load_scenario
from treefed.scenario.workload import build_plan

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


class _Count(trio.abc.Instrument):
    def __init__(self) -> None:
        self.spawned = 0
        self.steps = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.spawned += 1

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


class _Counted(MemoryEngine):
    count = _Count()

    async def _main(self):
        trio.lowlevel.add_instrument(self.count)
        return await super()._main()


class _Lines:
    def write(self, *args) -> None:
        pass


def _run(label: str) -> tuple[_Count, int, dict]:
    sc = load_scenario(SCENARIOS / "retail-small.toml")
    plan = build_plan(sc)
    engine = _Counted(plan, sc.mode(label), Recorder(plan, _Lines()))
    engine.count = _Count()
    figures = engine.run()["outcome"]
    return engine.count, len(plan.topology.brokers), figures


def test_tasks_per_site_in_the_tree() -> None:
    """Per site (broker, its link up, its App): the task serving the node, its site
    task, its dialer, the node side's readers of its parent link and of its App
    connection -- no writer task per connection, no task in the App (not even to
    connect it: ``App.connect_now``), no space watcher, no nursery task per site (11.7
    per site before: 4,005 x 11.7 tasks to start and cancel at 4 x 1,000; 6 before the
    App connected without a task)."""
    count, brokers, figures = _run("tree")
    assert figures["delivered"] == figures["expected"] > 0
    assert figures["stranded"] == 0
    assert count.spawned <= 5 * brokers, count.spawned / brokers
