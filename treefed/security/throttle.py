"""Login throttle: per user and per source address (issue #12, defect 10).

Theory of operation
-------------------
Every login attempt is filed under its *keys*: ``src:<address>`` and, when it names a
user, ``user:<name>``.  The shell (``node._authenticate``) runs each attempt holding a
lock per key (``KeyLocks``), so attempts from one address, or against one user, are
**serialised**: a burst of parallel guesses queues, one at a time, and can occupy at most
one password-check thread per key -- the other users' logins keep the rest.

``LoginThrottle`` keeps, per key, the failures of the current window and the time before
which no further attempt may be *answered* (``not_before``):

* ``gate(keys, now)`` before the password check: ``("locked", until)`` when a key has
  ``lockout_failures`` recent failures (refused without a password check, until the
  window after the last failure has passed), else ``("wait", seconds)``: the delay still
  owed by earlier failures, slept *before* the check -- parallel attempts cannot skip it;
* ``record(keys, ok, now)`` after it: a failure counts on every key and sets
  ``not_before = now + delay`` with the delay doubling per failure (``failure_delay`` up
  to ``max_failure_delay``); the failed attempt's answer is held back that long too.  A
  success clears its *user* key only: a guesser who also owns an account cannot reset
  the counters of its address by logging in between guesses.

Unknown user names are keyed like known ones (the throttle must not reveal which names
exist); memory is bounded by ``max_tracked`` keys (expired ones go first, then the
oldest).  Pure: ``now`` is an argument, no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["LoginThrottle", "throttle_keys"]


def throttle_keys(user: object, source: str) -> tuple[str, ...]:
    """The keys of one attempt, in lock order (source first)."""
    keys = []
    if source:
        keys.append("src:" + source)
    if isinstance(user, str) and user:
        keys.append("user:" + user[:128])
    return tuple(keys)


class LoginThrottle:
    """See the module docstring."""

    __slots__ = ("failure_delay", "max_failure_delay", "failure_window", "lockout_failures",
                 "max_tracked", "_state")

    def __init__(self, *, failure_delay: float = 1.0, max_failure_delay: float = 30.0,
                 failure_window: float = 300.0, lockout_failures: int = 10,
                 max_tracked: int = 10_000) -> None:
        self.failure_delay = failure_delay
        self.max_failure_delay = max_failure_delay
        self.failure_window = failure_window
        self.lockout_failures = lockout_failures      # 0: never lock out
        self.max_tracked = max_tracked
        # key -> [failures in window, time of the last failure, not_before]
        self._state: dict[str, list] = {}

    def _live(self, key: str, now: float) -> list | None:
        entry = self._state.get(key)
        if entry is not None and now - entry[1] > self.failure_window:
            del self._state[key]
            return None
        return entry

    def gate(self, keys: Sequence[str], now: float) -> tuple[str, float]:
        """``("locked", until)`` or ``("wait", seconds to wait before checking)``."""
        wait = 0.0
        for key in keys:
            entry = self._live(key, now)
            if entry is None:
                continue
            if self.lockout_failures and entry[0] >= self.lockout_failures:
                return "locked", entry[1] + self.failure_window
            wait = max(wait, entry[2] - now)
        return "wait", wait

    def record(self, keys: Sequence[str], ok: bool, now: float) -> float:
        """Record an attempt's outcome; returns how long to hold back a failure's answer."""
        if ok:
            for key in keys:
                if key.startswith("user:"):
                    self._state.pop(key, None)
            return 0.0
        worst = 0
        for key in keys:
            entry = self._live(key, now)
            if entry is None:
                entry = self._state[key] = [0, now, now]
            entry[0] += 1
            entry[1] = now
            worst = max(worst, entry[0])
        delay = min(self.max_failure_delay,
                    self.failure_delay * 2 ** (min(max(worst, 1), 64) - 1))
        for key in keys:
            self._state[key][2] = now + delay
        if len(self._state) > self.max_tracked:
            self._prune(now)
        return delay

    def failures(self, key: str) -> int:
        entry = self._state.get(key)
        return entry[0] if entry is not None else 0

    def _prune(self, now: float) -> None:
        state = self._state
        for key in [k for k, e in state.items() if now - e[1] > self.failure_window]:
            del state[key]
        if len(state) > self.max_tracked:  # under attack: keep the newest half
            newest = sorted(state.items(), key=lambda kv: kv[1][1])[len(state) // 2:]
            state.clear()
            state.update(newest)
