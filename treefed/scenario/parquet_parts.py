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

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from treefed import events

__all__ = ["ARROW_TYPES", "ROW_GROUP_LINES", "arrow_schema", "coded_schema", "ParquetParts",
           "Coder", "CODE_COLUMNS", "EVENT_CODES", "CODES_FILE", "HOT_EVENTS", "OLD_HOT_EVENTS",
           "REST_FILE",
           "DEMAND_FILE", "DEMAND_COLUMNS", "demand_schema", "S8_HOT_EVENTS",
           "MESSAGE_EVENTS", "MESSAGE_FILE", "MESSAGE_COLUMNS", "message_schema", "part_name",
           "parquet_problems", "run_key"]

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


#: The event names ``event_code`` numbers, in this order (frozen: a new event goes at the
#: end; the job reads a run's codes only when its codes file lists these names).
EVENT_CODES: tuple[str, ...] = tuple(events.EVENTS)

#: Integer columns appended after the events.py fields (additive: a reader that knows
#: only the events.py schema reads the parts as before).  Per row:
#:   ``event_code``  2 x the event's index in EVENT_CODES, + 1 when ``kind`` is set and
#:                   is not ``add`` (an advisory's removal); null for an unknown event
#:   ``broker_code`` the run's index of ``broker`` (the broker dictionary)
#:   ``origin_code`` the broker-dictionary index of ``origin``, or of the ``consumer``
#:                   id's part before its first ``/`` when there is no origin (job.py's
#:                   advisory origin)
#:   ``dst_code``    the run's index of ``dst`` (the destination dictionary); negative
#:                   (-1, -2, ...) for a wildcard destination (``*`` or ``>`` in it)
#:   ``run_key``     the run's key (``run_key``), the same on every row
#:   ``consumer_code`` the run's index of ``consumer`` (the consumer dictionary)
#:   ``msg_code``    the run's index of ``msg`` (the message dictionary)
#:   ``peer_code``   the broker-dictionary index of ``peer``
#: The dictionaries are written at close to ``CODES_FILE``; summary.json lists it.
#: (Runs written before ``msg_code`` and ``peer_code`` have the first six columns only.)
CODE_COLUMNS: dict[str, pa.DataType] = {
    "event_code": pa.int32(), "broker_code": pa.int32(), "origin_code": pa.int32(),
    "dst_code": pa.int32(), "run_key": pa.int64(), "consumer_code": pa.int32(),
    "msg_code": pa.int32(), "peer_code": pa.int32(),
}
CODES_FILE = "events.codes.json"

#: The events the job counts by their codes alone (99.7 % of make run's rows: advisories
#: of TTL meshes, then messages produced, forwarded and delivered, link, consumer-added
#: and stranded events: what the job needs of them is the event, broker, consumer, ts,
#: and of the messages their destination, message and peer codes).  Every other row (and
#: such a row without a broker, or with a wildcard destination) is also copied to
#: REST_FILE, so the job reads the strings of ~0.3 % of the rows: a Parquet reader
#: decodes every column it selects for every row, whatever a filter later keeps.  The
#: codes file records the list (``hot``): the job reads runs written with S8_HOT_EVENTS
#: or OLD_HOT_EVENTS by that list.
HOT_EVENTS: tuple[str, ...] = ("advisory.sent", "advisory.received", "advisory.dropped",
                               "demand.created", "demand.removed", "link.up", "link.down",
                               "consumer.added", "consumer.removed", "message.stranded",
                               "message.dropped", "message.produced", "message.forwarded",
                               "message.delivered")
#: The hot list of runs written before the messages were hot (no MESSAGE_FILE, no
#: msg_code / peer_code columns).
S8_HOT_EVENTS: tuple[str, ...] = HOT_EVENTS[:11]
#: The hot list of runs written before the link, consumer and stranded events were hot.
OLD_HOT_EVENTS: tuple[str, ...] = HOT_EVENTS[:4]
REST_FILE = "events.rest.parquet"

#: The hot demand.created rows' DEMAND_COLUMNS again, in a file of their own: the job's
#: per-consumer sums (passes._demand_counts, on the driver) read them there (5 % of make
#: run's rows) instead of scanning every row of the parts for them.  The codes file lists it
#: (``demand``: file, rows); a run without it is read from its parts as before.
DEMAND_FILE = "events.demand.parquet"
DEMAND_COLUMNS: tuple[str, ...] = ("run_key", "consumer_code", "ts")

#: The hot message rows' MESSAGE_COLUMNS again, in a file of their own (2.4 % of make
#: run's rows): the (broker, destination) pairs a broker sends to, each delivered copy
#: and each forward, which the job reads there by integers on the driver instead of by
#: their strings in the rest file.  The codes file lists it (``messages``: file, rows)
#: when the hot list has MESSAGE_EVENTS.
MESSAGE_EVENTS: tuple[str, ...] = ("message.produced", "message.forwarded",
                                   "message.delivered")
