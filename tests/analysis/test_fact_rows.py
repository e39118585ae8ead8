"""passes._fact_rows: the collected fact table as Python rows, a batch at a time (no Spark)."""

from __future__ import annotations

import pyarrow as pa

from treefed.analysis.passes import _fact_rows


def _table(n: int) -> pa.Table:
    return pa.table({
        "n": list(range(1, n + 1)),            # columns in another order than the rows'
        "tag": ["P", "C", "M"] * (n // 3) + ["P"] * (n % 3),
        "run": [None if i == 4 else f"run-{i % 2}" for i in range(n)],
        "broker": [None if i % 5 == 0 else f"store-{i % 3}" for i in range(n)],
        "a": [f"c/{i}" for i in range(n)],
        "b": [None] * n,
        "ts": [float(i % 4) for i in range(n)],
        "code": [i % 64 for i in range(n)],
    })


def test_rows_are_the_tables_rows_in_order_across_batches():
    table = _table(10)
    names = ("tag", "run", "broker", "a", "b", "ts", "code", "n")
    want = list(zip(*(table.column(c).to_pylist() for c in names)))
    assert list(_fact_rows(table, batch_rows=3)) == want
    assert list(_fact_rows(table)) == want


def test_run_and_broker_ids_are_one_object_each():
    rows = list(_fact_rows(_table(10), batch_rows=3))
    runs = {id(r[1]) for r in rows if r[1] == "run-0"}
    brokers = {id(r[2]) for r in rows if r[2] == "store-1"}
    assert len(runs) == 1 and len(brokers) == 1
