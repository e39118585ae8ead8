"""Link settings are validated once per distinct set of options, not once per link
(issue #14, in-process estate: every one of a 4x1000 tree's 4,004 links carried the
same options; the dialer's connector settings and the acceptor's ``from_options`` were
each validated per link).  The validated settings live in the ``Sharing`` the engine
owns (federation/ keeps no module state).  Counts, not timings."""

from __future__ import annotations

from pathlib import Path

import pytest

from treefed.errors import ConfigError
from treefed.federation.settings import LinkSettings
from treefed.federation.sharing import SETTINGS_LIMIT, Sharing
from treefed.scenario.engines.memory import MemoryEngine
from treefed.scenario.results import Recorder
from treefed.scenario.spec import load_scenario
from treefed.scenario.workload import build_plan

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


class _Lines:
    def write(self, *args) -> None:
        pass


@pytest.fixture
def validations(monkeypatch) -> list:
    """The name of every ``LinkSettings`` validated while the test runs."""
    seen: list = []
    post_init = LinkSettings.__post_init__

    def counted(self) -> None:
        seen.append(self.name)
        post_init(self)

    monkeypatch.setattr(LinkSettings, "__post_init__", counted)
    return seen


def test_a_tree_estate_validates_each_distinct_settings_once(validations) -> None:
    """retail-small's 13 sites, 12 tree links: one validation per distinct settings (a
    leaf's and a branch's connector, the acceptor's rebuilt leaf and branch settings,
    its plain settings) -- not 36 (three per link) as before, nor 16 (the acceptor's
    plain settings once per link: ``listener_settings`` shares them too)."""
    sc = load_scenario(SCENARIOS / "retail-small.toml")
    plan = build_plan(sc)
    links = len(plan.topology.brokers) - 1
    figures = MemoryEngine(plan, sc.mode("tree"), Recorder(plan, _Lines())).run()["outcome"]
    assert figures["delivered"] == figures["expected"] > 0
    assert links == 12
    assert len(validations) <= 5, validations


def test_equal_options_share_one_settings_object(validations) -> None:
    options = LinkSettings(kind="tree", name="tree", node_type="leaf",
                           dynamically_included=("queue://Store.>",)).to_options()
    sharing = Sharing()
    del validations[:]
    first = sharing.link_settings(options, duplex=False, node_type=None)
    again = sharing.link_settings(dict(options), duplex=False, node_type=None)
    assert again is first and len(validations) == 1
    assert first == LinkSettings.from_options(options, duplex=False, node_type=None)
    other = sharing.link_settings(options, duplex=True, node_type=None)
    assert other.duplex and not first.duplex
    made = sharing.new_settings(kind="mesh", name="a", excluded=("queue://x",))
    assert sharing.new_settings(kind="mesh", name="a", excluded=("queue://x",)) is made
    assert made == LinkSettings(kind="mesh", name="a", excluded=("queue://x",))
    assert Sharing().link_settings(options, duplex=False, node_type=None) is not first


def test_values_equal_in_python_but_of_another_type_are_validated_anew(validations) -> None:
    """``True == 1`` and ``0.0 == -0.0``: a table keyed on plain equality would hand back
    settings the constructor refuses, or another float's sign."""
    sharing = Sharing()
    assert sharing.link_settings({"network_ttl": 1}).network_ttl == 1
    with pytest.raises(ConfigError, match="network_ttl"):
        sharing.link_settings({"network_ttl": True})
    assert sharing.new_settings(name="x", resync_grace=0.0).resync_grace == 0.0
    assert str(sharing.new_settings(name="x", resync_grace=-0.0).resync_grace) == "-0.0"
    # unknown option keys: ignored by from_options, refused by the constructor
    assert sharing.link_settings({"name": "y", "newer": 1}).name == "y"
    with pytest.raises(TypeError):
        sharing.new_settings(name="y", newer=1)


def test_bad_options_are_refused_every_time(validations) -> None:
    sharing = Sharing()
    for _ in range(2):
        with pytest.raises(ConfigError, match="prefetch"):
            sharing.link_settings({"prefetch": 0})
        # a value no key takes (a dict) is validated, and refused, as without a table
        with pytest.raises(ConfigError, match="excluded"):
            sharing.link_settings({"excluded": {"queue://a": 1}})
    assert sharing.settings == {}


def test_the_tables_stay_bounded(validations) -> None:
    sharing = Sharing()
    for i in range(SETTINGS_LIMIT + 10):
        assert sharing.link_settings({"name": f"l{i}"}).name == f"l{i}"
        assert sharing.new_settings(name=f"n{i}").name == f"n{i}"
    assert len(sharing.settings) <= SETTINGS_LIMIT and len(sharing.built) <= SETTINGS_LIMIT


@pytest.mark.parametrize("settings", [
    LinkSettings(kind="tree", name="tree"),
    LinkSettings(kind="tree", name="tree", node_type="leaf", summary_budget=8,
                 summary_owned=("queue://Store.{broker}.>",),
                 dynamically_included=("queue://Store.>",)),
    LinkSettings(kind="mesh", name="m1", duplex=True, excluded=("topic://X.>",)),
], ids=["default", "summary", "mesh"])
def test_to_options_lists_the_fields_once(settings, monkeypatch) -> None:
    """A dialer's hello options (one per link: 4,004 in a 4 x 1,000 estate) come from
    the field list made at import, not ``dataclasses.fields`` per call; the same dict as
    the per-call loop made (tuples as lists, unset summary fields left out)."""
    import dataclasses

    import treefed.federation.settings as settings_mod

    want = {}
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if f.name in ("summary_budget", "summary_owned") and value == f.default:
            continue
        want[f.name] = list(value) if isinstance(value, tuple) else value
    calls: list = []
    monkeypatch.setattr(settings_mod, "fields", lambda obj: calls.append(obj) or ())
    assert settings.to_options() == want
    assert calls == []
