"""The model (exact walk and Spark) for the one-way mesh and NATS-style isolated
baselines (scenario/baselines.py) on retail-small: the walk equals the replay engine's
first convergence, and Spark (stores folded into cells) equals the walk, so the modelled
rows of estates too big to emulate are right for these modes as well."""

from __future__ import annotations

import concurrent.futures

import pytest

from treefed.model.exact import estate_from_topology, groups_from_consumers, propagate
from treefed.model.spark import model_counts
from treefed.model.truth import replay_counts
from treefed.scenario.compare import find_scenario, with_compared_modes
from treefed.scenario.spec import load_scenario
from treefed.scenario.workload import build_plan

NEW = ("mesh-tuned-oneway", "nats-isolated")


def _setup(label: str):
    sc = with_compared_modes(load_scenario(find_scenario("retail-small")))
    plan = build_plan(sc)
    mode = sc.mode(label)
    return plan, mode, estate_from_topology(plan.topology, mode), \
        groups_from_consumers(plan.consumers)


@pytest.mark.parametrize("label", NEW)
def test_walk_equals_replay(label):
    plan, mode, estate, groups = _setup(label)
    model = propagate(estate, groups)
    assert model.per_broker(estate.brokers) == \
        replay_counts(plan, mode).per_broker(estate.brokers)
    # a one-way store uplink carries no advisory up: the stores' own consumers are
    # known nowhere else; isolated leaves are known to their ancestors only
    stores = [b for b in estate.brokers if b.startswith("store-")]
    sent_by_stores = sum(model.per_broker(estate.brokers)[s]["adds_sent"] for s in stores)
    assert (sent_by_stores == 0) == (label == "mesh-tuned-oneway")


def _spark_counts(spark, label):
    _, _, estate, groups = _setup(label)
    return model_counts(spark, estate, groups).per_broker(estate.brokers)


#: label -> the future of its Spark run: a run is a chain of small Spark jobs keeping
#: about one core busy, so the selected labels run side by side from the first test on
_RUNS: dict = {}


@pytest.fixture(scope="module")
def _pool():
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        yield pool
        for future in _RUNS.values():
            future.cancel()
    _RUNS.clear()


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("label", NEW)
def test_spark_cells_equal_the_walk(spark, _pool, request, label):
    for item in request.session.items:
        if item.module is request.module and getattr(item, "originalname", None) == \
                "test_spark_cells_equal_the_walk":
            other = item.callspec.params["label"]
            if other not in _RUNS:
                _RUNS[other] = _pool.submit(_spark_counts, spark, other)
    _, _, estate, groups = _setup(label)
    want = propagate(estate, groups).per_broker(estate.brokers)
    assert _RUNS[label].result() == want
