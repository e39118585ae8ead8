"""The exact model against the brokers' own code: the replay engine on every default
scenario's first convergence, and live in-process Sites on random trees and meshes."""

from __future__ import annotations

import concurrent.futures
import multiprocessing

import pytest
from hypothesis import HealthCheck, assume, given, settings

from treefed.federation.settings import LinkSettings
from treefed.model.exact import Estate, Group, Link, NotModelled, estate_from_topology, \
    groups_from_consumers, propagate
from treefed.model.truth import replay_counts
from treefed.scenario.compare import MODELLED, find_scenario, with_compared_modes
from treefed.scenario.spec import load_scenario
from treefed.scenario.workload import build_plan

from tests.model.randomestate import live_counts, mesh_cases, tree_cases


def _figures(plan, mode) -> tuple[dict, dict, int]:
    """The model's and the replay's per-broker counts of ``mode``, and the adds the
    model received."""
    estate = estate_from_topology(plan.topology, mode)
    model = propagate(estate, groups_from_consumers(plan.consumers))
    truth = replay_counts(plan, mode)
    return (model.per_broker(estate.brokers), truth.per_broker(estate.brokers),
            sum(model.adds_received.values()))


def _scenario(name: str):
    sc = with_compared_modes(load_scenario(find_scenario(name)))
    # the model computes MODELLED modes only (not the tree-summary / tree-resync variants)
    return sc, [m for m in sc.modes if m.label in MODELLED]


def _mode_figures(name: str, label: str) -> tuple[dict, dict, int]:
    """``_figures`` of one mode, in a worker process (which builds the plan itself)."""
    sc, modes = _scenario(name)
    return _figures(build_plan(sc), next(m for m in modes if m.label == label))


def _compare(name: str, *, workers: int = 0) -> None:
    """``workers``: the modes are independent, CPU-bound pure-Python runs; on that many
    processes they use the machine's cores instead of one (0: all in this process)."""
    sc, modes = _scenario(name)
    labels = [m.label for m in modes]
    if workers:
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            figures = list(pool.map(_mode_figures, [name] * len(labels), labels))
    else:
        plan = build_plan(sc)
        figures = [_figures(plan, mode) for mode in modes]
    for label, (model, truth, adds) in zip(labels, figures, strict=True):
        assert model == truth, label
        assert adds > 0, label


@pytest.mark.parametrize("scenario", ["retail-small", "churn", "deep", "reconfigure"])
def test_model_equals_replay_on_default_scenarios(scenario):
    _compare(scenario)


@pytest.mark.slow
def test_model_equals_replay_on_retail_4x250():
    _compare("retail-4x250", workers=2)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mesh_cases())
def test_model_equals_live_sites_on_random_meshes(case):
    live = case.live()
    try:
        model = propagate(case.estate, case.groups())
    except NotModelled:
        assume(False)
    assert model.per_broker(case.estate.brokers) == \
        live_counts(live).per_broker(case.estate.brokers)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree_cases())
def test_model_equals_live_sites_on_random_trees(case):
    live = case.live()
    model = propagate(case.estate, case.groups())
    assert model.per_broker(case.estate.brokers) == \
        live_counts(live).per_broker(case.estate.brokers)


def test_ttl_boundaries_on_a_chain():
    # a - b - c - d, duplex, TTL 2: b and c hold demand for a's consumer, d does not;
    # c refuses to pass it on (logged at c, the sender of a duplex link)
    s = LinkSettings(duplex=True, network_ttl=2)
    est = Estate(("a", "b", "c", "d"), (Link("b", "a", s), Link("c", "b", s),
                                        Link("d", "c", s)))
    m = propagate(est, [Group("a", "queue://Q", 3)])
    assert dict(m.demand) == {"b": 1, "c": 3}     # b: one conduit; c: one per consumer
    assert m.dropped["c", "ttl"] == 3
    assert m.adds_received.get("d", 0) == 0


def test_a_displacing_route_is_reported_not_guessed():
    # b hears a's consumer directly at priority -5 (decreasing link), then through c at
    # priority 0: the later route outranks the kept one -- the model says so
    dec = LinkSettings(name="d", duplex=True, decrease_network_consumer_priority=True,
                       suppress_duplicate_queue_subscriptions=True)
    plain = LinkSettings(name="p", duplex=True, network_ttl=2,
                         suppress_duplicate_queue_subscriptions=True)
    est = Estate(("a", "b", "c"), (Link("a", "b", dec), Link("a", "c", plain),
                                   Link("c", "b", plain)))
    with pytest.raises(NotModelled):
        propagate(est, [Group("a", "queue://Q")])


def test_limit_is_reported_not_guessed():
    s = LinkSettings(duplex=True, max_demand_per_link=2)
    est = Estate(("a", "b"), (Link("b", "a", s),))
    with pytest.raises(NotModelled):
        propagate(est, [Group("a", "queue://Q", 3)])


def test_bad_estates_are_refused():
    with pytest.raises(ValueError):
        Estate(("a",), (Link("a", "z", LinkSettings()),))
    with pytest.raises(ValueError):
        Estate(("a", "a"), ())
