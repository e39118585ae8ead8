"""SiteConfigs (scenario/engines/live.py, issue #14): a site's config made from a shape
parsed once equals the one parse_config makes from its own document, site by site."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from treefed.errors import ConfigError
from treefed.scenario.engines.live import SiteConfigs, _link_uri, site_config
from treefed.scenario.spec import load_scenario
from treefed.scenario.topology import build

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


@pytest.mark.parametrize("name", ["retail-small", "sweep-depth-2", "reconfigure", "sweep-size-4x0005"])
def test_every_site_every_mode_equals_its_own_parse(name: str) -> None:
    sc = load_scenario(SCENARIOS / f"{name}.toml")
    topology = build(sc.topology)
    for mode in sc.modes:
        configs = SiteConfigs(mode)
        for listen in ((), ("tcp://127.0.0.1:40001",)):
            for spec in topology.brokers:
                parent_uri = _link_uri(spec.parent) if spec.parent is not None else None
                want = site_config(mode, spec, parent_uri=parent_uri, listen=listen)
                assert configs.get(spec, parent=spec.parent, uri=_link_uri,
                                   listen=listen) == want, (mode.label, spec.id)
        assert len(configs._shapes) < len(topology.brokers)


def test_a_bad_id_is_refused_as_parse_config_refuses_it() -> None:
    sc = load_scenario(SCENARIOS / "retail-small.toml")
    topology = build(sc.topology)
    spec = next(s for s in topology.brokers if s.parent is not None)
    configs = SiteConfigs(sc.modes[0])
    configs.get(spec, parent=spec.parent, uri=_link_uri)
    bad = dataclasses.replace(spec, id="no spaces")
    with pytest.raises(ConfigError) as parsed:
        site_config(sc.modes[0], bad, parent_uri=_link_uri(spec.parent))
    with pytest.raises(ConfigError) as templated:
        configs.get(bad, parent=spec.parent, uri=_link_uri)
    assert str(templated.value) == str(parsed.value)


def test_siblings_share_their_checked_connector(monkeypatch) -> None:
    """The children of one parent (per shape) share one connector config, its URI checked
    once (issue #14: a ``parse_uri`` and a ``dataclasses.replace`` per site before); a bad
    parent URI is refused every time and never kept."""
    import treefed.transport.uri as uri_mod

    parsed: list = []
    parse_uri = uri_mod.parse_uri

    def counted(text, **kwargs):
        parsed.append(text)
        return parse_uri(text, **kwargs)

    monkeypatch.setattr(uri_mod, "parse_uri", counted)
    sc = load_scenario(SCENARIOS / "retail-small.toml")
    topology = build(sc.topology)
    for mode in sc.modes:
        configs = SiteConfigs(mode)
        children = [s for s in topology.brokers if s.parent is not None]
        got = [configs.get(spec, parent=spec.parent, uri=_link_uri) for spec in children]
        parents = {spec.parent for spec in children}
        assert len(parents) < len(children)
        linked = {}
        for spec, cfg in zip(children, got):
            link = cfg.tree_connector or cfg.network_connectors[0]
            assert linked.setdefault(spec.parent, link) is link, (mode.label, spec.id)
        checked = [t for t in parsed if "parent-template" not in t]
        assert len(checked) == len(parents), (mode.label, checked)
        del parsed[:]
    configs = SiteConfigs(sc.modes[0])
    spec = children[0]
    for _ in range(2):
        with pytest.raises(ConfigError):
            configs.get(spec, parent=spec.parent, uri=lambda _: "bogus://x")
