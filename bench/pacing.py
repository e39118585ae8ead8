"""Open-loop pacing for the benches' latency phases: sleep until a CLOCK_MONOTONIC instant
with microsecond resolution.

Why not ``trio.sleep_until``: trio waits in ``epoll_wait``, whose timeout is whole
milliseconds (CPython rounds a 0.6 ms wait up to 1 ms).  A producer that sleeps until
``t0 + i / 1000`` therefore wakes up to 1 ms late and then sends the next message at once
to catch up: at "1,000 msgs/s" 16 % of the messages left within 0.2 ms of the one before
(bench/broker_throughput.py, issue #14), so they queued behind it at every hop and the
latency tail measured the bench's bursts.  ActiveMQ's harness paces with
``LockSupport.parkNanos`` (anchors/activemq/bench/AmqBench.java), i.e. evenly.

``Pacer.sleep_until`` arms a timerfd (absolute CLOCK_MONOTONIC, the clock of
``time.monotonic()``) and waits for it to become readable in trio's own loop: no thread,
no spinning.  Where timerfd is missing (not Linux) it falls back to ``trio.sleep_until``.

``settle_heap`` -- a latency phase's client process (producer, consumer, the chain
bench's driver) collects once and freezes what it holds before the phase: its own
collector then walks only what the phase makes.  Without it the chain driver, which
keeps every earlier phase's results, ran an 11 ms full collection in the middle of a
latency phase (issue #14, 14g's traces), and a fresh client's first older-generation
passes (~0.5 ms) walked its start-up objects.  The collector stays on.
"""

from __future__ import annotations

import ctypes
import gc
import os
import time

import trio

__all__ = ["Pacer", "settle_heap", "sleep_until"]

_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class Pacer:
    """One timerfd; ``await sleep_until(t)`` returns at ``time.monotonic() >= t``."""

    def __init__(self) -> None:
        self.fd = -1
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            create, self._settime = libc.timerfd_create, libc.timerfd_settime
        except (OSError, AttributeError):   # no timerfd: trio's millisecond timer
            return
        self._settime.argtypes = [ctypes.c_int, ctypes.c_int,
                                  ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
        fd = create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd >= 0:
            self.fd = fd

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until ``time.monotonic()`` reaches ``deadline``."""
        now = time.monotonic()
        if deadline <= now:
            await trio.lowlevel.checkpoint()
            return
        if self.fd < 0:
            await trio.sleep_until(trio.current_time() + (deadline - now))
            return
        sec = int(deadline)
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(sec, int((deadline - sec) * 1e9)))
        if self._settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        while True:
            await trio.lowlevel.wait_readable(self.fd)
            try:
                os.read(self.fd, 8)   # the expiration count: the timer fired
                return
            except BlockingIOError:   # woken without an expiration: wait again
                continue

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Pacer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_PACER: Pacer | None = None


async def sleep_until(deadline: float) -> None:
    """``Pacer.sleep_until`` on this process's one pacer (made at the first call)."""
    global _PACER
    if _PACER is None:
        _PACER = Pacer()
    await _PACER.sleep_until(deadline)


def settle_heap() -> None:
    """Collect, then freeze everything alive (see the module doc)."""
    gc.collect()
    gc.freeze()
