"""Group commit is kept for chunks that arrive together after a committing batch ("Inline
batches" in node.py): a chunk within ``INLINE_GAP_S`` of a batch's end goes to the site
task, which groups it with what else arrives.

Session 8 built and then reverted a rule that opened the gap only after batches that
committed (so a consumer's Ack could not send the next lone message to the site task): in
the lead's quiet alternated rounds it cost the synchronous persistent send with a consumer
~8 % (broker CPU per message +12 %) and the single broker's p99 at 1,000 msgs/s was no
better without it.  This guard stays.

The node's ``perf_counter`` is a clock the test sets, so "within the gap" does not depend
on the machine's load."""

from __future__ import annotations

import time

from treefed.client import connect
from treefed.node import node as node_mod

from tests.node.helpers import make_config, start_node

N = 30


class _SetClock:
    """``time`` for node.py whose ``perf_counter`` stands where the test puts it."""

    def __init__(self, now: float) -> None:
        self.now = now

    def perf_counter(self) -> float:
        return self.now

    def __getattr__(self, name: str):
        return getattr(time, name)


def _spy_inline(node, monkeypatch) -> list:
    calls: list = []
    inline = node._inline_batch

    async def spy(c, frames):
        calls.append(len(frames))
        await inline(c, frames)

    monkeypatch.setattr(node, "_inline_batch", spy)
    return calls


async def test_after_a_commit_chunks_within_the_gap_still_share_the_site_task(
        nursery, tmp_path, monkeypatch):
    """After a batch that committed, a chunk within the gap goes to the site task, which
    groups it with what else arrives (group commit)."""
    clock = _SetClock(1000.0)
    monkeypatch.setattr(node_mod, "time", clock)
    node, uri = await start_node(nursery, make_config(tmp_path / "d"))
    calls = _spy_inline(node, monkeypatch)
    async with connect(uri) as prod:
        await prod.send("queue://p", b"warm", persistent=True)
        calls.clear()
        for i in range(N):
            await prod.send("queue://p", f"m{i}".encode(), persistent=True)
    assert calls == [], calls   # the clock says "together": every send to the site task
