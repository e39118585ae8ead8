"""``treefed model --mode mesh-tuned``: the tuned baseline the report compares (store
uplinks limited by ``dynamically_included``) is modelled too, and per broker its figures
equal the replay engine's first convergence (issue 19: every mode the report runs)."""

from __future__ import annotations

import csv

from treefed.model.cli import main
from treefed.model.exact import estate_from_topology
from treefed.model.truth import replay_counts
from treefed.scenario.compare import find_scenario, with_compared_modes
from treefed.scenario.spec import load_scenario
from treefed.scenario.workload import build_plan


def test_mesh_tuned_model_equals_replay_per_broker(tmp_path):
    out = tmp_path / "m"
    assert main(["retail-small", "--engine", "exact", "--mode", "mesh-tuned",
                 "--out", str(out)]) == 0
    with (out / "brokers-mesh-tuned.csv").open() as fh:
        model = {r["broker"]: r for r in csv.DictReader(fh)}
    sc = with_compared_modes(load_scenario(find_scenario("retail-small")))
    plan = build_plan(sc)
    mode = next(m for m in sc.modes if m.label == "mesh-tuned")
    truth = replay_counts(plan, mode).per_broker(
        estate_from_topology(plan.topology, mode).brokers)
    assert set(model) == set(truth)
    for broker, row in truth.items():
        for figure, value in row.items():
            assert int(model[broker].get(figure) or 0) == value, (broker, figure)
    # the filters matter: the estate hears less than under plain TTL 2
    ttl2 = next(m for m in sc.modes if m.label == "mesh-ttl2")
    plain = replay_counts(plan, ttl2).per_broker(truth)
    assert 0 < sum(r["adds_received"] for r in truth.values()) < \
        sum(r["adds_received"] for r in plain.values())
