"""BrokerNode.serve raises the cyclic GC's young threshold (see node.py, "Garbage
collection"), never lowers it and leaves a collector turned off alone."""

from __future__ import annotations

import gc

import pytest
import trio

from treefed.node.node import GC_YOUNG_THRESHOLD

from tests.node.helpers import make_config, start_node


@pytest.fixture
def gc_threshold():
    """Restore the process's GC thresholds after the test."""
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


class TestGcThreshold:
    async def test_serve_raises_the_default_young_threshold(self, gc_threshold, tmp_path):
        """From Python's 700 to GC_YOUNG_THRESHOLD, older generations untouched."""
        gc.set_threshold(700, 10, 10)
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await start_node(nursery, make_config(tmp_path))
                assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, 10, 10)
                nursery.cancel_scope.cancel()

    @pytest.mark.parametrize("young", [0, GC_YOUNG_THRESHOLD * 3])
    async def test_higher_or_disabled_threshold_is_kept(self, gc_threshold, tmp_path, young):
        """A threshold set higher, or 0 (collection off), is left as it was."""
        gc.set_threshold(young, 10, 10)
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await start_node(nursery, make_config(tmp_path))
                assert gc.get_threshold() == (young, 10, 10)
                nursery.cancel_scope.cancel()
