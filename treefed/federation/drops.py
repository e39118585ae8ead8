"""DropDigest: refused advisories summarised per link and reason, for a broker's log.

Theory of operation
-------------------
The federation layer returns one ``Drop`` action per refused advisory.  A scenario run
wants every one of them (the Spark job counts them), but a deployed broker must not
write a line per refusal: one hostile or broken child sending a million bad advisories
would write a million lines (issue 12, defect 11: 554 MB of region log).

``DropDigest`` keeps, per (link, peer, reason), the *first* refusal of the current
interval and a count.  ``add`` answers whether this refusal is the first of its window
(the shell logs it as the example, at info); the rest are only counted (the shell may
log them at debug).  ``due(now)`` closes every window older than ``interval`` that
counted more than its example and returns one ``advisory.dropped.summary`` field dict
per window: link, peer, reason, count (refusals in the window, the example included),
interval and the example's consumer / dst / origin.  A window with just its example
closes silently.  Memory is bounded: at most ``max_windows`` open windows; past that,
refusals on new keys are counted in an overflow window (link ``"*"``).

Nothing here does I/O or reads a clock: ``now`` is an argument.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DropDigest", "SUMMARY_EVENT"]

#: the event name of a window's summary line (events.EVENTS)
SUMMARY_EVENT = "advisory.dropped.summary"


class _Window:
    __slots__ = ("opened", "count", "example")

    def __init__(self, opened: float, example: Any) -> None:
        self.opened = opened
        self.count = 1
        self.example = example


class DropDigest:
    """Refusals per (link, peer, reason) and interval (see the module docstring)."""

    __slots__ = ("interval", "max_windows", "_windows", "_next_due")

    def __init__(self, interval: float = 10.0, *, max_windows: int = 4096) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.interval = interval
        self.max_windows = max_windows
        self._windows: dict[tuple[str, str, str], _Window] = {}
        self._next_due: float | None = None

    def add(self, drop: Any, now: float) -> bool:
        """Count ``drop`` (a ``Drop`` action); True when it opens a window (log it)."""
        key = (drop.link, drop.peer, drop.reason)
        windows = self._windows
        window = windows.get(key)
        if window is not None:
            window.count += 1
            return False
        if len(windows) >= self.max_windows:
            key = ("*", "*", drop.reason)
            window = windows.get(key)
            if window is not None:
                window.count += 1
                return False
        windows[key] = _Window(now, drop)
        if self._next_due is None:
            self._next_due = now + self.interval
        return True

    def next_deadline(self) -> float | None:
        """When ``due`` next has something to close (None: nothing open)."""
        return self._next_due

    def due(self, now: float) -> list[dict[str, Any]]:
        """Close the windows older than ``interval``; their summaries (count > 1)."""
        if self._next_due is None or now < self._next_due:
            return []
        out = []
        keep: dict[tuple[str, str, str], _Window] = {}
        horizon = now - self.interval
        for key, window in self._windows.items():
            if window.opened > horizon:
                keep[key] = window
                continue
            if window.count > 1:
                ex = window.example
                out.append({"link": key[0], "peer": key[1], "reason": key[2],
                            "count": window.count, "interval": self.interval,
                            "consumer": ex.consumer, "dst": ex.dst, "origin": ex.origin})
        self._windows = keep
        self._next_due = min((w.opened for w in keep.values()), default=None)
        if self._next_due is not None:
            self._next_due += self.interval
        return out

    def pending(self) -> int:
        """Open windows (stat, tests)."""
        return len(self._windows)
