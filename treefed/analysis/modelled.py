"""Modelled estates in the report: ``treefed model`` output read as runs rows.

Theory of operation
-------------------
``treefed model ... --out DIR`` (a single estate or a ``--sweep``) writes ``DIR/runs.csv``
in the report's runs schema (``job.RUN_COLUMNS``) plus a trailing ``source`` column
(``model``).  ``read_model_runs`` reads such files back into rows typed as the Spark
job's own rows are (integers, floats, None for an empty cell -- a figure the model does
not compute), so ``report.render`` treats them like emulated runs; every emulated row
gets ``source = emulated`` (``mark_emulated``) and the report marks modelled rows in
every table and draws them as curves in the scale plot.

A file that is missing, or whose header is not the runs schema, is refused with a
``ValueError`` naming the file and the problem -- before Spark starts.  Pure but for
reading the files.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Iterable, Sequence

__all__ = ["SOURCE", "read_model_runs", "mark_emulated", "INT_COLUMNS", "FLOAT_COLUMNS"]

#: the column that says where a row came from: "model" or "emulated"
SOURCE = "source"

INT_COLUMNS = frozenset({
    "ttl", "brokers", "links", "regions", "stores_per_region", "depth", "consumers",
    "advisory_frames", "advisory_receipts", "spilled_advisories", "demand_created",
    "wasted_demand", "max_demand_per_broker", "expected", "delivered", "deliveries",
    "duplicates", "stranded", "lines", "bad_lines", "dropped", "lost", "summary_lines",
    "sibling_spill", "downward_spill", "fault_events"})
FLOAT_COLUMNS = frozenset({
    "advisories_per_consumer", "delivery_ratio", "convergence_median_s",
    "convergence_p99_s", "run_wall_s", "run_peak_rss_mb", "recovery_max_s"})


def _typed(column: str, text: str, where: str) -> object:
    if text == "":
        return None
    try:
        if column in INT_COLUMNS:
            return int(text)
        if column in FLOAT_COLUMNS:
            return float(text)
    except ValueError:
        raise ValueError(f"{where}: {column} = {text!r} is not a number") from None
    if column == "finished":
        return text.lower() == "true"
    return text


def read_model_runs(dirs: Iterable[str | Path], columns: Sequence[str]) -> list[dict]:
    """Rows of every ``DIR/runs.csv`` (``DIR`` may also name the file itself), typed;
    ``columns`` is the report's runs schema, which each file must carry (plus
    ``source``)."""
    rows: list[dict] = []
    for d in dirs:
        path = Path(d)
        if path.is_dir():
            path = path / "runs.csv"
        if not path.is_file():
            raise ValueError(f"{d}: no runs.csv (write one with treefed model ... --out DIR)")
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            missing = [c for c in (*columns, SOURCE) if c not in header]
            if missing:
                raise ValueError(f"{path}: not a model runs.csv (missing columns: "
                                 f"{', '.join(missing[:5])}"
                                 + (f", +{len(missing) - 5} more" if len(missing) > 5 else "")
                                 + ")")
            for i, raw in enumerate(reader, start=2):
                where = f"{path}:{i}"
                if raw[SOURCE] != "model":
                    raise ValueError(f"{where}: source is {raw[SOURCE]!r}, not 'model'")
                rows.append({c: _typed(c, raw[c], where) for c in (*columns, SOURCE)})
    return rows


def mark_emulated(runs: list[dict]) -> list[dict]:
    """Every row without a source is an emulated run."""
    for r in runs:
        if not r.get(SOURCE):
            r[SOURCE] = "emulated"
    return runs
