"""Polling for a while instead of sleeping after a read: an opt-in idle strategy (#14).

Theory of operation
-------------------
A process that waits for its next frame sleeps in ``epoll_wait``; the peer that writes to
it pays for waking it (an inter-processor interrupt — through the hypervisor on a
virtual machine) and the frame waits for the wake-up.  ``bench/hop_floor.py`` measured
on the development VM: a 100-byte ``write`` costs 27–42 µs to a sleeping peer (spells of
140–170) against 15–18 µs to one that polls, and a hop between two bare Python processes
60–100 µs; a one-at-a-time send with a consumer crosses four such hops.  Polling for a
little while after each read, instead of sleeping at once, takes the wake-ups off a
request/response flow at the price of CPU time spent polling — the trade Aeron's idle
strategies and Linux's busy-poll sockets offer.  Off by default: a store's till should not
pay a core for a latency it may not need.

``IdlePoller(max_us)`` lives in one trio run (a broker's node, a client connection) and is
given to its ``FramedStream``s.  ``poke()`` — every read that returned bytes — notes the
time; ``run()`` is a task that, after a poke, keeps yielding (``os.sched_yield`` and a
trio checkpoint, so trio polls its sockets with a zero timeout and runs whoever became
ready) until ``window`` passes with no new read, then sleeps until the next poke.

The window adapts (``PollWindow``, pure), as KVM's halt polling does: when a read comes
``gap`` after the previous one and the poller was not polling then (it had given up, or
its window was 0), a gap within ``max_us`` means polling that long would have caught it,
so the window grows (to ``GROW`` × itself, at least ``gap`` × ``COVER`` and
``START_US``, at most ``max_us``); a longer gap means polling was wasted and the window
halves (below ``START_US`` it is 0: no polling).  Steady traffic every millisecond with
``max_us`` 500 therefore polls nothing; a one-at-a-time producer whose receipts come
0.7 ms after its sends polls through the wait.  ``hits`` / ``misses`` count polls that
saw a read / that gave up.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import trio

__all__ = ["IdlePoller", "PollWindow", "MAX_US", "START_US", "GROW", "COVER"]

#: the largest window an operator may configure (µs): polling is for sub-millisecond gaps
MAX_US = 10_000
#: the smallest window polling starts with (µs); a window shrunk below it is 0
START_US = 20.0
#: a window that caught too little grows by this factor at least
GROW = 2.0
#: a window grows to cover the gap that was missed with this margin
COVER = 1.25


class PollWindow:
    """How long to poll after a read (µs), from the gaps between reads.  Pure."""

    __slots__ = ("max_us", "us")

    def __init__(self, max_us: float) -> None:
        if not 0 <= max_us <= MAX_US:
            raise ValueError(f"idle poll window must be 0..{MAX_US} µs, got {max_us}")
        self.max_us = float(max_us)
        self.us = 0.0

    def missed(self, gap_us: float) -> None:
        """A read came ``gap_us`` after the previous one while nobody polled."""
        if not self.max_us:
            return
        if gap_us <= self.max_us:
            self.us = min(self.max_us, max(self.us * GROW, gap_us * COVER, START_US))
        else:
            self.us /= 2
            if self.us < START_US:
                self.us = 0.0


class IdlePoller:
    """Polls after reads for ``PollWindow`` µs (see the module doc).  ``poke`` from the
    readers; ``run`` as a task of the same trio run."""

    __slots__ = ("window", "hits", "misses", "_last", "_polling", "_wake", "_clock")

    def __init__(self, max_us: float, *, clock: Callable[[], float] = time.perf_counter,
                 ) -> None:
        self.window = PollWindow(max_us)
        self._clock = clock      # seconds; tests give their own
        self.hits = 0            # polls during which a read came
        self.misses = 0          # polls that ended with no read
        self._last = 0.0         # perf_counter() of the last read
        self._polling = False
        self._wake = trio.Event()

    def poke(self) -> None:
        """A read returned bytes."""
        now = self._clock()
        if not self._polling:
            if self._last:
                self.window.missed((now - self._last) * 1e6)
            if self.window.us:
                self._wake.set()
        self._last = now

    async def run(self) -> None:
        clock, yield_cpu = self._clock, os.sched_yield
        checkpoint = trio.lowlevel.checkpoint
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            self._polling = True
            try:
                seen = self._last
                while True:
                    if clock() - seen >= self.window.us * 1e-6:
                        self.misses += 1
                        break
                    yield_cpu()          # another process runnable here goes first
                    await checkpoint()   # trio polls its sockets, runs what is ready
                    if self._last != seen:
                        self.hits += 1
                        seen = self._last
            finally:
                self._polling = False

    def statistics(self) -> dict:
        return {"window_us": round(self.window.us, 1), "max_us": self.window.max_us,
                "hits": self.hits, "misses": self.misses}
