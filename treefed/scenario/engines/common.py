"""What every engine builds the same way: connector settings per mode, site positions,
run parameters and the run's framing events.

Theory of operation
-------------------
A scenario estate is a tree, and in both modes every link is dialed by the child
towards its parent: a tree connector (``node_type`` leaf or branch) or a mesh network
connector named ``uplink`` carrying the mode's options (``duplex``, ``network_ttl``...).
The accepting side's settings are rebuilt from the dialer's hello (federation/site.py),
so only the dialing side's settings matter.  In tree mode the root is the one site with
no tree connector that accepts children; in mesh mode no site accepts tree children and
every ``node_type`` is ``mesh``.

Keeping these choices in one module is what makes the engines comparable: same link
names, same settings, same ``broker.info`` / ``run.*`` lines.
"""

from __future__ import annotations

import json
from typing import Any

from treefed.federation.settings import LinkSettings, TreeSettings
from treefed.scenario.baselines import store_options
from treefed.scenario.spec import Mode
from treefed.scenario.topology import BrokerSpec, Topology
from treefed.scenario.workload import Plan

__all__ = ["LINK_NAME", "APP_CONN", "RUNNER", "dial_settings", "accept_settings",
           "site_position", "run_params", "run_fields", "broker_info"]

#: link (connector) name per mode kind; appears in every link and advisory event.
LINK_NAME = {"tree": "tree", "mesh": "uplink"}
#: the one client connection per site that the workload's applications share.
APP_CONN = "app"
#: ``broker`` value of the run.* lines (the analysis ignores it for run events).
RUNNER = "runner"


def dial_settings(mode: Mode, child: BrokerSpec) -> LinkSettings:
    """The child's connector to its parent under ``mode``."""
    opts = mode.options
    if mode.connector == "tree":
        return LinkSettings(kind="tree", name=LINK_NAME["tree"],
                            node_type="leaf" if child.role == "leaf" else "branch",
                            route_unknown_up=opts.get("route_unknown_up", True),
                            max_demand_per_link=opts.get("max_interest_per_child", 100_000),
                            advertise_down=opts.get("advertise_down"),
                            resync_grace=opts.get("resync_grace", 0.0),
                            summary_budget=opts.get("summary_budget", 0),
                            summary_owned=tuple(opts.get("summary_owned", ())))
    return LinkSettings(kind="mesh", name=LINK_NAME["mesh"], **store_options(mode, child))


def accept_settings(mode: Mode) -> LinkSettings:
    """The parent's listener settings (the dialer's options override them)."""
    return LinkSettings(kind=mode.connector, name=LINK_NAME[mode.connector])


def site_position(mode: Mode, broker: BrokerSpec) -> tuple[TreeSettings | None, bool]:
    """``(tree settings, accept_tree_children)`` for ``Site(...)``."""
    if mode.connector != "tree":
        return None, False
    if broker.role == "root":
        return None, True
    return (TreeSettings(broker.role, mode.options.get("route_unknown_up", True),
                         bool(mode.options.get("summary_budget", 0))),
            broker.role != "leaf")


def run_params(plan: Plan, mode: Mode, **extra: Any) -> dict:
    """The parameters the analysis reads from ``run.started.params``."""
    spec = plan.scenario.topology
    params = {"regions": spec.regions, "stores_per_region": spec.stores_per_region,
              "layers": [[layer.name, layer.count] for layer in spec.layers],
              "depth": plan.topology.depth, "seed": plan.scenario.seed,
              "connector": mode.connector, **mode.options}
    if mode.connector == "mesh":
        params.setdefault("network_ttl", 1)
    params.update(extra)
    return params


def run_fields(plan: Plan, mode: Mode, engine: str, topology: Topology,
               params: dict) -> dict:
    """Fields of ``run.started`` / ``run.finished``."""
    return {"scenario": plan.scenario.name, "mode": mode.label,
            "params": json.dumps(params, sort_keys=True, separators=(",", ":")),
            "brokers": len(topology), "links": len(topology) - 1, "engine": engine}


def broker_info(mode: Mode, broker: BrokerSpec) -> dict:
    """Fields of the ``broker.info`` line of one site."""
    if mode.connector == "tree":
        node_type = broker.role
    else:
        node_type = "mesh"
    return {"role": broker.role, "node_type": node_type, "parent": broker.parent}
