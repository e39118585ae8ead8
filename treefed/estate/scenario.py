"""A scenario run on a generated estate: the plan's topology and mode read from its configs.

Theory of operation
-------------------
A scenario file names a workload and a timeline; its ``[topology]`` generates ids
(``hq``, ``region-1``, ``store-r1-0001``).  ``estate_scenario(scenario, DIR)`` keeps the
workload, seed and timeline and takes everything else from the broker configs in ``DIR``
(``treefed estate generate`` output, or any folder of configs in which every site dials at
most one parent):

* the **topology**: who dials whom (``forecast.load_estate`` resolves the connector
  URIs), the root is the one site that dials nobody; roles follow the tree connector
  (``root``, ``branch``, ``leaf``); kinds are what the workload plans by -- the root is
  ``hq``, leaves are ``store``, their parents ``region``, anything between ``branch``;
* the **mode**: the tree connector's options, or the mesh ``uplink``'s, which must be the
  same at every site (a mode is one set of options).

The result is a ``Scenario`` whose ``build_topology`` returns that estate, so
``workload.build_plan`` plans the same consumers, messages and expectations on it as on a
generated topology, and any engine runs it: the memory engine from configs it writes
itself, the procs engine (``ProcsEngine(..., estate=DIR)``) from the estate's own files
-- TLS, certificates, users and permissions as generated.  The timeline is checked again
against the estate's ids; ``insert_layer`` is refused (a new layer has no configs).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from treefed.config import _MESH_OPTIONS, _TREE_OPTIONS, BrokerConfig
from treefed.errors import ConfigError
from treefed.scenario.spec import ACTIONS, Mode, Scenario, TopologySpec, _derive_label, _timeline
from treefed.scenario.topology import BrokerSpec, Topology

__all__ = ["EstateScenario", "estate_scenario", "estate_topology", "estate_mode"]


@dataclass(frozen=True, slots=True)
class EstateScenario(Scenario):
    """A Scenario whose estate is a folder of broker configs (see the module docstring)."""

    estate: Topology | None = None
    folder: str = ""

    def build_topology(self) -> Topology:
        return self.estate


def _parents(folder: Path) -> tuple[dict[str, str | None], dict[str, BrokerConfig]]:
    from treefed.estate.forecast import load_estate

    est = load_estate([folder])
    if est.unresolved:
        u = est.unresolved[0]
        raise ConfigError("", f"{u.dial.broker}: connector {u.dial.connector} dials "
                              f"{u.dial.address}: {u.reason}")
    parent: dict[str, str | None] = dict.fromkeys(est.configs)
    for link in est.links:
        if parent[link.dialer] not in (None, link.acceptor):
            raise ConfigError("", f"{link.dialer} dials both {parent[link.dialer]} and "
                                  f"{link.acceptor}: a scenario estate is a tree (each site "
                                  "dials at most one parent)")
        parent[link.dialer] = link.acceptor
    return parent, est.configs


def estate_topology(folder: str | Path) -> Topology:
    """The estate of ``folder`` as a scenario Topology (see the module docstring)."""
    parent, _ = _parents(Path(folder))
    roots = [s for s, p in parent.items() if p is None]
    if len(roots) != 1:
        raise ConfigError("", f"{folder}: want one root (a site that dials nobody), found "
                              f"{len(roots)}: {', '.join(sorted(roots)[:5])}")
    children: dict[str, list[str]] = {s: [] for s in parent}
    for s, p in sorted(parent.items()):
        if p is not None:
            children[p].append(s)
    order, depth = [roots[0]], {roots[0]: 0}
    for s in order:   # breadth first, parents before children (the list grows as we walk)
        for c in children[s]:
            depth[c] = depth[s] + 1
            order.append(c)
    if len(order) != len(parent):
        lost = sorted(set(parent) - set(order))
        raise ConfigError("", f"{folder}: {', '.join(lost[:5])} do not reach the root "
                              f"{roots[0]} (a cycle)")

    def kind(s: str) -> str:
        if parent[s] is None:
            return "hq"
        if not children[s]:
            return "store"
        return "region" if any(not children[c] for c in children[s]) else "branch"

    def region(s: str) -> str | None:
        for x in (s, parent[s]):
            if x is not None and kind(x) == "region":
                return x
        return None

    brokers = [BrokerSpec(s, "root" if parent[s] is None else
                          ("branch" if children[s] else "leaf"), depth[s], parent[s],
                          region(s), kind(s)) for s in order]
    return Topology(brokers)


def estate_mode(folder: str | Path) -> Mode:
    """The connector mode every child of ``folder`` dials its parent with."""
    parent, configs = _parents(Path(folder))
    seen: dict[str, Any] = {}
    for site, p in sorted(parent.items()):
        if p is None:
            continue
        c = configs[site]
        if c.tree_connector is not None:
            connector, table, names = "tree", c.tree_connector, _TREE_OPTIONS
        elif len(c.network_connectors) == 1:
            connector, table, names = "mesh", c.network_connectors[0], _MESH_OPTIONS
        else:
            raise ConfigError("network_connector", f"{site} has "
                                                   f"{len(c.network_connectors)} network "
                                                   "connectors; a scenario site dials one "
                                                   "parent")
        options = {}
        for f in fields(table):
            value = getattr(table, f.name)
            if f.name in names and value is not None:
                options[f.name] = list(value) if isinstance(value, tuple) else value
        if seen and (connector, options) != (seen["connector"], seen["options"]):
            raise ConfigError("", f"{site} dials with other connector options than "
                                  f"{seen['site']}; a scenario mode is one set of options")
        seen = {"connector": connector, "options": options, "site": site}
    if not seen:
        raise ConfigError("", f"{folder}: no site dials a parent")
    return Mode(_derive_label(seen["connector"], seen["options"]), seen["connector"],
                seen["options"])


def _raw_event(ev: Any) -> dict:
    required, optional = ACTIONS[ev.action]
    out = {"at": ev.at, "action": ev.action}
    for k in (*required, *optional):
        v = getattr(ev, k)
        if v is not None:
            out[k] = v
    return out


def estate_scenario(scenario: Scenario, folder: str | Path) -> EstateScenario:
    """``scenario``'s workload, seed and timeline on the estate in ``folder``."""
    folder = Path(folder).resolve()
    topology = estate_topology(folder)
    mode = estate_mode(folder)
    for i, ev in enumerate(scenario.timeline):
        if ev.action == "insert_layer":
            raise ConfigError(f"timeline[{i}].action", "insert_layer cannot run on a "
                                                       "generated estate (the new layer "
                                                       "has no configs)")
    timeline = _timeline([_raw_event(ev) for ev in scenario.timeline], topology)
    stores = topology.of_kind("store")
    if scenario.workload.store_to_store and len(stores) < 2:
        raise ConfigError("workload.store_to_store", "needs at least two stores")
    regions = topology.of_kind("region")
    spec = TopologySpec(regions=max(1, len(regions)),
                        stores_per_region=max(1, len(stores) // max(1, len(regions))))
    return EstateScenario(scenario.name, scenario.seed, spec, (mode,), scenario.workload,
                          timeline, scenario.description, scenario.source_path,
                          estate=topology, folder=str(folder))
