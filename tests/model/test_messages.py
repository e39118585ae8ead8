"""Messages in the model: delivered or stranded (and where), per sender -> destination,
against the replay engine on the default scenarios' workload sends and against live
in-process Sites on random trees and meshes."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from treefed.model.exact import Estate, Group, Link, NotModelled
from treefed.model.messages import Send, route, route_plan, summarise
from treefed.model.truth import replay_messages
from treefed.federation.settings import LinkSettings, TreeSettings
from treefed.scenario.compare import MODELLED, find_scenario, with_compared_modes
from treefed.scenario.spec import load_scenario
from treefed.scenario.workload import build_plan

from tests.model.randomestate import DSTS, mesh_cases, tree_cases


def _compare(scenario: str) -> dict:
    sc = with_compared_modes(load_scenario(find_scenario(scenario)))
    plan = build_plan(sc)
    figures = {}
    # the model computes MODELLED modes only (not the tree-summary / tree-resync variants)
    for mode in (m for m in sc.modes if m.label in MODELLED):
        outcomes = route_plan(plan, mode)
        truth = replay_messages(plan, mode)
        assert len(outcomes) == len(truth) - 1 > 0
        for o in outcomes:
            t = truth[o.send.id]
            assert (min(o.delivered, t["units"]), o.delivered_at, o.stranded_at) == \
                (t["delivered"], t["delivered_at"], t["stranded_at"]), (mode.label, o.send)
        summary = summarise(outcomes, {m: t["units"] for m, t in truth.items() if m})
        outcome = truth[None]["outcome"]
        assert (summary["expected"], summary["delivered"], summary["stranded"]) == \
            (outcome["expected"], outcome["delivered"], outcome["stranded"]), mode.label
        figures[mode.label] = summary
    return figures


@pytest.mark.parametrize("scenario", ["retail-small", "sweep-size-4x0005", "sweep-size-4x0025",
                                      "sweep-depth-3", "churn", "reconfigure"])
def test_messages_equal_replay_on_default_scenarios(scenario):
    _compare(scenario)


def test_hand_checked_retail_small():
    """retail-small (HQ, 2 regions, 5 stores each; 10 HQ->store, 10 store->HQ, 10
    store->store, 1 broadcast to 10 stores = 40 units): TTL 1 strands every queue message
    at its sender; TTL 2 delivers all but the 7 whose route needs 3 hops (store->store
    across regions, waiting at the sender); the tuned mesh strands the 10 store->store."""
    f = _compare("retail-small")
    assert f["tree"]["delivered"] == 40 and f["tree"]["stranded"] == 0
    assert (f["mesh-ttl1"]["delivered"], f["mesh-ttl1"]["stranded"]) == (0, 30)
    assert (f["mesh-ttl2"]["delivered"], f["mesh-ttl2"]["stranded"]) == (33, 7)
    assert (f["mesh-tuned"]["delivered"], f["mesh-tuned"]["stranded"]) == (30, 10)


def test_chain_strands_where_the_ttl_ends():
    """a - b - c - d, mesh TTL 2 duplex, consumer at d: interest reaches c and b, not a;
    a message sent at b is delivered, at a it waits at a."""
    s = LinkSettings(kind="mesh", name="m", duplex=True, network_ttl=2)
    estate = Estate(("a", "b", "c", "d"), (Link("b", "a", s), Link("c", "b", s),
                                           Link("d", "c", s)))
    out = route(estate, [Group("d", "queue://Q", 1, name="g")],
                [Send("1", "b", "queue://Q"), Send("2", "a", "queue://Q")])
    assert (out[0].delivered_at, out[0].path) == ("d", ("b", "c", "d"))
    assert (out[1].delivered_at, out[1].stranded_at) == (None, "a")


def test_tree_climbs_without_demand():
    """A tree leaf with no demand sends a queue message up (route_unknown_up); the root
    with no consumer anywhere keeps it: stranded at the root."""
    estate = Estate(("r", "x", "y"),
                    (Link("x", "r", LinkSettings(kind="tree", name="t", node_type="leaf")),
                     Link("y", "r", LinkSettings(kind="tree", name="t", node_type="leaf"))),
                    {"r": None, "x": TreeSettings("leaf"), "y": TreeSettings("leaf")},
                    frozenset({"r"}))
    out = route(estate, [Group("y", "queue://Q", 1, name="g")],
                [Send("1", "x", "queue://Q"), Send("2", "x", "queue://Nobody")])
    assert out[0].delivered_at == "y" and out[0].path == ("x", "r", "y")
    assert out[1].stranded_at == "r"


def test_selectors_are_refused_not_guessed():
    s = LinkSettings(kind="mesh", name="m", duplex=True)
    estate = Estate(("a", "b"), (Link("b", "a", s),))
    with pytest.raises(NotModelled):
        route(estate, [Group("b", "queue://Q", 1, selector="x = 1", name="g")],
              [Send("1", "a", "queue://Q")])


# -- property tests: live Sites ------------------------------------------------------

def _live_outcomes(case, sends):
    """Send each message alone at its broker and run to quiet: where it was delivered
    (Deliver frames) and where it waits (the broker whose depth of the dst grew)."""
    live = case.live()
    out = []
    for i, (b, d) in enumerate(sends):
        mid = f"m{i}"
        before = {s: live.held(s, d) for s in live.sites}
        live.send(b, d, mid)
        live.run_until_quiet()
        got = [(site, f.sub) for (site, _conn), box in live.inbox.items() for f in box
               if f.msg == mid]
        grew = [s for s in live.sites if live.held(s, d) > before[s]]
        out.append((len(got), sorted({site for site, _ in got}), grew))
    return out


def _model_outcomes(case, sends):
    outcomes = route(case.estate, case.groups(),
                     [Send(f"m{i}", b, d) for i, (b, d) in enumerate(sends)])
    return [(len(o.deliveries) if o.send.dst.startswith("topic://") else o.delivered,
             sorted({b for b, _ in o.deliveries}) if o.send.dst.startswith("topic://")
             else ([o.delivered_at] if o.delivered_at else []),
             [o.stranded_at] if o.stranded_at else []) for o in outcomes]


def _sends(draw, brokers):
    return draw(st.lists(st.tuples(st.sampled_from(brokers), st.sampled_from(DSTS)),
                         min_size=1, max_size=6))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mesh_cases(), st.data())
def test_messages_equal_live_sites_on_random_meshes(case, data):
    sends = _sends(data.draw, case.estate.brokers)
    try:
        model = _model_outcomes(case, sends)
    except NotModelled:
        assume(False)
    assert model == _live_outcomes(case, sends)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree_cases(), st.data())
def test_messages_equal_live_sites_on_random_trees(case, data):
    sends = _sends(data.draw, case.estate.brokers)
    assert _model_outcomes(case, sends) == _live_outcomes(case, sends)


def test_members_of_a_group_take_turns():
    """Regression (found by the property test): two local consumers of one queue are two
    consumers in the core's round robin, not one -- b1's second message goes to its
    second local consumer, not over the link to b0."""
    s = LinkSettings(kind="mesh", name="m", duplex=False, network_ttl=1)
    estate = Estate(("b0", "b1"), (Link("b1", "b0", s),))
    groups = [Group("b0", "queue://A", 1, name="x"), Group("b1", "queue://A", 2, name="y")]
    out = route(estate, groups, [Send("1", "b1", "queue://A"), Send("2", "b1", "queue://A"),
                                 Send("3", "b1", "queue://A")])
    assert [o.delivered_at for o in out] == ["b1", "b1", "b0"]
