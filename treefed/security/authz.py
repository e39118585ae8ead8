"""Authorization: who may read, write or administer which destinations.

Theory of operation
-------------------
A ``Rule`` grants one principal one permission on one pattern (``patterns.py``):

* principal: a user name, ``group:<name>``, or ``*`` (every authenticated user);
* permission: ``read`` (subscribe; a broker link: advertise interest), ``write`` (send;
  a broker link: forward), ``admin`` (stat and admin frames; ``is_admin`` asks for admin
  on ``>``, everything, because a broker-wide statistic names every destination);
* pattern: wildcards ``*`` / ``>``, the bare ``>`` for every destination, and
  ``{user}`` for the checking user's own name, so one group rule gives every store its
  own queues (``queue://Store.{user}.>``).

Rules only grant: anything no rule grants is refused, and there is no deny rule whose
order could surprise a reader.  A wildcard subscription must be covered *whole* by one
granted pattern (``queue://Store.>`` is refused to a user granted only its own store).
Temporary destinations (reply queues) are open to every authenticated user unless
``temp_destinations=False``: their names are unguessable and owned by one connection,
which the core enforces.  Only *named* ones: a wildcard over temp names
(``temp-queue://>``) is granted by a rule or not at all (issue #12, defect 3).

``check`` is on the per-message path, so its answers are cached per (user, permission,
destination) in nested dicts (no key tuple allocated per call); the cache is dropped
whole when it outgrows ``cache_size`` — simple, and the working set refills it at once.

Never: does I/O, logs, or treats an unauthenticated caller (``user=None``) as anyone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from treefed.core.destinations import is_wildcard
from treefed.security.patterns import ANY, Pattern, compile_pattern
from treefed.wire.frames import Error

__all__ = ["Rule", "Authorizer", "PERMISSIONS", "DENIED", "denied"]

PERMISSIONS = ("read", "write", "admin")
#: Error frame code of a refused operation.
DENIED = "not_authorized"

_VERBS = {"read": "read from", "write": "write to", "admin": "administer"}


def denied(permission: str, dst: str, ref: str | None = None) -> Error:
    """The Error frame refusing ``permission`` on ``dst`` (request ``ref``)."""
    return Error(DENIED, f"not authorized to {_VERBS.get(permission, permission)} {dst}",
                 ref)


@dataclass(frozen=True, slots=True)
class Rule:
    """One grant: ``principal`` may ``permission`` destinations matching ``pattern``."""

    principal: str   # user name | "group:<name>" | "*"
    permission: str  # read | write | admin
    pattern: str     # permission pattern; {user} = the checking user's name

    def __post_init__(self) -> None:
        if self.permission not in PERMISSIONS:
            raise ValueError(f"permission must be one of {PERMISSIONS}, "
                             f"not {self.permission!r}")
        if not self.principal or self.principal == "group:":
            raise ValueError("principal must be a user name, group:<name> or *")


class Authorizer:
    """Answers ``check(user, permission, dst)``; see the module docstring."""

    __slots__ = ("_grants", "_groups", "_temp", "_cache", "_cache_size", "_cached",
                 "_compiled", "hits", "misses")

    def __init__(self, rules: Iterable[Rule], groups: Mapping[str, Iterable[str]] = {}, *,
                 temp_destinations: bool = True, cache_size: int = 100_000) -> None:
        # principal -> permission -> compiled patterns; patterns compiled once, here, so a
        # bad one fails at start-up, not at the first message.
        self._grants: dict[str, dict[str, list[Pattern]]] = {}
        for rule in rules:
            pattern = compile_pattern(rule.pattern, ("user",))
            per = self._grants.setdefault(rule.principal, {})
            per.setdefault(rule.permission, []).append(pattern)
        # user -> its principals in grant order: itself, its groups, "*"
        self._groups = {user: tuple(gs) for user, gs in groups.items()}
        self._temp = temp_destinations
        self._cache: dict[str, dict[str, dict[str, bool]]] = {}
        self._cache_size = cache_size
        self._cached = 0
        # user -> permission -> (patterns, bindings), built on the user's first check
        self._compiled: dict[str, dict[str, tuple[tuple[Pattern, ...], dict]]] = {}
        self.hits = 0     # answers served from the cache
        self.misses = 0   # answers computed

    def principals(self, user: str) -> tuple[str, ...]:
        """The principals ``user`` acts as: itself, ``group:<g>`` per group, ``*``."""
        return (user, *(f"group:{g}" for g in self._groups.get(user, ())), "*")

    def patterns(self, user: str, permission: str) -> tuple[Pattern, ...]:
        """Every pattern granting ``permission`` to ``user`` (placeholders unbound)."""
        return self._entry(user, permission)[0]

    def _entry(self, user: str, permission: str) -> tuple[tuple[Pattern, ...], dict]:
        per_user = self._compiled.get(user)
        if per_user is None:
            per_user = self._compiled[user] = {}
        entry = per_user.get(permission)
        if entry is None:
            found: list[Pattern] = []
            for principal in self.principals(user):
                found += self._grants.get(principal, {}).get(permission, ())
            entry = per_user[permission] = (tuple(dict.fromkeys(found)), {"user": (user,)})
        return entry

    def check(self, user: str | None, permission: str, dst: str) -> bool:
        """May ``user`` do ``permission`` on canonical ``dst`` (wildcards allowed)?"""
        if user is None:
            return False
        by_perm = self._cache.get(user)
        if by_perm is not None:
            answers = by_perm.get(permission)
            if answers is not None:
                answer = answers.get(dst)
                if answer is not None:
                    self.hits += 1
                    return answer
        self.misses += 1
        answer = self._decide(user, permission, dst)
        if self._cached >= self._cache_size:
            self._cache.clear()
            self._cached = 0
        self._cache.setdefault(user, {}).setdefault(permission, {})[dst] = answer
        self._cached += 1
        return answer

    def _decide(self, user: str, permission: str, dst: str) -> bool:
        if self._temp and permission != "admin" and dst.startswith("temp-") \
                and not is_wildcard(dst):
            # one named temp destination: its owner is enforced by the core; a wildcard
            # over temp names reads other connections' replies, so only a rule grants it
            return True
        patterns, bindings = self._entry(user, permission)
        for pattern in patterns:
            if pattern.covers(dst, bindings):
                return True
        return False

    def is_admin(self, user: str | None) -> bool:
        """Admin on everything (``>``): what broker-wide statistics require."""
        return user is not None and any(p.text == ANY for p in self.patterns(user, "admin"))

    def statistics(self) -> dict:
        return {"cached": self._cached, "hits": self.hits, "misses": self.misses}
