"""Reconnect back-off: how long to wait before the next connection attempt, and when to
give up.

Theory of operation
-------------------
A ``Backoff`` is consulted once per connection attempt: ``next_delay(rng)`` returns the
seconds to wait before trying, or None when the attempts are used up.  The delays of one
round of attempts are ``0, initial, initial*m, initial*m**2, ...`` capped at ``maximum``
(``initial`` every time when not exponential): the very first connect is immediate, the
first *re*connect waits ``initial``.

``max_attempts`` counts reconnect attempts, ActiveMQ style: with N the first round allows
the initial connect plus N retries, a round after a lost connection allows N attempts;
None is unlimited.  ``connected(now)`` / ``disconnected(now)`` bracket a live connection.
A connection that lived at least ``reset_after`` seconds resets the delay to ``initial``;
one that died sooner keeps growing it, so a peer that accepts and immediately drops us is
not hammered.  ``jitter`` (a fraction, e.g. 0.1 for +/-10%) spreads the returned delays so
thousands of stores do not reconnect to a restarted parent in lock step; it is drawn from
the caller's seeded ``random.Random``, never from global state.

Pure: no clock (``now`` is an argument), no sleeping, no global randomness.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from treefed.errors import ConfigError
from treefed.transport.uri import Endpoint, Target

if TYPE_CHECKING:
    import random

__all__ = ["Backoff", "backoff_for"]


class Backoff:
    """Delay schedule and attempt budget for one reconnecting link."""

    __slots__ = ("initial", "maximum", "multiplier", "exponential", "jitter", "max_attempts",
                 "reset_after", "_delay", "_left", "_up_since", "_attempts")

    def __init__(self, initial: float, maximum: float, multiplier: float = 2.0,
                 exponential: bool = True, jitter: float = 0.0,
                 max_attempts: int | None = None, reset_after: float = 5.0) -> None:
        if not 0 <= initial <= maximum:
            raise ConfigError("initial_reconnect_delay",
                              f"must be between 0 and max_reconnect_delay ({maximum}), "
                              f"got {initial}")
        if not multiplier >= 1.0:
            raise ConfigError("backoff_multiplier", f"must be >= 1, got {multiplier}")
        if not 0.0 <= jitter < 1.0:
            raise ConfigError("jitter", f"must be in [0, 1), got {jitter}")
        if max_attempts is not None and max_attempts < 0:
            raise ConfigError("max_reconnect_attempts", f"must be >= 0 or None, "
                                                        f"got {max_attempts}")
        if not reset_after >= 0:
            raise ConfigError("reset_after", f"must be >= 0, got {reset_after}")
        self.initial = initial
        self.maximum = maximum
        self.multiplier = multiplier
        self.exponential = exponential
        self.jitter = jitter
        self.max_attempts = max_attempts
        self.reset_after = reset_after
        self._delay = 0.0               # un-jittered delay before the next attempt
        # attempts left in this round; the first round also has the initial connect
        self._left = None if max_attempts is None else max_attempts + 1
        self._up_since: float | None = None   # when the current connection came up
        self._attempts = 0              # attempts made in this round (for logs)

    @property
    def attempts(self) -> int:
        """Attempts made since the last successful connection (or since creation)."""
        return self._attempts

    def next_delay(self, rng: random.Random) -> float | None:
        """Seconds to wait before the next attempt, or None: give up."""
        if self._left is not None:
            if self._left <= 0:
                return None
            self._left -= 1
        self._attempts += 1
        delay = self._delay
        if delay == 0.0:
            self._delay = self.initial
        elif self.exponential:
            self._delay = min(delay * self.multiplier, self.maximum)
        if self.jitter and delay:
            delay *= 1.0 + self.jitter * (2.0 * rng.random() - 1.0)
            delay = min(delay, self.maximum)
        return delay

    def connected(self, now: float) -> None:
        """The attempt succeeded at ``now``."""
        self._up_since = now
        self._attempts = 0

    def disconnected(self, now: float) -> None:
        """The connection was lost at ``now``; the next round of attempts starts."""
        lived = now - self._up_since if self._up_since is not None else 0.0
        if lived >= self.reset_after or self._delay == 0.0:
            self._delay = self.initial
        self._left = self.max_attempts
        self._up_since = None
        self._attempts = 0


def backoff_for(target: Target, *, jitter: float = 0.0, reset_after: float = 5.0) -> Backoff:
    """The Backoff a parsed URI asks for. A bare endpoint gets one attempt and no retry
    (a plain ActiveMQ tcp:// transport does not reconnect either)."""
    if isinstance(target, Endpoint):
        return Backoff(0.0, 0.0, max_attempts=0, reset_after=reset_after)
    return Backoff(
        target.initial_reconnect_delay,
        target.max_reconnect_delay,
        target.backoff_multiplier,
        target.use_exponential_backoff,
        jitter=jitter,
        max_attempts=target.retry_limit,
        reset_after=reset_after,
    )
