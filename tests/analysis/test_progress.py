"""Spark stage progress lines, from a stand-in StatusTracker (the real one is exercised
by every `main` run in test_job.py / test_integrity.py)."""

from __future__ import annotations

import io
import time
from types import SimpleNamespace

from treefed.analysis.progress import StageProgress, describe


class Tracker:
    def __init__(self):
        self.active = [12, 11]
        self.done = 3

    def getActiveStageIds(self):
        return self.active

    def getStageInfo(self, stage):
        return SimpleNamespace(numCompletedTasks=stage - 10, numTasks=8)

    def getJobIdsForGroup(self, group):
        return list(range(self.done + 1))

    def getJobInfo(self, job):
        return SimpleNamespace(status="SUCCEEDED" if job < self.done else "RUNNING")


def test_describe():
    assert describe(Tracker()) == "Spark: 3 jobs done; stage 11: 1/8 tasks, " \
                                  "stage 12: 2/8 tasks"
    idle = Tracker()
    idle.active = []
    assert describe(idle) == ""
    busy = Tracker()
    busy.active = [11, 12, 13, 14, 15]
    assert describe(busy).endswith("stage 13: 3/8 tasks, +2 more stages")


def test_prints_changes_only_on_new_lines_when_not_a_terminal():
    out = io.StringIO()
    tracker = Tracker()
    with StageProgress(tracker, every=0.02, stream=out):
        time.sleep(0.2)
        tracker.active = [13]
        time.sleep(0.2)
    lines = out.getvalue().splitlines()
    assert lines == ["Spark: 3 jobs done; stage 11: 1/8 tasks, stage 12: 2/8 tasks",
                     "Spark: 3 jobs done; stage 13: 3/8 tasks"]


def test_exit_without_enter_is_harmless():
    StageProgress(Tracker()).__exit__()
