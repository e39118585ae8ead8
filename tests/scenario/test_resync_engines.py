"""Issue 18 part 3 across engines: with resync_grace the churn scenario (link cuts and
restores, a region restart) gives the same counts and deliveries under the replay,
memory and tcp engines, delivers everything, and sends fewer advisories than without."""

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
_CACHE: dict = {}


def run(engine: str, grace: float):
    if (engine, grace) not in _CACHE:
        sc = load_scenario(SCENARIOS / "churn.toml")
        tree = sc.mode("tree")
        mode = dataclasses.replace(tree, options={**tree.options, "resync_grace": grace})
        sc = dataclasses.replace(sc, modes=(mode,))
        plan = build_plan(sc)
        rec = Recorder(plan, Lines())
        figures = engine_class(engine)(plan, mode, rec).run()["outcome"]
        _CACHE[engine, grace] = dict(rec.counts), rec.delivery_map(), figures
    return _CACHE[engine, grace]


class TestResyncAcrossEngines:
    def test_replay_delivers_everything_with_fewer_advisories(self):
        """Same deliveries as without resync, fewer advisory frames (the cut store's
        and region's interest is not re-sent)."""
        counts, deliveries, figures = run("replay", 30.0)
        plain_counts, plain_deliveries, plain_figures = run("replay", 0.0)
        assert deliveries == plain_deliveries
        assert figures["stranded"] == 0 and figures["duplicates"] == 0
        assert counts["advisory.sent"] < plain_counts["advisory.sent"]

    @pytest.mark.slow
    @pytest.mark.parametrize("engine", ("memory", "tcp"))
    def test_live_engines_match_replay(self, engine):
        """Real BrokerNodes (hello options over the codec): same counts and deliveries."""
        counts, deliveries, _ = run(engine, 30.0)
        ref_counts, ref_deliveries, _ = run("replay", 30.0)
        assert deliveries == ref_deliveries
        for event in ("advisory.sent", "advisory.received", "demand.created",
                      "demand.removed"):
            assert counts.get(event) == ref_counts.get(event), event
