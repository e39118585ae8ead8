"""trim_when_idle: gives the heap back once after start-up and after each busy spell,
never while the site task works (issue #14, broker RSS)."""

from __future__ import annotations

import trio

from treefed.node import trim


class _Node:
    batches = 0


async def test_trims_when_idle_and_never_while_busy(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(trim, "malloc_trim", lambda: calls.append(1))
    node = _Node()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trim.trim_when_idle, node, 0.5)
        await trio.sleep(0.8)
        assert len(calls) == 1                  # after start-up
        await trio.sleep(1.5)
        assert len(calls) == 1                  # idle: not again
        busy_until = trio.current_time() + 2.0  # busy for 2 s: a batch every 10 ms
        while trio.current_time() < busy_until:
            node.batches += 1
            await trio.sleep(0.01)
        assert len(calls) == 1
        await trio.sleep(1.3)
        assert len(calls) == 2                  # quiet again: one trim
        nursery.cancel_scope.cancel()


def test_malloc_trim_runs_here():
    # glibc on the machines we run on: the real call works
    assert trim.malloc_trim() is True
