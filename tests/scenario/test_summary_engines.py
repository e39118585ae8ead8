"""Issue 18 part 2 across engines: with ``summary_budget`` the retail and churn
scenarios (churn: link cuts and restores, a region restart) deliver exactly what the
plain tree delivers -- nothing stranded, no duplicate -- with fewer advisory frames, and
the memory and tcp engines (real BrokerNodes: hello options, covers and Subtree frames
through the codec) agree with the replay engine."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from treefed.scenario.engines import engine_class
from treefed.scenario.results import Recorder
from treefed.scenario.spec import load_scenario
from treefed.scenario.workload import build_plan

from tests.scenario.test_engines import Lines

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
SUMMARY = {"summary_budget": 3, "summary_owned": ("queue://Store.{broker}.>",)}
_CACHE: dict = {}


def run(scenario: str, engine: str, summary: bool):
    key = scenario, engine, summary
    if key not in _CACHE:
        sc = load_scenario(SCENARIOS / f"{scenario}.toml")
        tree = sc.mode("tree")
        options = {**tree.options, **(SUMMARY if summary else {})}
        mode = dataclasses.replace(tree, options=options)
        sc = dataclasses.replace(sc, modes=(mode,))
        plan = build_plan(sc)
        rec = Recorder(plan, Lines())
        figures = engine_class(engine)(plan, mode, rec).run()["outcome"]
        _CACHE[key] = dict(rec.counts), rec.delivery_map(), figures
    return _CACHE[key]


class TestSummaryAcrossEngines:
    @pytest.mark.parametrize("scenario", ("retail-small", "churn", "deep"))
    def test_replay_delivers_what_the_plain_tree_delivers(self, scenario):
        counts, deliveries, figures = run(scenario, "replay", True)
        plain_counts, plain_deliveries, plain_figures = run(scenario, "replay", False)
        assert figures["stranded"] == 0 and figures["duplicates"] == 0
        assert figures["delivered"] == plain_figures["delivered"] == figures["expected"]
        assert {m: sorted(w) for m, w in deliveries.items()} == \
            {m: sorted(w) for m, w in plain_deliveries.items()}
        assert counts["advisory.sent"] < plain_counts["advisory.sent"]

    @pytest.mark.slow
    @pytest.mark.parametrize("engine", ("memory", "tcp"))
    def test_live_engines_match_replay(self, engine):
        counts, deliveries, figures = run("churn", engine, True)
        ref_counts, ref_deliveries, _ = run("churn", "replay", True)
        assert figures["stranded"] == 0 and figures["duplicates"] == 0
        assert deliveries == ref_deliveries
        for event in ("advisory.sent", "advisory.received", "demand.created",
                      "demand.removed"):
            assert counts.get(event) == ref_counts.get(event), event

    @pytest.mark.slow
    def test_procs_delivers_what_replay_delivers(self):
        """One ``treefed broker`` process per site, configs generated with the summary
        options in ``[tree_connector]``: the same deliveries as replay.  (Advisory counts
        may differ: when a subtree crosses its budget depends on the order in which
        links come up and consumers subscribe, which real processes do not fix.)"""
        _, deliveries, figures = run("retail-small", "procs", True)
        _, ref_deliveries, _ = run("retail-small", "replay", True)
        assert figures["stranded"] == 0 and figures["duplicates"] == 0
        assert deliveries == ref_deliveries
