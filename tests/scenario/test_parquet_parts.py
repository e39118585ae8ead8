"""The runner's Parquet parts (scenario/parquet_parts.py): the events.py schema, the same
rows as the JSON lines, row counts in summary.json, and what makes a part not whole."""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from treefed import events
from treefed.scenario.parquet_parts import (CODE_COLUMNS, CODES_FILE, DEMAND_COLUMNS,
                                            DEMAND_FILE, EVENT_CODES, HOT_EVENTS,
                                            MESSAGE_COLUMNS, MESSAGE_EVENTS, MESSAGE_FILE,
                                            REST_FILE, arrow_schema,
                                            coded_schema, parquet_problems)
from treefed.scenario.runner import run_scenario

SMALL = Path(__file__).resolve().parents[2] / "scenarios" / "retail-small.toml"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    (r,) = run_scenario(SMALL, out=tmp_path_factory.mktemp("runs"), modes=["mesh-ttl2"])
    return r


def _json_lines(r) -> list[dict]:
    rows = []
    for name in r.summary["log_files"]:
        with gzip.open(r.path / name, "rt") as f:
            rows += [json.loads(line) for line in f]
    return rows


def test_schema_is_the_events_schema(run):
    (part,) = run.summary["parquet_parts"]
    schema = pq.read_schema(run.path / part["file"])
    # the events.py fields first, then the job's integer columns (additive)
    assert schema.names == list(events.FIELD_TYPES) + list(CODE_COLUMNS)
    kinds = {"string": "string", "long": "int64", "double": "double", "boolean": "bool"}
    assert [str(f.type) for f in schema][:len(events.FIELD_TYPES)] == \
        [kinds[k] for k in events.FIELD_TYPES.values()]
    assert schema.equals(coded_schema())
    assert coded_schema().names[:len(events.FIELD_TYPES)] == arrow_schema().names


def test_same_rows_as_the_json_lines(run):
    """Every line, in order, each field the same value (absent = null)."""
    (part,) = run.summary["parquet_parts"]
    table = pq.read_table(run.path / part["file"], columns=list(events.FIELD_TYPES))
    assert part["rows"] == table.num_rows == run.summary["events"]
    wanted = [{f: line.get(f) for f in events.FIELD_TYPES} for line in _json_lines(run)]
    assert table.to_pylist() == wanted
    assert not parquet_problems(run.path, run.summary)


def test_code_columns_are_the_rows_strings(run):
    """Each row's integer codes name its own event, broker, origin and destination
    through the codes file's dictionaries (wildcards negative)."""
    (part,) = run.summary["parquet_parts"]
    assert run.summary["parquet_codes"] == CODES_FILE
    codes = json.loads((run.path / CODES_FILE).read_text())
    assert codes["events"] == list(EVENT_CODES)
    dsts = {code: name for name, code in codes["dsts"].items()}
    assert len(dsts) == len(codes["dsts"])
    keys = set()
    for row in pq.read_table(run.path / part["file"]).to_pylist():
        removal = row["kind"] is not None and row["kind"] != "add"
        assert row["event_code"] == 2 * EVENT_CODES.index(row["event"]) + removal
        assert codes["brokers"][row["broker_code"]] == row["broker"]
        origin = row["origin"] or (row["consumer"].split("/")[0] if row["consumer"] else None)
        assert (None if row["origin_code"] is None
                else codes["brokers"][row["origin_code"]]) == origin
        assert (None if row["dst_code"] is None else dsts[row["dst_code"]]) == row["dst"]
        if row["dst"] is not None:
            assert (row["dst_code"] < 0) == ("*" in row["dst"] or ">" in row["dst"])
        assert (None if row["consumer_code"] is None
                else codes["consumers"][row["consumer_code"]]) == row["consumer"]
        assert (None if row["msg_code"] is None
                else codes["msgs"][row["msg_code"]]) == row["msg"]
        assert (None if row["peer_code"] is None
                else codes["brokers"][row["peer_code"]]) == row["peer"]
        keys.add(row["run_key"])
    assert keys == {codes["run_key"]}
    # the demand file: the hot demand.created rows' (run_key, consumer_code, ts), in order
    created = [(r["run_key"], r["consumer_code"], r["ts"])
               for r in pq.read_table(run.path / part["file"]).to_pylist()
               if r["event"] == "demand.created" and r["broker"] is not None
               and (r["dst_code"] is None or r["dst_code"] >= 0)]
    assert created, "the fixture run creates demand"
    assert codes["demand"] == {"file": DEMAND_FILE, "rows": len(created)}
    demand = pq.read_table(run.path / DEMAND_FILE)
    assert demand.schema.names == list(DEMAND_COLUMNS)
    assert [tuple(r.values()) for r in demand.to_pylist()] == created
    # the message file: the hot message rows' MESSAGE_COLUMNS, in order
    sent = [tuple(r[c] for c in MESSAGE_COLUMNS)
            for r in pq.read_table(run.path / part["file"]).to_pylist()
            if r["event"] in MESSAGE_EVENTS and r["broker"] is not None
            and (r["dst_code"] is None or r["dst_code"] >= 0)]
    assert {"message.produced", "message.forwarded", "message.delivered"} <= {
        EVENT_CODES[r[1] >> 1] for r in sent}
    assert codes["messages"] == {"file": MESSAGE_FILE, "rows": len(sent)}
    messages = pq.read_table(run.path / MESSAGE_FILE)
    assert messages.schema.names == list(MESSAGE_COLUMNS)
    assert [tuple(r.values()) for r in messages.to_pylist()] == sent
    # the rest file: every other row, in order (link and consumer events are hot too)
    assert codes["hot"] == list(HOT_EVENTS)
    rows = pq.read_table(run.path / part["file"]).to_pylist()
    rest = [r for r in rows if not (r["event"] in HOT_EVENTS and r["broker"] is not None
                                    and (r["dst_code"] is None or r["dst_code"] >= 0))]
    assert {"link.up", "consumer.added"} <= {r["event"] for r in rows}
    assert pq.read_table(run.path / REST_FILE).to_pylist() == rest
    assert codes["rest"]["rows"] == len(rest)


