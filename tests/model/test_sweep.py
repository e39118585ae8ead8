"""``treefed model --sweep``: sizes, the report-schema rows, the plot and page (exact
engine: no Spark needed for the wiring; the Spark engine is the same model_rows)."""

from __future__ import annotations

import csv
import json

import pytest

from treefed.model.cli import main
from treefed.model.sweep import RUN_COLUMNS, parse_sizes


def test_run_columns_are_the_reports():
    pytest.importorskip("pyspark")
    from treefed.analysis.job import RUN_COLUMNS as REPORT

    assert RUN_COLUMNS == REPORT


def test_sizes_spread_over_regions_and_bad_totals_are_refused():
    assert parse_sizes("10,100,1000", 10) == [1, 10, 100]
    assert parse_sizes("10", 4) == [2]
    with pytest.raises(ValueError, match="cannot fill"):
        parse_sizes("3", 4)
    with pytest.raises(ValueError, match="not a number"):
        parse_sizes("10,lots", 4)


def test_sweep_writes_modelled_rows_plot_and_page(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["retail-small", "--engine", "exact", "--regions", "4", "--sweep", "4,16",
                 "--mode", "tree", "--mode", "mesh-ttl2", "--out", str(out)]) == 0
    sweep = list(csv.DictReader((out / "sweep.csv").open()))
    assert [(r["stores"], r["mode"]) for r in sweep] == \
        [("4", "tree"), ("4", "mesh-ttl2"), ("16", "tree"), ("16", "mesh-ttl2")]
    runs = list(csv.DictReader((out / "runs.csv").open()))
    assert list(runs[0]) == [*RUN_COLUMNS, "source"]
    assert {r["source"] for r in runs} == {"model"} and {r["engine"] for r in runs} == {"model"}
    for s, r in zip(sweep, runs):
        assert (r["advisory_frames"], r["demand_created"], r["spilled_advisories"]) == \
            (s["adds_sent"], s["demand"], s["sibling_spill"])
        assert r["ttl"] == ("2" if s["mode"] == "mesh-ttl2" else "")
        assert r["delivered"] == "" and r["wasted_demand"] == ""    # not modelled
    big_ttl2 = runs[3]
    assert int(big_ttl2["spilled_advisories"]) > 0 and int(runs[2]["spilled_advisories"]) == 0
    assert int(big_ttl2["advisory_frames"]) > int(runs[1]["advisory_frames"])  # grows
    assert (out / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "index.html").read_text()
    assert "modelled" in page and 'src="scale.png"' in page
    assert json.loads((out / "model.json").read_text())["sweep_stores"] == [4, 16]
    assert not list(out.glob("brokers-*.csv"))


def test_sweep_usage_errors(tmp_path, capsys):
    assert main(["retail-small", "--engine", "exact", "--sweep", "5", "--out",
                 str(tmp_path / "a")]) == 2
    assert "cannot fill" in capsys.readouterr().err
    assert main(["retail-small", "--engine", "exact", "--sweep", "40",
                 "--stores-per-region", "3", "--out", str(tmp_path / "b")]) == 2
