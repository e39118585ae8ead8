"""Spark stage progress while the job runs: one line every few seconds on stderr.

Theory of operation
-------------------
A report over millions of lines runs for minutes; silence looks like a hang.  Spark's own
console bar redraws in place, which a log file (``make run > log``) turns into noise, so
``StageProgress`` polls the driver's ``StatusTracker`` from a daemon thread every
``every`` seconds and prints what changed: the active stages with their completed and
total tasks, and the jobs done so far ("Spark: 3 jobs done; stage 12: 5/8 tasks").  On a
terminal the line is redrawn in place, elsewhere it is a new line -- only when it
changed.  Reading the tracker is cheap (driver memory only) and starts no Spark work.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, TextIO

__all__ = ["StageProgress", "describe", "work_done", "SHOWN"]

#: Active stages named in one line (the rest counted): a query plan runs many at once.
SHOWN = 3


def describe(tracker: Any) -> str:
    """The progress line for a ``StatusTracker``-like object ("" when idle)."""
    stages = []
    for stage_id in sorted(tracker.getActiveStageIds()):
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            stages.append(f"stage {stage_id}: {info.numCompletedTasks}/{info.numTasks} tasks")
    if not stages:
        return ""
    if len(stages) > SHOWN:
        stages = stages[:SHOWN] + [f"+{len(stages) - SHOWN} more stages"]
    done = sum(1 for job in tracker.getJobIdsForGroup(None)
               if (j := tracker.getJobInfo(job)) is not None and j.status == "SUCCEEDED")
    return f"Spark: {done} jobs done; " + ", ".join(stages)


def work_done(tracker: Any) -> tuple[int, int]:
    """(Spark jobs, stages) the tracker has seen, skipped stages included: how many
    pieces the driver scheduled (the job prints it; bench/spark_rows.py reads it)."""
    jobs = list(tracker.getJobIdsForGroup(None))
    stages: set[int] = set()
    for job in jobs:
        info = tracker.getJobInfo(job)
        if info is not None:
            stages.update(info.stageIds)
    return len(jobs), len(stages)


class StageProgress:
    """Context manager printing ``describe`` of the tracker every ``every`` seconds."""

    def __init__(self, tracker: Any, *, every: float = 3.0,
                 stream: TextIO | None = None) -> None:
        self.tracker = tracker
        self.every = every
        self.stream = stream if stream is not None else sys.stderr
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spark-progress",
                                        daemon=True)
        self._last = ""
        self._tty = getattr(self.stream, "isatty", lambda: False)()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                line = describe(self.tracker)
            except Exception:   # the session is stopping: stop quietly
                return
            if line and line != self._last:
                self._last = line
                if self._tty:
                    self.stream.write("\r\x1b[K" + line)
                else:
                    self.stream.write(line + "\n")
                self.stream.flush()

    def __enter__(self) -> "StageProgress":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._thread.is_alive():    # never started, or already stopped
            return
        self._stop.set()
        self._thread.join(timeout=5)
        if self._tty and self._last:
            self.stream.write("\n")
            self.stream.flush()
