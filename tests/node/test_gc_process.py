"""The broker process's cyclic collector (node/gcwatch.py, issue #14): the start-up is
frozen once the process serves, passes and pauses are counted and shown by ``stat``;
an in-process node (the scenario engines' way) freezes nothing."""

from __future__ import annotations

import gc

import pytest
import trio

from treefed.client import connect
from treefed.node import gcwatch
from treefed.node.node import GC_YOUNG_THRESHOLD

from tests.node.helpers import BrokerProcess, make_config, start_node, write_config


async def test_the_broker_process_freezes_its_start_up_and_shows_its_gc(tmp_path):
    """``treefed broker``: after start-up most of its objects are frozen (no pass walks
    them again), the young threshold is raised, and the watch counts passes."""
    proc = BrokerProcess(write_config(tmp_path / "b.toml", "gcb", tmp_path / "d"),
                         tmp_path / "log")
    try:
        proc.start()
        with trio.fail_after(20):
            async with connect(proc.uri, client_id="gc-test") as conn:
                stats = await conn.stat("summary")
        figures = stats["gc"]
        # the imports, config and listeners: tens of thousands of objects
        assert figures["frozen"] > 10_000, figures
        assert figures["threshold"][0] == GC_YOUNG_THRESHOLD
        # the watch is installed after the freeze: it counts the passes while serving
        # (the freeze's own full collection is in ``collections`` only)
        assert figures["collections"][2] >= 1
        assert figures["passes"][2] <= figures["collections"][2] - 1
        assert len(figures["pause_max_ms"]) == len(figures["pause_total_ms"]) == 3
    finally:
        proc.cleanup()


async def test_an_in_process_node_freezes_nothing(tmp_path):
    """A node served in-process (tests, scenario engines) leaves the collector's
    generations alone: freezing is the broker process's decision."""
    before = gc.get_freeze_count()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            node, _ = await start_node(nursery, make_config(tmp_path))
            figures = node.statistics()["gc"]
            nursery.cancel_scope.cancel()
    assert gc.get_freeze_count() == before == figures["frozen"]


@pytest.fixture
def fresh_watch():
    w = gcwatch.GcWatch().install()
    yield w
    w.remove()


def test_the_watch_counts_passes_per_generation_and_their_pauses(fresh_watch):
    gc.collect(0)
    gc.collect(2)
    figures = fresh_watch.figures()
    assert figures["passes"][0] >= 1 and figures["passes"][2] >= 1
    assert figures["pause_max_ms"][2] > 0
    assert figures["pause_total_ms"][2] >= figures["pause_max_ms"][2]
    fresh_watch.remove()
    fresh_watch.remove()   # twice: harmless
    gc.collect(0)
    assert fresh_watch.figures()["passes"] == figures["passes"]


def test_freezing_moves_the_live_objects_out_of_every_generation():
    """``freeze_start_up``: collected first (no garbage frozen), then frozen; a full
    pass afterwards walks only what was made since."""
    try:
        frozen = gcwatch.freeze_start_up()
        # what it froze; a frozen object another thread of this process (a worker, the
        # shared Spark session's py4j threads) frees meanwhile leaves the permanent
        # generation (CI once read 278,582 of 278,584)
        assert frozen > 1_000 and frozen - 100 <= gc.get_freeze_count() <= frozen
        assert sum(len(gc.get_objects(g)) for g in range(3)) < frozen // 10
    finally:
        gc.unfreeze()
