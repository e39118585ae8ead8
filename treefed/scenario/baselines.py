"""Baselines worth beating: the mesh an ActiveMQ operator of a store estate actually tunes.

Theory of operation
-------------------
A default-TTL mesh is a straw man: operators of store estates limit each store's network
connector with ``dynamically_included`` so that a store hears only about the
destinations it sends to.  A mode asks for that with the option ``STORE_INCLUDES``, a list
of destination templates (``{broker}``: the store, ``{region}``: its region).  Only a
store's (leaf's) uplink gets the filter, with the templates filled in for that store;
regions and HQ dial unfiltered, so the interest stores send up still reaches HQ.  On a
duplex link the filter applies in both directions (federation/mesh.py), so a store
neither advertises nor accepts interest outside its list.

``store_settings(mode, child)`` is what ``engines.common.dial_settings`` hands its mesh
options through: the mode's options without ``STORE_INCLUDES``, plus
``dynamically_included`` for a store.  What each baseline costs the operator is stated
next to its spill in the report (analysis/report.py ``MODE_COSTS``).
"""

from __future__ import annotations

from typing import Any

from treefed.scenario.spec import Mode, expand_destination
from treefed.scenario.topology import BrokerSpec

__all__ = ["STORE_INCLUDES", "TUNED_INCLUDES", "TUNED_MODES", "tuned_modes",
           "store_options"]

#: Mode option: destination templates a store's connector is limited to.
STORE_INCLUDES = "store_dynamically_included"

#: The tuned filter: the store's own queue, its region's and HQ's queues, and the
#: broadcast topics it subscribes to.
TUNED_INCLUDES = ("queue://Store.{broker}.>", "queue://Region.{region}.>", "queue://HQ.>",
                  "topic://Broadcast.>")

#: label -> (connector, options) of the tuned baselines for a two-level estate
#: (HQ -> regions -> stores); ``tuned_modes(depth)`` for any other.
TUNED_MODES: dict[str, tuple[str, dict]] = {
    "mesh-tuned": ("mesh", {"network_ttl": 2, "duplex": True,
                            STORE_INCLUDES: list(TUNED_INCLUDES)}),
}


def tuned_modes(depth: int) -> dict[str, tuple[str, dict]]:
    """The tuned baselines for an estate ``depth`` levels below HQ: the operator sets the
    network TTL to the depth, the least that carries a store's interest to HQ (and HQ's
    to the stores); the store filters keep that TTL from flooding siblings."""
    return {label: (connector, {**options, "network_ttl": max(2, depth)})
            for label, (connector, options) in TUNED_MODES.items()}

def store_options(mode: Mode, child: BrokerSpec) -> dict[str, Any]:
    """The mesh options ``child`` dials its parent with under ``mode``."""
    options = dict(mode.options)
    templates = options.pop(STORE_INCLUDES, None)
    if templates and child.role == "leaf":
        given = list(options.get("dynamically_included") or ())
        # a list: what a broker config file (live engines) and LinkSettings both take
        options["dynamically_included"] = given + [expand_destination(t, child)
                                                   for t in templates]
    return options
