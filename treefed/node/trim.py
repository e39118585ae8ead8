"""Give the heap a broker freed back to the kernel once it goes idle (issue #14: RSS).

Theory of operation
-------------------
CPython frees small objects into its own arenas and larger blocks into glibc's heap; both
keep the pages.  After start-up (imports build and drop much temporary data) and after a
burst of messages (queues filled and drained) a broker holds several MiB of free heap in
its RSS: ~2.5 MiB at start, 5-10 MiB after a 100,000-message run.  glibc's
``malloc_trim(0)`` returns the free pages of every arena to the kernel (``madvise``).

``trim_when_idle`` watches the node's batch counter: once the site task has handled
batches and then none for ``IDLE_TRIM_S`` seconds, it trims once, in a worker thread
(ctypes drops the GIL for the call, so the site task keeps serving while it runs).  A
busy broker is never trimmed; an idle one is trimmed once per quiet spell, not again
until it has worked.  Where there is no glibc (``malloc_trim`` missing) it does nothing.

Under ``PYTHONMALLOC=malloc`` it runs a full ``gc.collect()`` before the trim: that also
empties the interpreter's free lists (tuples, floats, lists, dicts kept for reuse), whose
blocks would otherwise keep their pages.  What the trim cannot return are pymalloc's 1 MiB arenas that still hold a
live object: after a 100,000-message backlog a few hundred long-lived objects made
meanwhile (a cached SQLite statement, cancel scopes, connection records) keep ~45 MiB of
arenas resident.  A broker started with ``PYTHONMALLOC=malloc`` has no arenas: there the
collection + trim return the drained backlog page by page (bench/broker_memory.py
``--allocator malloc``: settled 43.5 against 77.4 MiB) at ~30 % more CPU per
non-persistent message (issue #14; see the README's memory section).
"""

from __future__ import annotations

import ctypes
import functools
import gc
import os
from collections.abc import Callable
from typing import Any

import trio

__all__ = ["IDLE_TRIM_S", "malloc_trim", "trim_when_idle"]

#: Seconds without a site-task batch before a broker that worked gives memory back.
IDLE_TRIM_S = 2.0

#: A full collection before each trim, where it pays: under ``PYTHONMALLOC=malloc``
#: (pymalloc's arenas keep the free-list blocks' pages anyway; the collection holds the
#: GIL, and a big broker's takes long enough to delay the first message after a pause).
COLLECT_FIRST = os.environ.get("PYTHONMALLOC", "").startswith("malloc")


@functools.cache
def _trim_function() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None)
    except OSError:  # pragma: no cover - no dynamic loader symbols
        return None
    fn = getattr(libc, "malloc_trim", None)   # glibc only
    if fn is not None:
        fn.argtypes = [ctypes.c_size_t]
        fn.restype = ctypes.c_int
    return fn


def malloc_trim() -> bool:
    """Return the free heap to the kernel now; False where that is not possible."""
    fn = _trim_function()
    if fn is None:
        return False
    fn(0)
    return True


async def trim_when_idle(node: Any, idle: float = IDLE_TRIM_S) -> None:
    """Run beside ``node.serve``: trim after start-up and after each busy spell once the
    site task has handled no batch for ``idle`` seconds (never while it works)."""
    if _trim_function() is None:
        return
    trimmed_at: int | None = None   # the batch count at the last trim
    last = node.batches
    while True:
        await trio.sleep(idle)
        now = node.batches
        if now == last and now != trimmed_at:
            if COLLECT_FIRST:
                gc.collect()   # also empties the free lists, whose blocks pin pages
            await trio.to_thread.run_sync(malloc_trim)
            trimmed_at = now
        last = now
