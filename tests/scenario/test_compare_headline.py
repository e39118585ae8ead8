"""`treefed compare`'s default set includes 4 x 1,000 stores: emulated where the replay
fits make run's memory budget, modelled (exact, with messages) in the other modes."""

from __future__ import annotations

import csv

from rich.console import Console

from treefed.scenario import compare
from treefed.scenario.spec import load_scenario


def _load(name):
    return compare.with_compared_modes(load_scenario(compare.find_scenario(name)))


def test_default_set_has_the_headline_estate():
    assert compare.HEADLINE == "sweep-size-4x1000"
    assert compare.HEADLINE in compare.DEFAULT_SCENARIOS


def test_headline_is_split_into_emulated_and_modelled_modes():
    scenarios = [_load("sweep-size-4x0005"), _load(compare.HEADLINE)]
    kept, modelled = compare.split_headline(scenarios)
    assert [m.label for m in kept[0].modes] == [m.label for m in scenarios[0].modes]
    assert [m.label for m in kept[1].modes] == ["tree", "mesh-ttl1", "mesh-tuned-oneway",
                                                "nats-isolated", "tree-summary",
                                                "tree-resync"]
    assert modelled == [(compare.HEADLINE, ["mesh-ttl2", "mesh-ttl3", "mesh-tuned"])]


def test_only_modelled_modes_are_asked_of_the_model(monkeypatch):
    """A headline mode the model does not compute (a tree variant, were it not emulated
    there) is never passed to ``treefed model``: it would exit 2 on an unknown --mode."""
    monkeypatch.setattr(compare, "HEADLINE_EMULATED", ("tree",))
    _, modelled = compare.split_headline([_load(compare.HEADLINE)])
    assert modelled == [(compare.HEADLINE, ["mesh-ttl1", "mesh-ttl2", "mesh-ttl3",
                                            "mesh-tuned", "mesh-tuned-oneway",
                                            "nats-isolated"])]
    assert set(modelled[0][1]) <= set(compare.MODELLED)


def test_modelled_modes_are_written_for_the_report(tmp_path):
    dirs = compare.run_models([("retail-small", ["mesh-ttl2", "mesh-tuned"])], tmp_path,
                              Console(file=open("/dev/null", "w")), sweep=False)
    assert dirs == [str(tmp_path / "model-retail-small")]
    with open(tmp_path / "model-retail-small" / "runs.csv") as fh:
        rows = {r["mode"]: r for r in csv.DictReader(fh)}
    assert set(rows) == {"mesh-ttl2", "mesh-tuned"}
    assert all(r["source"] == "model" for r in rows.values())
    # hand-checked in tests/model/test_messages.py
    assert (rows["mesh-ttl2"]["delivered"], rows["mesh-ttl2"]["stranded"]) == ("33", "7")
    assert (rows["mesh-tuned"]["delivered"], rows["mesh-tuned"]["stranded"]) == ("30", "10")


def test_a_model_failure_stops_the_comparison(tmp_path):
    assert compare.run_models([("no-such-scenario", ["mesh-ttl2"])], tmp_path,
                              Console(file=open("/dev/null", "w")), sweep=False) is None
