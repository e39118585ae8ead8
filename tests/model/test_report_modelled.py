"""Modelled estates in the report: `treefed model --messages` rows equal the emulated
report's rows figure by figure, `treefed report --model DIR` shows them marked in every
table, and the scale plot draws model curves with emulated points."""

from __future__ import annotations

import csv
import re

import pytest

from treefed.analysis import report
from treefed.analysis.job import RUN_COLUMNS
from treefed.analysis.modelled import mark_emulated, read_model_runs
from treefed.model.cli import main as model_main

#: every figure a modelled run row has, compared with the emulated report's row
COMPARED = ("brokers", "links", "consumers", "advisory_frames", "advisory_receipts",
            "spilled_advisories", "sibling_spill", "downward_spill", "demand_created",
            "wasted_demand", "max_demand_per_broker", "expected", "delivered", "stranded",
            "stranded_at", "dropped", "lost")


def _model(tmp_path, scenario, *modes, extra=()):
    out = tmp_path / "model"
    argv = [scenario, "--engine", "exact", "--messages", "--no-brokers", "--out", str(out),
            *extra]
    for m in modes:
        argv += ["--mode", m]
    assert model_main(argv) == 0
    return out


def test_model_runs_csv_reads_back_typed(tmp_path):
    out = _model(tmp_path, "retail-small", "tree", "mesh-ttl1", "mesh-ttl2")
    rows = read_model_runs([out], RUN_COLUMNS)
    by = {r["mode"]: r for r in rows}
    assert set(by) == {"tree", "mesh-ttl1", "mesh-ttl2"}
    assert all(r["source"] == "model" and r["engine"] == "model" for r in rows)
    # hand-checked (tests/model/test_messages.py): 40 expected units
    assert (by["tree"]["expected"], by["tree"]["delivered"], by["tree"]["stranded"]) == \
        (40, 40, 0)
    assert (by["mesh-ttl1"]["delivered"], by["mesh-ttl1"]["stranded"],
            by["mesh-ttl1"]["dropped"]) == (0, 30, 10)
    assert by["mesh-ttl2"]["ttl"] == 2 and by["tree"]["ttl"] is None
    assert by["mesh-ttl1"]["convergence_median_s"] is None   # not modelled: empty
    assert isinstance(by["mesh-ttl2"]["advisories_per_consumer"], float)
    # the per sender -> destination file
    with (out / "messages-mesh-ttl2.csv").open() as fh:
        msgs = list(csv.DictReader(fh))
    assert len(msgs) == 31 and sum(1 for m in msgs if m["stranded_at"]) == 7


def test_bad_model_input_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no runs.csv"):
        read_model_runs([tmp_path], RUN_COLUMNS)
    (tmp_path / "runs.csv").write_text("run,mode\nx,tree\n")
    with pytest.raises(ValueError, match="missing columns"):
        read_model_runs([tmp_path], RUN_COLUMNS)
    header = ",".join((*RUN_COLUMNS, "source"))
    blank = "," * len(RUN_COLUMNS)
    (tmp_path / "runs.csv").write_text(f"{header}\n{blank}emulated\n")
    with pytest.raises(ValueError, match="not 'model'"):
        read_model_runs([tmp_path], RUN_COLUMNS)
    row = ["x"] * len(RUN_COLUMNS) + ["model"]
    (tmp_path / "runs.csv").write_text(f"{header}\n{','.join(row)}\n")
    with pytest.raises(ValueError, match="is not a number"):
        read_model_runs([tmp_path], RUN_COLUMNS)


def test_report_marks_modelled_rows_everywhere(tmp_path):
    out = _model(tmp_path, "retail-small", "tree", "mesh-ttl2")
    modelled = read_model_runs([out], RUN_COLUMNS)
    emulated = [dict(r, source=None, run="emu:" + r["run"], engine="replay",
                     scenario="retail-small") for r in modelled if r["mode"] == "tree"]
    rows = mark_emulated(emulated) + modelled
    assert emulated[0]["source"] == "emulated"
    written = report.render(rows, [], tmp_path / "report")
    md = written["report"].read_text()
    for section in ("## Headline", "## What each mode costs", "## Accounting", "## All runs"):
        part = md.split(section, 1)[1].split("\n## ", 1)[0]
        assert "mesh-ttl2 [model]" in part, section
        assert "| tree |" in part or "| tree [model] |" in part, section
    assert "Rows marked [model]" in md
    page = written["html"].read_text()
    assert page.count("mesh-ttl2 [model]") >= 4


