"""The scenario runner's second copy of a run's events: Parquet parts in the events.py schema.

Theory of operation
-------------------
The JSON lines (``events*.jsonl.gz``) stay the brokers' format; the Spark job reads them
at ~200,000 lines/s on two cores, most of it spent decoding JSON.  A scenario run also
writes ``events.part-NNNN.parquet``: columnar, typed, one column per
``events.FIELD_TYPES`` field, so the job reads only the columns it uses and decodes no
text.

``ParquetParts`` is handed the same byte chunks of JSON lines the event writer's helper
thread compresses (``EventWriter(tee=...)``), gathers them to ``ROW_GROUP_LINES`` lines
and has pyarrow's C++ JSON reader parse them against the explicit schema (it releases
the GIL, so the run goes on meanwhile) into one row group.  Nothing is held beyond one
row group.  A part ends after ``part_lines`` rows, like the JSON parts.  ``parts`` lists
``(file name, rows)``; the runner records it in summary.json (``parquet_parts``), and
the job refuses a run whose parts do not hold those rows (``parquet_problems``) -- the
row counts are what the JSON path's line count against ``events`` is for the text log.

A chunk pyarrow cannot parse (it never happens with the runner's own lines) stops the
Parquet copy: the parts written so far are removed and ``error`` says why, so the run
keeps only its JSON lines and the job reads those.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from treefed import events

__all__ = ["ARROW_TYPES", "ROW_GROUP_LINES", "arrow_schema", "ParquetParts",
           "part_name", "parquet_problems"]

ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
}
#: Lines parsed into one row group (about 20 MB of JSON text at most in memory; small
#: enough that little is left to parse when the run closes its log).
ROW_GROUP_LINES = 65_536


def arrow_schema() -> pa.Schema:
    """Every events.FIELD_TYPES field, in its order, nullable."""
    return pa.schema([pa.field(name, ARROW_TYPES[kind])
                      for name, kind in events.FIELD_TYPES.items()])


def part_name(n: int) -> str:
    """``events.part-0000.parquet``, ``events.part-0001.parquet``, ..."""
    return f"events.part-{n:04d}.parquet"


class ParquetParts:
    """Parquet parts of one run's event log, fed with chunks of JSON lines (bytes)."""

    def __init__(self, folder: str | Path, *, part_lines: int = 0,
                 row_group_lines: int = ROW_GROUP_LINES) -> None:
        self.folder = Path(folder)
        self._schema = arrow_schema()
        self._parse = pa_json.ParseOptions(explicit_schema=self._schema,
                                           unexpected_field_behavior="ignore")
        self._part_lines = part_lines
        self._group_lines = row_group_lines
        self._pending: list[bytes] = []
        self._pending_lines = 0
        self._writer: pq.ParquetWriter | None = None
        self._rows = 0                       # rows of the open part
        self.parts: list[tuple[str, int]] = []
        self.error: str | None = None

    def write(self, chunk: bytes) -> None:
        """Take whole JSON lines (one chunk of the event writer)."""
        if self.error is not None:
            return
        self._pending.append(chunk)
        self._pending_lines += chunk.count(b"\n")
        if self._pending_lines >= self._group_lines:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        self._pending_lines = 0
        try:
            table = pa_json.read_json(
                io.BytesIO(data),
                read_options=pa_json.ReadOptions(use_threads=False,
                                                 block_size=max(1 << 20, len(data) + 1)),
                parse_options=self._parse)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            self._abandon(f"a chunk did not parse: {exc}")
            return
        table = table.select(self._schema.names).cast(self._schema)
        if self._writer is None:
            name = part_name(len(self.parts))
            self._writer = pq.ParquetWriter(self.folder / name, self._schema,
                                            compression="snappy")
            self.parts.append((name, 0))
        self._writer.write_table(table, row_group_size=max(len(table), 1))
        self._rows += len(table)
        self.parts[-1] = (self.parts[-1][0], self._rows)
        if self._part_lines and self._rows >= self._part_lines:
            self._close_part()

    def _close_part(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._rows = 0

    def _abandon(self, why: str) -> None:
        self.error = why
        self._close_part()
        for name, _ in self.parts:
            (self.folder / name).unlink(missing_ok=True)
        self.parts = []

    def close(self) -> None:
        """Write what is pending and close the open part. Idempotent."""
        if self.error is None:
            self._flush()
        self._close_part()

    @property
    def rows(self) -> int:
        return sum(n for _, n in self.parts)


def parquet_problems(run_dir: str | Path, summary: dict[str, Any]) -> list[str]:
    """Why the Parquet parts summary.json lists are not the run's whole log (empty: they
    are): each part must exist, have a readable footer with this schema's columns, hold
    the rows listed, and the rows must add up to ``events``."""
    parts = summary.get("parquet_parts")
    if not parts:
        return []
    problems: list[str] = []
    total = 0
    folder = Path(run_dir)
    wanted = set(events.FIELD_TYPES)
    for entry in parts:
        try:
            name, rows = str(entry["file"]), int(entry["rows"])
        except (TypeError, KeyError, ValueError):
            return [f"summary.json parquet_parts entry {entry!r} is not {{file, rows}}"]
        path = folder / name
        if "/" in name or not path.is_file():
            problems.append(f"Parquet part {name} is missing")
            continue
        try:
            meta = pq.read_metadata(path)
        except (OSError, pa.ArrowException) as exc:
            problems.append(f"Parquet part {name} is unreadable (truncated or corrupt: "
                            f"{exc})")
            continue
        missing = wanted - set(meta.schema.names)
        if missing:
            problems.append(f"Parquet part {name} lacks columns {', '.join(sorted(missing))}")
        if meta.num_rows != rows:
            problems.append(f"Parquet part {name} holds {meta.num_rows:,} rows, "
                            f"summary.json lists {rows:,}")
        total += meta.num_rows
    want = summary.get("events")
    if not problems and want is not None and total != int(want):
        problems.append(f"Parquet parts hold {total:,} rows, summary.json counts "
                        f"{int(want):,} events")
    return problems
