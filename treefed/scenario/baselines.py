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
options through: the mode's options without ``STORE_INCLUDES`` / ``STORE_DUPLEX``, plus
``dynamically_included`` and ``duplex`` for a store.  What each baseline costs the
operator is stated next to its spill in the report (analysis/report.py ``MODE_COSTS``).

The baselines
-------------
* ``mesh-tuned``: duplex everywhere, each store's connector limited to its own queue,
  its region's and HQ's queues and the broadcast topics (``TUNED_INCLUDES``).
* ``mesh-tuned-oneway``: the guide's *concentrator* (Fuse/ActiveMQ network guide:
  "each broker in the first layer connects to all of the brokers in the second layer",
  funnelling the producers' messages up; here one second-layer broker, the store's
  region, and the funnel made one-way, as an operator does): each store has one
  **non-duplex** connector up to its region (``STORE_DUPLEX = False``), limited to the
  destinations a store sends to (``ONEWAY_INCLUDES``: its region's and HQ's queues);
  regions and HQ stay duplex.  A non-duplex link forwards messages only from the
  dialing side and only the accepting side advertises (federation/handshake.py), so the
  region's and HQ's consumers' interest reaches the store and its messages climb, but a
  store's own consumers are never advertised and nothing is forwarded down to it:
  HQ-to-store, store-to-store and the broadcast topic cannot be served.  The other
  common one-way layout -- a second, downward one-way connector from the region to
  every store -- needs a second link per store (the parent dialing the child) in the
  topology and in every engine (replay, memory, tcp, procs, the model); it is not
  modelled.
* ``nats-isolated``: NATS 2.12 ``isolate_leafnode_interest`` on every hub: a leaf's
  interest reaches its hub (and climbs on), a hub's own interest and the interest it
  learnt from above go down to every leaf, but interest from one leaf is never sent to
  another.  That is the tree connector's interest routing as it is
  (federation/routing.py: interest from a child goes to the parent only); what NATS
  does not have is the tree's ``route_unknown_up`` message fallback -- a NATS leaf
  sends a message to its hub only for interest the hub advertised.  So the mode is the
  tree connector with ``route_unknown_up = false`` (whose ``advertise_down`` default
  then sends queue and topic interest down, as a NATS hub does).  Store-to-store, and
  any route from one subtree to a consumer in another (region 1 -> region 2), cannot
  be served: the sender never learns of the consumer.  Nothing in federation/ changes.
"""

from __future__ import annotations

from typing import Any

from treefed.scenario.spec import Mode, expand_destination
from treefed.scenario.topology import BrokerSpec

__all__ = ["STORE_INCLUDES", "STORE_DUPLEX", "TUNED_INCLUDES", "ONEWAY_INCLUDES",
           "TUNED_MODES", "tuned_modes", "store_options"]

#: Mode option: destination templates a store's connector is limited to.
STORE_INCLUDES = "store_dynamically_included"
#: Mode option: ``duplex`` of a store's connector (the others keep the mode's ``duplex``).
STORE_DUPLEX = "store_duplex"

#: The tuned filter: the store's own queue, its region's and HQ's queues, and the
#: broadcast topics it subscribes to.
TUNED_INCLUDES = ("queue://Store.{broker}.>", "queue://Region.{region}.>", "queue://HQ.>",
                  "topic://Broadcast.>")
#: The one-way (concentrator) filter: only what a store sends to -- its region's and
#: HQ's queues; nothing comes down a one-way store uplink, so its own queue and the
#: broadcast topics would be interest it can never use.
ONEWAY_INCLUDES = ("queue://Region.{region}.>", "queue://HQ.>")

#: label -> (connector, options) of the tuned baselines for a two-level estate
#: (HQ -> regions -> stores); ``tuned_modes(depth)`` for any other.
TUNED_MODES: dict[str, tuple[str, dict]] = {
    "mesh-tuned": ("mesh", {"network_ttl": 2, "duplex": True,
                            STORE_INCLUDES: list(TUNED_INCLUDES)}),
    "mesh-tuned-oneway": ("mesh", {"network_ttl": 2, "duplex": True, STORE_DUPLEX: False,
                                   STORE_INCLUDES: list(ONEWAY_INCLUDES)}),
    "nats-isolated": ("tree", {"route_unknown_up": False}),
}


def tuned_modes(depth: int) -> dict[str, tuple[str, dict]]:
    """The tuned baselines for an estate ``depth`` levels below HQ: the operator sets the
    network TTL to the depth, the least that carries a store's interest to HQ (and HQ's
    to the stores); the store filters keep that TTL from flooding siblings.  A tree-
    connector baseline has no TTL and is returned as it is."""
    return {label: (connector, {**options, "network_ttl": max(2, depth)}
                    if connector == "mesh" else dict(options))
            for label, (connector, options) in TUNED_MODES.items()}

def store_options(mode: Mode, child: BrokerSpec) -> dict[str, Any]:
    """The mesh options ``child`` dials its parent with under ``mode``."""
    options = dict(mode.options)
    templates = options.pop(STORE_INCLUDES, None)
    store_duplex = options.pop(STORE_DUPLEX, None)
    if store_duplex is not None and child.role == "leaf":
        options["duplex"] = bool(store_duplex)
    if templates and child.role == "leaf":
        given = list(options.get("dynamically_included") or ())
        # a list: what a broker config file (live engines) and LinkSettings both take
        options["dynamically_included"] = given + [expand_destination(t, child)
                                                   for t in templates]
    return options
