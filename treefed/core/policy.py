"""Per-destination policy: limits, what to do when full, expiry handling, local-only.

Theory of operation
-------------------
A ``PolicySet`` is an ordered list of ``(pattern, DestinationPolicy)``; the first pattern
that matches a destination decides its policy, otherwise the set's default applies --
the same first-match rule as a firewall table, so the order in the config file is the
order of precedence.  The broker asks once per destination (``for_destination`` caches),
so the cost of a long table is paid when a destination is created, not per message.

``DestinationPolicy`` is frozen and validated on construction: a bad value is the
operator's mistake and raises ConfigError (a LocalError), never at message time.
All limits use 0 for "unlimited".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from treefed.core.destinations import matches, parse_destination
from treefed.errors import ConfigError, DestinationError

__all__ = ["DestinationPolicy", "PolicySet", "LIMIT_BEHAVIOURS", "EXPIRY_ACTIONS"]

#: What a full destination does with a new message: park the producer, refuse the new
#: message, or make room by dropping the oldest pending one.
LIMIT_BEHAVIOURS = ("block", "reject_newest", "drop_oldest")
#: What happens to a message whose ttl ran out before delivery.
EXPIRY_ACTIONS = ("dlq", "discard")

_CACHE_SIZE = 16384


@dataclass(frozen=True, slots=True)
class DestinationPolicy:
    max_messages: int = 0
    """Most messages held (pending + unacknowledged); 0 = unlimited."""
    max_bytes: int = 0
    """Most bytes held (Message.size summed); 0 = unlimited."""
    limit_behaviour: str = "block"
    """One of LIMIT_BEHAVIOURS, applied when max_messages or max_bytes is reached."""
    max_message_bytes: int = 0
    """Largest single message accepted (Message.size); 0 = unlimited."""
    local_only: bool = False
    """Messages never leave this broker: network demand is not offered them."""
    on_expiry: str = "dlq"
    """One of EXPIRY_ACTIONS."""

    def __post_init__(self) -> None:
        for key in ("max_messages", "max_bytes", "max_message_bytes"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(key, f"must be a non-negative integer, not {value!r}")
        if self.limit_behaviour not in LIMIT_BEHAVIOURS:
            raise ConfigError("limit_behaviour", f"must be one of {', '.join(LIMIT_BEHAVIOURS)},"
                                                 f" not {self.limit_behaviour!r}")
        if self.on_expiry not in EXPIRY_ACTIONS:
            raise ConfigError("on_expiry", f"must be one of {', '.join(EXPIRY_ACTIONS)},"
                                           f" not {self.on_expiry!r}")
        if not isinstance(self.local_only, bool):
            raise ConfigError("local_only", f"must be true or false, not {self.local_only!r}")

    @property
    def limited(self) -> bool:
        """True when any size or count limit is set (the broker skips checks otherwise)."""
        return bool(self.max_messages or self.max_bytes or self.max_message_bytes)


class PolicySet:
    """Ordered ``(pattern, policy)`` table; first match wins, else ``default``."""

    __slots__ = ("_entries", "_default", "_cache")

    def __init__(self, entries: Iterable[tuple[str, DestinationPolicy]] = (),
                 default: DestinationPolicy | None = None) -> None:
        checked: list[tuple[str, DestinationPolicy]] = []
        for i, (pattern, policy) in enumerate(entries):
            try:
                canonical = parse_destination(pattern, allow_wildcards=True)
            except DestinationError as exc:
                raise ConfigError(f"policies[{i}].pattern", exc.message) from None
            if not isinstance(policy, DestinationPolicy):
                raise ConfigError(f"policies[{i}]", "expected a DestinationPolicy")
            checked.append((canonical, policy))
        self._entries = tuple(checked)
        self._default = default if default is not None else DestinationPolicy()
        self._cache: dict[str, DestinationPolicy] = {}

    @property
    def entries(self) -> tuple[tuple[str, DestinationPolicy], ...]:
        return self._entries

    @property
    def default(self) -> DestinationPolicy:
        return self._default

    def __len__(self) -> int:
        return len(self._entries)

    def for_destination(self, dst: str) -> DestinationPolicy:
        """The policy of canonical destination ``dst`` (cached per destination)."""
        policy = self._cache.get(dst)
        if policy is None:
            policy = self._default
            for pattern, candidate in self._entries:
                if matches(pattern, dst):
                    policy = candidate
                    break
            if len(self._cache) >= _CACHE_SIZE:
                self._cache.clear()   # temp destinations churn; keep the cache bounded
            self._cache[dst] = policy
        return policy
