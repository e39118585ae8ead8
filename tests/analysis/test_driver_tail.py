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


def test_local_tables_are_written_as_spark_lays_them_out(tmp_path) -> None:
    """The collected tables written by pyarrow: NAME.parquet/ with one part and _SUCCESS,
    Spark's types, an earlier table replaced (Spark's overwrite)."""
    import pyarrow.parquet as pq
    from pyspark.sql import types as T

    schema = T.StructType([T.StructField("run", T.StringType(), False),
                           T.StructField("n", T.LongType()),
                           T.StructField("share", T.DoubleType()),
                           T.StructField("tier", T.IntegerType())])
    rows = [{"run": "a", "n": 3, "share": 0.5, "tier": 1, "extra": "left out"},
            {"run": "b", "n": None, "share": None, "tier": None}]
    stale = tmp_path / "runs.parquet"
    stale.mkdir()
    (stale / "part-00000-old.snappy.parquet").write_bytes(b"old")
    job._write_local_tables(str(tmp_path), {"runs": job._arrow_table(rows, schema)})
    files = sorted(p.name for p in stale.iterdir())
    assert files[0] == "_SUCCESS" and len(files) == 2
    assert files[1].startswith("part-00000-") and files[1].endswith("-c000.snappy.parquet")
    table = pq.read_table(stale / files[1])
    assert [str(t) for t in table.schema.types] == ["string", "int64", "double", "int32"]
    assert [f.nullable for f in table.schema] == [False, True, True, True]
    assert table.to_pylist() == [{"run": "a", "n": 3, "share": 0.5, "tier": 1},
                                 {"run": "b", "n": None, "share": None, "tier": None}]
