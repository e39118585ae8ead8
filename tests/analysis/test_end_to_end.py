"""retail-small through the scenario runner and the Spark job: the report agrees with
what the runner counted itself."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from pathlib import Path

import pytest

from treefed.analysis import job

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "retail-small.toml"
# Figures both the runner's summary.json and the job's runs.csv carry.
SHARED = ("brokers", "links", "advisory_frames", "advisory_receipts", "demand_created",
          "expected", "delivered", "duplicates", "stranded")


class TestRetailSmall:
    def test_report_matches_run_summaries(self, spark, tmp_path):
        """Every mode's headline figures in runs.csv equal the runner's summary.json."""
        from treefed.scenario.runner import run_scenario

        results = run_scenario(SCENARIO, engine="replay", out=tmp_path / "runs")
        out = tmp_path / "report"
        with contextlib.redirect_stdout(io.StringIO()):
            assert job.main([str(r.path) for r in results] + ["--out", str(out)]) == 0
        with (out / "runs.csv").open() as f:
            rows = {r["run"]: r for r in csv.DictReader(f)}
        assert set(rows) == {r.run_id for r in results}
        for result in results:
            summary = json.loads((result.path / "summary.json").read_text())
            row = rows[result.run_id]
            assert {k: int(row[k]) for k in SHARED} == {k: summary[k] for k in SHARED}, \
                result.run_id
            assert (row["scenario"], row["mode"]) == (summary["scenario"], summary["mode"])
            assert row["bad_lines"] == "0"
        for name in ("report.md", "index.html", "per_role.csv", "spill.png", "roles.png",
                     "ttl.png"):
            assert (out / name).is_file(), name
        # retail-small is not part of the controlled size sweep: no scale plot from it
        assert not (out / "scale.png").exists()
        page = (out / "index.html").read_text()
        assert "retail-small" in page and "mesh-ttl2" in page
