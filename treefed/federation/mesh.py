"""Mesh policy: the classic ActiveMQ 5.x network connector (DESIGN §4.1).

Theory of operation
-------------------
A policy answers four questions for one link; ``bridge.py`` does the bookkeeping and
``site.py`` the fan-out.  Read this file next to ``tree.py``: the difference is the point.

* *Where does interest go?*  ``routing.ROUTES["mesh"]``: from anywhere to every other
  mesh link.
  Flooding is bounded only by ``consumer_ttl`` and the loop check.
* *May this advisory be accepted?*  ``accept``: ttl (``len(path) >= consumer_ttl``),
  loop (we are the origin or on the path), then the permission order
  temp -> excluded -> statically included -> dynamically included -> allowed.
* *May it be sent on this link?*  ``offer``: dynamic includes narrow what is sent at
  all (silently); on a duplex link the sender also applies the ttl and loop checks and
  logs the refusal itself, on a one-way link the receiver does.
* *What demand does it create?*  priority 0, or with
  ``decrease_network_consumer_priority`` -5 for one hop and -5-(hops+1) beyond; conduit
  (one selector-less consumer per destination) for topics always and for queue
  consumers that are local to the sender, when ``conduit_subscriptions`` is on.

Every refusal is a reason from ``events.DROP_REASONS``.  Nothing here mutates state
except the per-destination permission cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from treefed.core.destinations import is_temp, matches
from treefed.federation.policy import SKIP
from treefed.federation.routing import ROUTES as _ROUTES
from treefed.federation.settings import LinkSettings
from treefed.federation.temps import temp_refusal

if TYPE_CHECKING:  # pragma: no cover
    from treefed.federation.bridge import Bridge, Interest
    from treefed.wire.frames import Advisory

__all__ = ["MeshPolicy", "SKIP"]


_CACHE_LIMIT = 4096


class MeshPolicy:
    __slots__ = ("settings", "message_ttl", "_ttl", "_permits", "_open", "_conduits",
                 "_suppress_topics", "_suppress_queues")

    kind = "mesh"
    merges_selectors = False   # ActiveMQ conduits drop selectors (conduit_selector)
    replay = False   # ActiveMQ default: a message never goes back to a broker on its path
    #: where the interest came from -> lanes of links it is offered to (routing.py).
    ROUTES = _ROUTES["mesh"]

    def __init__(self, settings: LinkSettings) -> None:
        self.settings = settings
        self.message_ttl = settings.message_ttl           # hops a forwarded message may make
        self._ttl = settings.consumer_ttl                 # hoisted: read per advisory
        self._conduits = settings.conduit_subscriptions   # likewise (settings are frozen)
        self._suppress_topics = settings.suppress_duplicate_topic_subscriptions
        self._suppress_queues = settings.suppress_duplicate_queue_subscriptions
        self._permits: dict[str, str | None] = {}         # dst -> refusal reason or None
        # no filter at all (the default): every destination is permitted, and a per-link
        # cache would miss on each first sight of a destination -- most of a flood
        self._open = settings.bridge_temp_destinations and not (
            settings.excluded or settings.statically_included or settings.dynamically_included)

    # -- receiving side ------------------------------------------------------------
    def accept(self, bridge: "Bridge", adv: "Advisory") -> str | None:
        if self._ttl != -1 and len(adv.path) >= self._ttl:
            return "ttl"
        me = bridge.site.broker_id
        if adv.origin == me or me in adv.path:
            return "loop"
        if adv.dst.startswith("temp-"):
            refusal = temp_refusal(bridge, adv.dst, tree=False, consumer=adv.consumer)
            if refusal is not None:
                return refusal
        return None if self._open else self.permit(adv.dst)

    def claims(self, bridge: "Bridge", adv: "Advisory") -> tuple[str, ...]:
        return ()   # a mesh has no subtrees

    def permit(self, dst: str) -> str | None:
        """Permission order of DESIGN §4.1; cached per destination."""
        try:
            return self._permits[dst]
        except KeyError:
            pass
        s = self.settings
        if is_temp(dst):
            reason = None if s.bridge_temp_destinations else "filter"
        elif any(matches(p, dst) for p in s.excluded):
            reason = "filter"
        elif dst in s.statically_included:
            reason = None
        elif s.dynamically_included:
            reason = None if any(matches(p, dst) for p in s.dynamically_included) \
                else "filter"
        else:
            reason = None
        if len(self._permits) >= _CACHE_LIMIT:  # bound memory against hostile names
            self._permits.clear()
        self._permits[dst] = reason
        return reason

    # -- sending side --------------------------------------------------------------
    def offer(self, bridge: "Bridge", it: "Interest") -> str | None:
        s = self.settings
        if s.dynamically_included and not is_temp(it.dst) \
                and it.dst not in s.statically_included \
                and not any(matches(p, it.dst) for p in s.dynamically_included):
            return SKIP
        if bridge.duplex:
            if self._ttl != -1 and len(it.path) >= self._ttl:
                return "ttl"
            if bridge.peer == it.origin or bridge.peer in it.path:
                return "loop"
        return None

    # -- demand --------------------------------------------------------------------
    def demand_priority(self, hops: int) -> int:
        if not self.settings.decrease_network_consumer_priority:
            return 0
        return -5 if hops <= 1 else -5 - (hops + 1)

    def conduit(self, dst: str, hops: int) -> bool:
        # a queue consumer that is itself network demand keeps its own subscription:
        # merging it would hide the route's length from dispatch.
        # is_topic, inlined: called for every accepted advisory
        return self._conduits and (hops == 1 or dst.startswith("topic://")
                                   or dst.startswith("temp-topic://"))

    def conduit_selector(self, selectors: dict[str | None, int]) -> str | None:
        return None  # ActiveMQ conduits forget selectors (the stranding of guide §5)

    def suppresses(self, dst: str) -> bool:
        # is_topic, inlined: called for every accepted advisory
        if dst.startswith("topic://") or dst.startswith("temp-topic://"):
            return self._suppress_topics
        return self._suppress_queues
