"""The Spark job on the runner's Parquet parts: the same tables as from the JSON lines,
a damaged part refused (exit 2, the run named, nothing written), the JSON lines read
when a run has no parts."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "retail-small.toml"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    from treefed.scenario.runner import run_scenario

    root = tmp_path_factory.mktemp("parquet-runs")
    return [r.path for r in run_scenario(SCENARIO, engine="replay", out=root)]


def json_only(runs: list[Path], root: Path) -> list[Path]:
    """Copies of the runs under the same names, without Parquet parts (an older run)."""
    copies = []
    for run in runs:
        copy = root / run.name
        shutil.copytree(run, copy, ignore=shutil.ignore_patterns("*.parquet"))
        summary = json.loads((copy / "summary.json").read_text())
        del summary["parquet_parts"]
        (copy / "summary.json").write_text(json.dumps(summary))
        copies.append(copy)
    return copies


def report(dirs: list[Path], out: Path, *extra: str) -> tuple[int, str]:
    from treefed.analysis import job

    complained = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(complained):
        status = job.main([str(d) for d in dirs] + ["--out", str(out), *extra])
    return status, complained.getvalue()


def test_parts_are_chosen_when_listed(runs, tmp_path):
    from treefed.analysis.job import _parquet_rows, parquet_parts

    assert [Path(p).name for p in parquet_parts(str(runs[0]))] == ["events.part-0000.parquet"]
    events = sum(json.loads((r / "summary.json").read_text())["events"] for r in runs)
    assert _parquet_rows([str(r) for r in runs]) == events
    (plain,) = json_only(runs[:1], tmp_path)
    assert parquet_parts(str(plain)) is None


@pytest.mark.spark
@pytest.mark.slow
def test_parquet_and_json_give_identical_tables(spark, runs, tmp_path):
    """runs.csv and per_role.csv byte for byte: the Parquet path and the JSON-lines
    fallback (the same runs, parts removed) read the same events."""
    plain = json_only(runs, tmp_path / "plain")
    assert report(runs, tmp_path / "p")[0] == 0
    assert report(plain, tmp_path / "j")[0] == 0
    for name in ("runs.csv", "per_role.csv"):
        assert (tmp_path / "p" / name).read_bytes() == (tmp_path / "j" / name).read_bytes()
    rows = (tmp_path / "p" / "runs.csv").read_text().splitlines()
    assert len(rows) == 4 and ",40,40,1.0," in rows[1] + rows[2] + rows[3]


@pytest.mark.spark
@pytest.mark.slow
def test_damaged_parts_are_refused(spark, runs, tmp_path):
    """A part cut in half (no footer) and a part whose data pages are overwritten (the
    footer intact): both runs named, exit 2, no report folder -- never a stack trace.
    With --allow-partial the cut run is read from its JSON lines and flagged."""
    dirs = []
    for run in runs:
        shutil.copytree(run, tmp_path / run.name)
        dirs.append(tmp_path / run.name)
    cut = next(d for d in dirs if "-mesh-ttl1-" in d.name) / "events.part-0000.parquet"
    data = cut.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    smashed = next(d for d in dirs if "-mesh-ttl2-" in d.name) / "events.part-0000.parquet"
    import pyarrow.parquet as pq

    data = bytearray(smashed.read_bytes())
    group = pq.read_metadata(smashed).row_group(0)
    # every column's pages (the job reads `event` or, coded, `event_code`): footer intact
    for k in range(group.num_columns):
        chunk = group.column(k)
        start = chunk.dictionary_page_offset or chunk.data_page_offset
        data[start:start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    smashed.write_bytes(bytes(data))
    out = tmp_path / "report"
    # a footer that does not read: refused before Spark starts
    status, err = report(dirs, out)
    assert status == 2, err
    assert "Traceback" not in err
    (line,) = [x for x in err.splitlines() if "retail-small-mesh-ttl" in x]
    assert "retail-small-mesh-ttl1" in line
    assert "events.part-0000.parquet is unreadable" in line
    assert "retail-small-tree-" not in err and not out.exists()
    # pages that do not read: Spark skips the file, the rows are short of summary.json
    status, err = report([dirs[0], smashed.parent], out)
    assert status == 2, err
    assert "Traceback" not in err
    said = [x for x in err.splitlines() if "retail-small-mesh-ttl2" in x]
    # (0 rows read; with the integer codes the run's intact rest file still is)
    assert any("log truncated: " in x for x in said), err
    assert "retail-small-tree-" not in err and not out.exists()
    # the cut run alone, allowed partial: its JSON lines are read, the run is flagged
    status, err = report([dirs[0], cut.parent], out, "--allow-partial")
    assert status == 0, err
    import csv

    with (out / "runs.csv").open() as f:
        (row,) = [r for r in csv.DictReader(f) if r["mode"] == "mesh-ttl1"]
    assert "events.part-0000.parquet is unreadable" in row["problems"]
    # every line read, from the JSON log
    assert int(row["lines"]) == int(row["summary_lines"]) > 0 and row["finished"] == "1"
