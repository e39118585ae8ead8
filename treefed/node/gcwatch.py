"""The broker process's cyclic garbage collector: start-up frozen, passes counted (issue #14).

Theory of operation
-------------------
A broker's per-message objects (frames, messages, actions, Outs) are acyclic: reference
counting frees them and the cyclic collector finds nothing to collect in them (a pass
during the 1,000 msgs/s latency runs of issue #14 collected 0 objects).  Its passes are
pure pauses, and each runs on the one thread that serves every connection.  What they
cost, measured on this project's 2-vCPU VM:

* young passes (``BrokerNode.serve`` raises the threshold to ``GC_YOUNG_THRESHOLD``,
  node.py "Garbage collection"): at 1,000 msgs/s the young count grows by ~0.5-0.8 per
  message (free lists), so a young pass comes every ~15,000 messages and takes 0.6-1.1
  ms cold: no factor at the 99th percentile (0 of the slowest 1 % overlapped one);
* full passes walk every tracked object of the process, and ~37,000 of them are the
  start-up's -- imports, config, the listeners -- which never become garbage: a full
  pass over an idle broker takes 8-10 ms, every time one comes.

``freeze_start_up`` -- called once by the broker process (``run.serve_until_signal``)
when the node serves: one full collection, then ``gc.freeze()``.  The start-up's
objects move to the permanent generation, which no pass scans again: a full pass of
the idle broker drops from 8-10 ms to ~0 ms, and what a later one walks is only what
the broker made since (its queues).  In-process estates (the scenario engines: thousands
of nodes in one process) do not call it: a full collection per node would be quadratic,
and the replay engine freezes its estate itself (scenario/engines/replay.py).  What is
frozen is still freed by reference counting when it dies (a restored backlog drains as
usual); only an object alive at the freeze that later ends in a reference cycle is never
collected -- a one-time, bounded amount (the collection before the freeze takes the
start-up's own garbage).

``GcWatch`` -- ``gc.callbacks`` counting the passes per generation, their total and
longest pause (installed by the broker process only, after the freeze: the passes while
it serves; a callback costs ~1 µs per pass).
``statistics()`` -- the process's collector in the broker's ``stat`` reply (``gc``):
thresholds, frozen objects, passes per generation, and the watch's pauses when one is
installed.
"""

from __future__ import annotations

import gc
import time
from typing import Any

__all__ = ["GcWatch", "freeze_start_up", "statistics", "watch"]


class GcWatch:
    """Passes per generation, total and longest pause (seconds), from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.passes = [0, 0, 0]
        self.paused = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]
        self._began = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        took = time.perf_counter() - self._began
        gen = info["generation"]
        self.passes[gen] += 1
        self.paused[gen] += took
        if took > self.longest[gen]:
            self.longest[gen] = took

    def install(self) -> GcWatch:
        if self not in gc.callbacks:
            gc.callbacks.append(self)
        return self

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)

    def figures(self) -> dict:
        return {"passes": list(self.passes),
                "pause_total_ms": [round(p * 1e3, 3) for p in self.paused],
                "pause_max_ms": [round(p * 1e3, 3) for p in self.longest]}


#: The process's watch, once ``watch()`` installed it (the broker process only).
_WATCH: GcWatch | None = None


def watch() -> GcWatch:
    """Install (once) and return the process-wide watch."""
    global _WATCH
    if _WATCH is None:
        _WATCH = GcWatch().install()
    return _WATCH


def freeze_start_up() -> int:
    """Collect once, then move every object alive now to the permanent generation.
    Returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def statistics() -> dict[str, Any]:
    """The process's collector: thresholds, frozen objects, passes per generation
    (``gc.get_stats``), and pauses when the watch is installed."""
    out: dict[str, Any] = {"threshold": list(gc.get_threshold()),
                           "frozen": gc.get_freeze_count(),
                           "collections": [s["collections"] for s in gc.get_stats()]}
    if _WATCH is not None:
        out.update(_WATCH.figures())
    return out
