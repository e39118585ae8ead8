"""Tree policy: the hierarchical connector of AMQ-2875 (DESIGN §4.2).

Theory of operation
-------------------
The same four questions as ``mesh.py``, answered by position instead of by TTL.  Each
tree link leads to our *parent* or to one of our *children* (its lane).

* *Where does interest go?*  ``routing.ROUTES["tree"]``: local interest goes up and
  down; interest from a child goes up only (siblings never learn of each other's
  consumers, and no per-sibling refusal is logged: not sending is the saving); interest
  from the parent goes down to every child.  At a leaf "down" is empty, at the root "up"
  is.
* *May this advisory be accepted?*  No TTL.  From a child: a path naming us or an
  ancestor means a downward frame was sent back up (``tree_rule``); otherwise the
  origin must head the path and every broker named must belong to that child's subtree
  (first claimed by it, never our own id or an ancestor's: ``malformed``).  From the parent: we
  must not be the origin or on the path (``loop``).  ``accept`` only answers; the
  brokers an accepted advisory from a child names are returned by ``claims`` and the
  Bridge claims them for that child's subtree once every check passed.
* *May it be sent on this link?*  Always, once ROUTES chose the link.
* *What demand does it create?*  One conduit per (link, destination) whose selector is
  the OR of its members' selectors (no selector if any member has none), kept as a
  ``MergedSelector`` (``merged.py``): each member compiled once, "any of" evaluated, a
  change O(that member); ``conduit_selector`` gives the equivalent text.  ActiveMQ
  conduits drop selectors, which strands queue messages at brokers whose consumers do
  not select them; the OR keeps one subscription per destination and forwards only
  what some consumer below can take.  Priority -(hops): local consumers (0) win, then
  nearer demand.

Bookkeeping (subtree ownership) lives on the Site; this object only reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from treefed.federation.routing import ROUTES as _ROUTES
from treefed.federation.settings import LinkSettings
from treefed.federation.temps import temp_refusal

if TYPE_CHECKING:  # pragma: no cover
    from treefed.federation.bridge import Bridge, Interest
    from treefed.wire.frames import Advisory

__all__ = ["TreePolicy"]


class TreePolicy:
    __slots__ = ("settings",)

    message_ttl = -1  # no TTL anywhere: a tree path is bounded by its depth
    #: A queue message that rested (no consumer anywhere it could go) may later be sent
    #: back along its path: store1 -> region -> root waits, then root -> region -> store2
    #: once store2's consumer appears.  Bounded by the core's MAX_HOPS.
    replay = True

    kind = "tree"
    #: conduits keep member selectors compiled once each (federation/merged.py)
    merges_selectors = True
    #: where the interest came from -> lanes of links it is offered to (routing.py).
    ROUTES = _ROUTES["tree"]

    def __init__(self, settings: LinkSettings) -> None:
        self.settings = settings

    # -- receiving side ------------------------------------------------------------
    def accept(self, bridge: "Bridge", adv: "Advisory") -> str | None:
        reason = self._accept(bridge, adv)
        if reason is None and adv.dst.startswith("temp-"):
            return temp_refusal(bridge, adv.dst, tree=True, consumer=adv.consumer)   # issue #12, defect 3
        return reason

    def _accept(self, bridge: "Bridge", adv: "Advisory") -> str | None:
        site = bridge.site
        me, origin, path = site.broker_id, adv.origin, adv.path
        if bridge.lane == "parent":
            if origin == me or me in path:
                return "loop"
            owner = site.subtree_owner(origin)
            return "loop" if owner is not None and owner is not bridge else None
        # from a child: the advisory must describe a consumer inside that child's subtree
        above = site.ancestry_set
        if me in path or not above.isdisjoint(path):
            return "tree_rule"  # it travelled down to the child and is being echoed up
        if origin == me or origin in above:
            return "malformed"
        if (path[0] if path else bridge.peer) != origin:
            return "malformed"
        for broker in path:
            owner = site.subtree_owner(broker, bridge)
            if owner is not None and owner is not bridge:
                return "malformed"  # a spoof: that broker lives under another child
        return None

    def claims(self, bridge: "Bridge", adv: "Advisory") -> tuple[str, ...] | list[str]:
        """Brokers an accepted advisory from a child places in that child's subtree."""
        return adv.path if bridge.lane == "child" else ()

    # -- sending side --------------------------------------------------------------
    def offer(self, bridge: "Bridge", it: "Interest") -> str | None:
        return None

    # -- demand --------------------------------------------------------------------
    def demand_priority(self, hops: int) -> int:
        return -hops

    def conduit(self, dst: str, hops: int) -> bool:
        return True

    def conduit_selector(self, selectors: dict[str | None, int]) -> str | None:
        if None in selectors:
            return None
        if len(selectors) == 1:
            return next(iter(selectors))
        return " OR ".join(f"({text})" for text in sorted(selectors))

    def suppresses(self, dst: str) -> bool:
        return False  # a tree has one route between any two brokers
