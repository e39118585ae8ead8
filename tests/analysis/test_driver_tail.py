"""The job's serial tail on the driver (passes._assemble, _runs_rows): the runs table
sorted on the driver as Spark sorts it, both percentiles from one summary.  No Spark:
tests/analysis/test_passes.py checks the whole tables against the stage plan's."""

from __future__ import annotations

import random

from treefed.analysis import job, passes


def test_runs_are_sorted_like_spark_orders_them() -> None:
    """Ascending, nulls first, tree runs (ttl null) before the meshes of a size."""
    def row(run, scenario, brokers, ttl, mode):
        return {"run": run, "scenario": scenario, "brokers": brokers, "ttl": ttl,
                "mode": mode}

    given = [
        row("r9", "sweep", 20, 2, "mesh-ttl2"),
        row("r8", "sweep", 20, 1, "mesh-ttl1"),
        row("r7", "sweep", 20, None, "tree"),
        row("r6", "sweep", 20, None, "tree-resync"),
        row("r5", "sweep", None, None, "tree"),
        row("r4", None, 5, 1, "mesh-ttl1"),
        row("r3", "Sweep", 5, 1, "mesh-ttl1"),        # upper case sorts first (bytes)
        row("r2", "sweep", 100, 1, "mesh-ttl1"),
        row("r1", "sweep", 20, 1, "mesh-ttl1"),       # a tie but for the run
        row("r0", "sweep", 20, None, None),
    ]
    expected = ["r4", "r3", "r5", "r0", "r7", "r6", "r1", "r8", "r9", "r2"]
    for seed in range(3):
        random.Random(seed).shuffle(given)
        assert [r["run"] for r in sorted(given, key=passes._runs_order)] == expected
    assert job.RUNS_ORDER[:2] == ("scenario", "brokers")


def test_both_percentiles_from_one_summary() -> None:
    rng = random.Random(7)
    for size in (1, 2, 4999, 5001, 50001, 120000):
        values = [rng.choice((rng.random() * 50, float(rng.randint(0, 9))))
                  for _ in range(size)]
        assert passes.spark_percentiles(values, (0.5, 0.99)) == [
            passes.spark_percentile(values, 0.5), passes.spark_percentile(values, 0.99)]
    assert passes.spark_percentiles([], (0.5, 0.99)) == [None, None]
    ranked = [float(v) for v in range(1, 101)]
    assert passes.spark_percentiles(ranked, (0.5, 0.99)) == [50.0, 99.0]
