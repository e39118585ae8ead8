"""Connector settings and the destination filters they carry.

Theory of operation
-------------------
``LinkSettings`` is one connector's configuration (DESIGN §4.1 names and defaults, plus
the tree connector's ``node_type`` / ``route_unknown_up``).  It is frozen and validated
once, at construction: bad values raise ``ConfigError`` naming the field, so nothing on
the per-advisory path ever re-checks it.  ``network_ttl`` sets ``consumer_ttl`` and
``message_ttl`` unless those are given explicitly.

The dialing side owns a link's rules: it sends ``to_options()`` in ``Hello.options`` and
the accepting side rebuilds the same settings with ``from_options()``, so both ends of a
duplex or one-way link apply identical TTLs, filters and conduit rules.

``TreeSettings`` is a site's own position in the tree; it is not a per-link thing.

Destinations are canonicalised by ``core.destinations`` (a bare name is a queue);
filters (``dynamically_included``, ``excluded``) may use its wildcards, static includes
may not.  Nothing here does I/O or keeps state.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from treefed.core.destinations import parse_destination
from treefed.errors import ConfigError, DestinationError

__all__ = ["LinkSettings", "TreeSettings", "KINDS", "NODE_TYPES", "DOWN_KINDS", "options_key"]

KINDS = ("mesh", "tree")
NODE_TYPES = ("leaf", "branch", "root")
#: destination kinds ``advertise_down`` may name (temp-queue / temp-topic follow them)
DOWN_KINDS = ("queue", "topic")


def _destinations(key: str, value: Any, *, wildcards: bool) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ConfigError(key, "must be a list of destination names")
    out = []
    for name in value:
        try:
            out.append(parse_destination(name, allow_wildcards=wildcards))
        except DestinationError as exc:
            raise ConfigError(key, exc.message) from None
    return tuple(out)


#: options ``to_options`` leaves out at their default (added after the hello was fixed)
_SILENT_DEFAULTS = frozenset(("summary_budget", "summary_owned"))


@dataclass(frozen=True, slots=True)
class LinkSettings:
    """One connector's options (DESIGN §4.1; tree fields §4.2)."""

    kind: str = "mesh"                              # "mesh" | "tree"
    name: str = "link"                              # unique per broker pair
    duplex: bool = False                            # one connection carries both directions
    network_ttl: int = 1                            # default for the two TTLs below
    consumer_ttl: int | None = None                 # advisory hops; -1 unlimited
    message_ttl: int | None = None                  # message hops; -1 unlimited
    conduit_subscriptions: bool = True
    dynamically_included: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    statically_included: tuple[str, ...] = ()
    decrease_network_consumer_priority: bool = False
    suppress_duplicate_queue_subscriptions: bool = False
    suppress_duplicate_topic_subscriptions: bool = True
    bridge_temp_destinations: bool = True
    prefetch: int = 1000
    static_bridge: bool = False                     # only static includes, no advisories
    max_demand_per_link: int = 100_000              # remote interest entries held per link
    node_type: str | None = None                    # tree: "leaf" | "branch" (dialing side)
    route_unknown_up: bool = True                   # tree: unknown-interest messages climb
    # tree, the child's side: kinds ("queue", "topic") whose interest from above the
    # parent sends down this link.  None: ("topic",) with route_unknown_up -- a queue
    # message climbs to its consumer anyway, so queue interest below would be spill --
    # and ("queue", "topic") without it.  Temporary destinations always go down
    # (request/reply: the reply must find the requester's temp queue).
    advertise_down: tuple[str, ...] | None = None
    # tree, the child's side: seconds both ends hold the link's interest after it drops,
    # so a reconnect within them exchanges only the difference (federation/resync.py);
    # 0 = forget at once and resend everything (the AMQ-2875 behaviour)
    resync_grace: float = 0.0
    # tree, the child's side (issue 18 part 2, federation/summary.py): when more than
    # this many interest entries would go up the link, advertise covering entries
    # instead (one per destination, selector and priority, plus one per
    # ``summary_owned`` pattern for the destinations its subtree's brokers own); 0 = off
    summary_budget: int = 0
    # patterns naming the broker that owns a queue, "{broker}" standing for one segment
    # (e.g. "queue://Store.{broker}.>"): the parent routes those down by subtree
    summary_owned: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        put = object.__setattr__
        if self.kind not in KINDS:
            raise ConfigError("kind", f"must be one of {KINDS}, not {self.kind!r}")
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("name", "must be a non-empty string")
        for key in ("network_ttl", "consumer_ttl", "message_ttl"):
            value = getattr(self, key)
            if value is None and key != "network_ttl":
                continue
            if type(value) is not int or value < -1:
                raise ConfigError(key, "must be an integer >= -1 (-1 = unlimited)")
        if self.consumer_ttl is None:
            put(self, "consumer_ttl", self.network_ttl)
        if self.message_ttl is None:
            put(self, "message_ttl", self.network_ttl)
        for key in ("prefetch", "max_demand_per_link"):
            value = getattr(self, key)
            if type(value) is not int or value < 1:
                raise ConfigError(key, "must be a positive integer")
        put(self, "dynamically_included",
            _destinations("dynamically_included", self.dynamically_included, wildcards=True))
        put(self, "excluded", _destinations("excluded", self.excluded, wildcards=True))
        put(self, "statically_included",
            _destinations("statically_included", self.statically_included, wildcards=False))
        if type(self.resync_grace) not in (int, float) or self.resync_grace < 0:
            raise ConfigError("resync_grace", "must be a number of seconds >= 0")
        if type(self.summary_budget) is not int or self.summary_budget < 0:
            raise ConfigError("summary_budget", "must be an integer >= 0 (0 = off)")
        owned = self.summary_owned
        if isinstance(owned, str) or not isinstance(owned, (list, tuple)):
            raise ConfigError("summary_owned", "must be a list of patterns")
        from treefed.federation.summary import Pattern   # a cycle at import time
        for text in owned:
            Pattern.parse(text)
        put(self, "summary_owned", tuple(owned))
        down = self.advertise_down
        if down is None:
            down = ("topic",) if self.route_unknown_up else ("queue", "topic")
        if isinstance(down, str) or not isinstance(down, (list, tuple)) \
                or any(k not in DOWN_KINDS for k in down):
            raise ConfigError("advertise_down", f"must be a list of {DOWN_KINDS}")
        put(self, "advertise_down", tuple(down))
        if self.node_type is not None and self.node_type not in ("leaf", "branch"):
            raise ConfigError("node_type", "a tree connector declares 'leaf' or 'branch'")

    def to_options(self) -> dict[str, Any]:
        """Plain CBOR-able dict for ``Hello.options`` (tuples become lists)."""
        out: dict[str, Any] = {}
        # LinkSettings' fields listed once (``dataclasses.fields`` per call: issue #14)
        plan = _OPTION_FIELDS if type(self) is LinkSettings else \
            [(f.name, f.name in _SILENT_DEFAULTS, f.default) for f in fields(self)]
        for name, silent, default in plan:
            value = getattr(self, name)
            if silent and value == default:
                continue   # issue 18 part 2: an unset summary leaves the hello unchanged
            out[name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_options(cls, options: Mapping[str, Any], **overrides: Any) -> "LinkSettings":
        """Rebuild settings sent by the dialing side; unknown keys are ignored (a newer
        peer may know more options).  Raises ConfigError on bad values."""
        known = _FIELD_NAMES if cls is LinkSettings else {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in options.items() if k in known}
        for key in ("dynamically_included", "excluded", "statically_included",
                    "advertise_down", "summary_owned"):
            if isinstance(kwargs.get(key), list):
                kwargs[key] = tuple(kwargs[key])
        kwargs.update(overrides)
        try:
            return cls(**kwargs)
        except TypeError as exc:  # a mistyped option the dataclass itself rejects
            raise ConfigError("options", str(exc)) from None


#: LinkSettings' field names (``dataclasses.fields`` is slow for a per-link call)
_FIELD_NAMES = frozenset(f.name for f in fields(LinkSettings))
#: ``to_options``' plan: (name, left out when it is its default, default) per field
_OPTION_FIELDS = tuple((f.name, f.name in _SILENT_DEFAULTS, f.default)
                       for f in fields(LinkSettings))
#: value types ``options_key`` takes as they are (a float goes by its repr: 0.0, -0.0)
_PLAIN = frozenset((str, int, bool, type(None)))


def options_key(options: Mapping[str, Any], overrides: Mapping[str, Any]) -> tuple | None:
    """A key equal only for ``from_options`` arguments that build equal settings, or None
    (not worth a key): each value goes with its type (``True == 1``, but a TTL of True is
    refused), lists and tuples only of strings, in the mappings' order."""
    parts: list = []
    for items in (options.items(), overrides.items()):
        parts.append(None)   # where a mapping starts
        for name, value in items:
            kind = type(value)
            if kind in _PLAIN:
                parts.append((name, kind, value))
            elif kind is float:
                parts.append((name, kind, repr(value)))
            elif kind is list or kind is tuple:
                for item in value:
                    if type(item) is not str:
                        return None
                parts.append((name, kind, tuple(value)))
            else:
                return None
    return tuple(parts)


@dataclass(frozen=True, slots=True)
class TreeSettings:
    """A site's own place in the tree. A site without TreeSettings that accepts tree
    children is the root."""

    node_type: str = "leaf"                         # "leaf" | "branch" | "root"
    route_unknown_up: bool = True                   # add fallback demand on the parent link
    # issue 18 part 2: our own uplink is configured with a summary_budget, so we can
    # pass children's covers on; a branch without it keeps its children plain
    summarises: bool = False

    def __post_init__(self) -> None:
        if self.node_type not in NODE_TYPES:
            raise ConfigError("node_type", f"must be one of {NODE_TYPES}, not {self.node_type!r}")
