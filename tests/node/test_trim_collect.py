"""Under PYTHONMALLOC=malloc the idle trim collects first: a full collection empties the
interpreter's free lists, whose blocks would keep their pages from malloc_trim (issue
#14, after-run RSS); under pymalloc it does not (no gain there, and it holds the GIL)."""

from __future__ import annotations

import pytest
import trio

from treefed.node import trim


class _Node:
    batches = 0


@pytest.mark.parametrize("collect", [True, False])
async def test_a_full_collection_comes_before_each_trim(monkeypatch, collect):
    monkeypatch.setattr(trim, "COLLECT_FIRST", collect)
    calls: list[str] = []
    monkeypatch.setattr(trim.gc, "collect", lambda *a: calls.append(f"collect{a}") or 0)
    monkeypatch.setattr(trim, "malloc_trim", lambda: calls.append("trim"))
    node = _Node()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trim.trim_when_idle, node, 0.5)
        await trio.sleep(0.8)
        node.batches += 1
        await trio.sleep(1.3)
        nursery.cancel_scope.cancel()
    # after start-up and after the busy spell: each time every generation, then the trim
    if collect:
        assert calls == ["collect()", "trim", "collect()", "trim"]
    else:
        assert calls == ["trim", "trim"]


def test_collect_first_follows_the_allocator():
    import subprocess
    import sys

    code = "from treefed.node import trim; print(trim.COLLECT_FIRST)"
    for env, want in (({"PYTHONMALLOC": "malloc"}, "True"), ({}, "False")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**_env(), **env}, check=True).stdout.strip()
        assert out == want, env


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONMALLOC"}