MESSAGE_FILE = "events.messages.parquet"
MESSAGE_COLUMNS: tuple[str, ...] = ("run_key", "event_code", "broker_code", "dst_code",
                                    "msg_code", "peer_code", "consumer_code")


def demand_schema() -> pa.Schema:
    """DEMAND_FILE's columns, typed as in coded_schema."""
    coded = coded_schema()
    return pa.schema([coded.field(n) for n in DEMAND_COLUMNS])


def message_schema() -> pa.Schema:
    """MESSAGE_FILE's columns, typed as in coded_schema."""
    coded = coded_schema()
    return pa.schema([coded.field(n) for n in MESSAGE_COLUMNS])


def coded_schema() -> pa.Schema:
    """The events.py schema followed by CODE_COLUMNS."""
    return pa.schema(list(arrow_schema()) + [pa.field(n, t) for n, t in CODE_COLUMNS.items()])


def run_key(run_id: str) -> int:
    """A 62-bit key of a run id (blake2b): the same run directory read twice has the same
    key, which the job notices and reads that run without its codes."""
    return int.from_bytes(hashlib.blake2b(run_id.encode(), digest_size=8).digest(),
                          "big") >> 2


class Coder:
    """Appends CODE_COLUMNS to a run's row groups, one dictionary per run across them."""

    _EVENT_INDEX = {name: i for i, name in enumerate(EVENT_CODES)}

    def __init__(self, run_id: str) -> None:
        self.key = run_key(run_id)
        self.brokers: dict[str, int] = {}
        self.dsts: dict[str, int] = {}
        self.consumers: dict[str, int] = {}
        self.msgs: dict[str, int] = {}
        self._wild = 0

    def _broker(self, name: str) -> int:
        code = self.brokers.get(name)
        if code is None:
            code = self.brokers[name] = len(self.brokers)
        return code

    def _consumer(self, name: str) -> int:
        code = self.consumers.get(name)
        if code is None:
            code = self.consumers[name] = len(self.consumers)
        return code

    def _msg(self, name: str) -> int:
        code = self.msgs.get(name)
        if code is None:
            code = self.msgs[name] = len(self.msgs)
        return code

    def _dst(self, name: str) -> int:
        code = self.dsts.get(name)
        if code is None:
            if "*" in name or ">" in name:
                self._wild += 1
                code = -self._wild
            else:
                code = len(self.dsts) - self._wild
            self.dsts[name] = code
        return code

    @staticmethod
    def _mapped(column: pa.ChunkedArray, lookup) -> pa.Array:
        """Each value's code by ``lookup`` (called once per distinct value); nulls stay."""
        encoded = column.combine_chunks().dictionary_encode()
        codes = pa.array([lookup(v) for v in encoded.dictionary.to_pylist()], pa.int32())
        return codes.take(encoded.indices)

    def encode(self, table: pa.Table) -> pa.Table:
        """``table`` (the events.py schema) with CODE_COLUMNS appended."""
        index = self._EVENT_INDEX
        event = self._mapped(table.column("event"), index.get)
        kind = table.column("kind")
        removal = pc.fill_null(pc.and_(pc.is_valid(kind), pc.not_equal(kind, "add")), False)
        event = pc.add(pc.multiply(event, 2), pc.cast(removal, pa.int32()))
        consumer = table.column("consumer")
        before_slash = pc.list_element(pc.split_pattern(consumer, "/", max_splits=1), 0)
        origin = pc.coalesce(table.column("origin"), before_slash)
        columns = {
            "event_code": event,
            "broker_code": self._mapped(table.column("broker"), self._broker),
            "origin_code": self._mapped(origin, self._broker),
            "dst_code": self._mapped(table.column("dst"), self._dst),
            "run_key": pa.array([self.key] * len(table), pa.int64()),
            "consumer_code": self._mapped(consumer, self._consumer),
            "msg_code": self._mapped(table.column("msg"), self._msg),
            # after the origins: a peer new to the run gets the next broker code
            "peer_code": self._mapped(table.column("peer"), self._broker),
        }
        for name, values in columns.items():
            table = table.append_column(pa.field(name, CODE_COLUMNS[name]),
                                        pc.cast(values, CODE_COLUMNS[name]))
        return table

    @staticmethod
    def _hot(table: pa.Table, events: tuple[str, ...]) -> pa.ChunkedArray:
        """Which rows of an encoded table are hot for ``events``: one of them, with a
        broker and no wildcard destination."""
        these = pc.is_in(pc.shift_right(table.column("event_code"), 1),
                         pa.array([EVENT_CODES.index(e) for e in events], pa.int32()))
        hot = pc.and_(pc.fill_null(these, False), pc.is_valid(table.column("broker_code")))
        # a wildcard destination is pass 1's (a pattern), whatever the event
        plain = pc.fill_null(pc.greater_equal(table.column("dst_code"), 0), True)
        return pc.and_(hot, plain)

    @classmethod
    def rest(cls, table: pa.Table, hot: tuple[str, ...] = HOT_EVENTS) -> pa.Table:
        """The rows of an encoded table that are not hot (``hot``: the hot list; an older
        one gives the rest file an older runner wrote)."""
        return table.filter(pc.invert(cls._hot(table, hot)))

    @classmethod
    def demand(cls, table: pa.Table) -> pa.Table:
        """DEMAND_COLUMNS of an encoded table's hot demand.created rows."""
        return table.filter(cls._hot(table, ("demand.created",))).select(list(DEMAND_COLUMNS))

    @classmethod
    def messages(cls, table: pa.Table) -> pa.Table:
        """MESSAGE_COLUMNS of an encoded table's hot MESSAGE_EVENTS rows."""
        return table.filter(cls._hot(table, MESSAGE_EVENTS)).select(list(MESSAGE_COLUMNS))

    def write(self, folder: Path, rest_rows: int, demand_rows: int | None = None,
              message_rows: int | None = None) -> str:
        """Write the dictionaries (and REST_FILE's, DEMAND_FILE's and MESSAGE_FILE's row
        counts) to ``folder/CODES_FILE``; return its name."""
        data = {"run_key": self.key, "events": list(EVENT_CODES), "hot": list(HOT_EVENTS),
                "rest": {"file": REST_FILE, "rows": rest_rows},
                "brokers": sorted(self.brokers, key=self.brokers.__getitem__),
                "consumers": sorted(self.consumers, key=self.consumers.__getitem__),
                "msgs": sorted(self.msgs, key=self.msgs.__getitem__),
                "dsts": {name: code for name, code in self.dsts.items()}}
        if demand_rows is not None:
            data["demand"] = {"file": DEMAND_FILE, "rows": demand_rows}
        if message_rows is not None:
            data["messages"] = {"file": MESSAGE_FILE, "rows": message_rows}
        tmp = folder / (CODES_FILE + ".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, folder / CODES_FILE)
        return CODES_FILE


def part_name(n: int) -> str:
    """``events.part-0000.parquet``, ``events.part-0001.parquet``, ..."""
    return f"events.part-{n:04d}.parquet"


class _SideFile:
    """One of a coded run's files beside its parts (REST_FILE, DEMAND_FILE, MESSAGE_FILE):
    opened with the first chunk, a row group per chunk that has rows (an empty row group
    makes Spark's reader warn, once per split), its rows counted."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.path = path
        self.schema = schema
        self.rows = 0
        self._writer: pq.ParquetWriter | None = None

    def write(self, table: pa.Table) -> None:
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, self.schema, compression="snappy")
        if len(table):
            self._writer.write_table(table, row_group_size=len(table))
            self.rows += len(table)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def discard(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


class ParquetParts:
    """Parquet parts of one run's event log, fed with chunks of JSON lines (bytes)."""

    def __init__(self, folder: str | Path, *, part_lines: int = 0,
                 row_group_lines: int = ROW_GROUP_LINES, run_id: str | None = None) -> None:
        self.folder = Path(folder)
        self._schema = arrow_schema()
        self._parse = pa_json.ParseOptions(explicit_schema=self._schema,
                                           unexpected_field_behavior="ignore")
        # with a run id, the parts also carry CODE_COLUMNS and close() writes CODES_FILE
        self.coder = Coder(run_id) if run_id is not None else None
        self._out_schema = coded_schema() if self.coder is not None else self._schema
        #: the codes file's name once written (close), else None
        self.codes: str | None = None
        # the coded run's rest, demand and message files
        self._rest = _SideFile(self.folder / REST_FILE, self._out_schema)
        self._demand = _SideFile(self.folder / DEMAND_FILE, demand_schema())
        self._messages = _SideFile(self.folder / MESSAGE_FILE, message_schema())
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
        if self.coder is not None:
            table = self.coder.encode(table)
            self._rest.write(self.coder.rest(table))
            self._demand.write(self.coder.demand(table))
            self._messages.write(self.coder.messages(table))
        if self._writer is None:
            name = part_name(len(self.parts))
            self._writer = pq.ParquetWriter(self.folder / name, self._out_schema,
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
        self.codes = None
        for side in (self._rest, self._demand, self._messages):
            side.discard()
        self._close_part()
        for name, _ in self.parts:
            (self.folder / name).unlink(missing_ok=True)
        self.parts = []

    def close(self) -> None:
        """Write what is pending and close the open part (and write the codes file).
        Idempotent."""
        if self.error is None:
            self._flush()
        self._close_part()
        for side in (self._rest, self._demand, self._messages):
            side.close()
        if self.error is None and self.coder is not None and self.parts:
            self.codes = self.coder.write(self.folder, self._rest.rows, self._demand.rows,
                                          self._messages.rows)

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