def test_scale_plot_draws_model_lines_and_emulated_points():
    from matplotlib.figure import Figure

    drawn = []
    real = Figure.savefig

    def grab(fig, *a, **k):
        drawn.append(fig)
        return real(fig, *a, **k)

    rows = []
    for stores in (5, 25, 100, 250, 1000, 25000):
        for source in ("model", "emulated"):
            if source == "emulated" and stores > 1000:
                continue
            rows.append({"scenario": f"sweep-size-4x{stores:04d}", "mode": "mesh-ttl2",
                         "ttl": 2, "brokers": 5 + 4 * stores, "regions": 4,
                         "stores_per_region": stores, "demand_created": stores * stores,
                         "advisory_receipts": 2 * stores * stores, "source": source})
    Figure.savefig = grab
    try:
        assert report.plot_scale(rows) is not None
    finally:
        Figure.savefig = real
    ax = drawn[0].axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    model, emulated = lines["mesh-ttl2 (model)"], lines["mesh-ttl2 (emulated)"]
    assert model.get_linestyle() == "-" and emulated.get_linestyle() == "None"
    assert list(model.get_xdata()) == [20, 100, 400, 1000, 4000, 100000]
    assert list(emulated.get_xdata()) == [20, 100, 400, 1000, 4000]
    assert ax.get_xlabel() == "stores (all regions)"


@pytest.mark.slow
@pytest.mark.spark
def test_model_rows_equal_the_emulated_report(tmp_path, spark):
    """sweep-size-4x0005 in every compared mode: emulated (replay engine + the Spark
    job) and modelled (--messages) runs.csv rows agree on every figure the model
    computes; `treefed report --model` puts both in one runs.csv with their source."""
    from treefed.analysis import job
    from treefed.scenario.compare import MODELLED, find_scenario, with_compared_modes
    from treefed.scenario.runner import run_scenario
    from treefed.scenario.spec import load_scenario

    sc = with_compared_modes(load_scenario(find_scenario("sweep-size-4x0005")))
    results = run_scenario(sc, engine="replay", out=str(tmp_path / "runs"))
    # the model computes MODELLED only (tree-summary / tree-resync are emulated only)
    modes = [m.label for m in sc.modes if m.label in MODELLED]
    assert {m.label for m in sc.modes} - set(modes) == {"tree-summary", "tree-resync"}
    model = _model(tmp_path, "sweep-size-4x0005", *modes)
    out = tmp_path / "report"
    assert job.main([str(r.path) for r in results]
                    + ["--out", str(out), "--model", str(model)]) == 0
    with (out / "runs.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    emulated = {r["mode"]: r for r in rows if r["source"] == "emulated"}
    modelled = {r["mode"]: r for r in rows if r["source"] == "model"}
    assert set(emulated) == {m.label for m in sc.modes}
    assert set(modelled) == set(modes)
    for mode in modes:
        for c in COMPARED:
            assert emulated[mode][c] == modelled[mode][c], (mode, c)
    assert re.search(r"mesh-ttl2 \[model\]", (out / "report.md").read_text())


def test_one_walk_for_figures_and_messages(tmp_path):
    """--engine exact --messages takes its per-broker figures from the message batches
    (one walk): they equal the plain exact walk's, broker by broker."""
    plain = tmp_path / "plain"
    assert model_main(["sweep-size-4x0005", "--engine", "exact", "--out", str(plain),
                       "--mode", "mesh-ttl2", "--mode", "mesh-tuned"]) == 0
    both = _model(tmp_path, "sweep-size-4x0005", "mesh-ttl2", "mesh-tuned",
                  extra=("--messages",))
    for mode in ("mesh-ttl2", "mesh-tuned"):
        with (plain / f"brokers-{mode}.csv").open() as fh:
            a = list(csv.DictReader(fh))
    assert not list(both.glob("brokers-*.csv"))     # --no-brokers
    rows_a = {r["mode"]: r for r in csv.DictReader((plain / "model.csv").open())}
    rows_b = {r["mode"]: r for r in csv.DictReader((both / "model.csv").open())}
    for mode in ("mesh-ttl2", "mesh-tuned"):
        for k in ("adds_sent", "adds_received", "demand", "interest", "dropped_ttl",
                  "max_demand", "brokers", "consumers"):
            assert rows_a[mode].get(k) == rows_b[mode].get(k), (mode, k)
    assert a