def test_coder_keeps_one_dictionary_across_row_groups():
    import pyarrow as pa

    from treefed.scenario.parquet_parts import Coder

    coder = Coder("r")
    rows = [{"event": "advisory.sent", "broker": b, "dst": d, "kind": k, "consumer": c,
             "origin": None, "msg": m, "peer": p}
            for b, d, k, c, m, p in (("a", "queue://x", "add", "b/c/1", None, None),
                                     ("b", "topic://t.>", "remove", None, "m1", "b"),
                                     ("c", None, None, "zz", "m2", "p"))]
    schema = pa.schema([pa.field(n, pa.string()) for n in rows[0]])
    first = coder.encode(pa.Table.from_pylist(rows[:2], schema)).to_pylist()
    second = coder.encode(pa.Table.from_pylist(rows[1:][::-1], schema)).to_pylist()
    assert [r["broker_code"] for r in first] == [0, 1]
    assert [r["broker_code"] for r in second] == [2, 1]          # c new, b as before
    # origins share the broker dictionary (b's consumer id, then zz's)
    assert [r["origin_code"] for r in first + second] == [1, None, 3, None]
    # peers too, after the row's origin (p after zz); messages in a dictionary of their own
    assert [r["peer_code"] for r in first + second] == [None, 1, 4, 1]
    assert [r["msg_code"] for r in first + second] == [None, 0, 1, 0]
    assert list(coder.brokers) == ["a", "b", "c", "zz", "p"]
    assert [r["dst_code"] for r in first + second] == [0, -1, None, -1]
    sent = 2 * EVENT_CODES.index("advisory.sent")
    assert [r["event_code"] for r in first] == [sent, sent + 1]


def test_parts_roll_like_the_json_parts(tmp_path, monkeypatch):
    from treefed.log import EventWriter
    from treefed.scenario import parquet_parts, runner

    monkeypatch.setattr(runner, "LOG_PART_LINES", 300)
    monkeypatch.setattr(runner, "EventWriter", functools.partial(EventWriter, buffer_lines=100))
    monkeypatch.setattr(runner, "ParquetParts",
                        functools.partial(parquet_parts.ParquetParts, row_group_lines=150))
    (r,) = run_scenario(SMALL, out=tmp_path, modes=["mesh-ttl2"])
    parts = r.summary["parquet_parts"]
    assert [p["file"] for p in parts] == [f"events.part-{i:04d}.parquet"
                                          for i in range(len(parts))]
    assert len(parts) >= 2 and all(p["rows"] < 300 + 250 for p in parts) and sum(p["rows"] for p in parts) == r.summary["events"]
    rows = [row for p in parts for row in pq.read_table(r.path / p["file"]).to_pylist()]
    assert [row["ts"] for row in rows] == [line["ts"] for line in _json_lines(r)]
    assert rows[-1]["event"] == "run.finished"
    # a chunk without rest rows adds no empty row group to the rest file (Spark's Parquet
    # reader warned "Read empty block" for each: 378 lines in make run's output)
    rest = pq.ParquetFile(r.path / parquet_parts.REST_FILE).metadata
    sizes = [rest.row_group(i).num_rows for i in range(rest.num_row_groups)]
    assert sizes and 0 not in sizes, sizes
    codes = json.loads((r.path / CODES_FILE).read_text(encoding="utf-8"))
    assert sum(sizes) == codes["rest"]["rows"]


def test_parquet_false_writes_none(tmp_path):
    (r,) = run_scenario(SMALL, out=tmp_path, modes=["tree"], parquet=False)
    assert "parquet_parts" not in r.summary
    assert not list(r.path.glob("*.parquet"))


class TestProblems:
    def _copy(self, run, tmp_path) -> tuple[Path, dict]:
        import shutil

        copy = tmp_path / run.path.name
        shutil.copytree(run.path, copy)
        return copy, json.loads((copy / "summary.json").read_text())

    def test_truncated_part(self, run, tmp_path):
        copy, summary = self._copy(run, tmp_path)
        part = copy / summary["parquet_parts"][0]["file"]
        data = part.read_bytes()
        part.write_bytes(data[: len(data) // 2])
        (said,) = parquet_problems(copy, summary)
        assert "events.part-0000.parquet is unreadable" in said

    def test_missing_part(self, run, tmp_path):
        copy, summary = self._copy(run, tmp_path)
        (copy / summary["parquet_parts"][0]["file"]).unlink()
        assert parquet_problems(copy, summary) == ["Parquet part events.part-0000.parquet "
                                                   "is missing"]

    def test_rows_other_than_listed_or_counted(self, run, tmp_path):
        copy, summary = self._copy(run, tmp_path)
        n = summary["parquet_parts"][0]["rows"]
        summary["parquet_parts"][0]["rows"] = n + 1
        (said,) = parquet_problems(copy, summary)
        assert f"holds {n:,} rows, summary.json lists {n + 1:,}" in said
        summary["parquet_parts"][0]["rows"] = n
        summary["events"] = n + 5
        (said,) = parquet_problems(copy, summary)
        assert f"hold {n:,} rows, summary.json counts {n + 5:,} events" in said

    def test_none_listed_is_no_problem(self, run, tmp_path):
        copy, summary = self._copy(run, tmp_path)
        del summary["parquet_parts"]
        assert parquet_problems(copy, summary) == []
