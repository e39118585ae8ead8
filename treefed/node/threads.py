"""One blocking call in one of trio's cached worker threads, for the broker's store work.

``trio.to_thread.run_sync`` does the same plus a capacity limiter, a context copy and two
thread renames (prctl) per call: tens of µs of the broker's one thread for every commit or
fsync (issue #14).  ``in_thread`` takes a cached thread as it is and waits for the result
even when cancelled — a commit or an fsync is never abandoned half-way, and the caller's
cancellation lands at its next checkpoint."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import trio

__all__ = ["in_thread"]


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a cached worker thread; its result, or its exception raised here."""
    task = trio.lowlevel.current_task()
    token = trio.lowlevel.current_trio_token()

    def deliver(result: Any) -> None:
        token.run_sync_soon(trio.lowlevel.reschedule, task, result)

    trio.lowlevel.start_thread_soon(functools.partial(fn, *args), deliver)
    return await trio.lowlevel.wait_task_rescheduled(
        lambda _: trio.lowlevel.Abort.FAILED)
