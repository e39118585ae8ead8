"""Listen ports for brokers that a process starts itself: the procs engine, the tests and
the benches pick a port first and write it into a broker's config, and the broker binds it
later, in another process.

Binding port 0 and releasing it is not enough for that. The kernel may hand the same port
to the next bind-to-0 at once (two brokers of one estate were given one port, and one of
them failed with "Address already in use"), and a port from the ephemeral range can be taken
in the gap by the source port of any outgoing connection. So a port comes from below the
kernel's ephemeral range, is checked free by binding it, and is never handed out twice by
one process.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

__all__ = ["free_port", "free_ports", "ephemeral_range"]

#: lowest port handed out: well clear of the registered services most hosts run
LOWEST = 20000
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_given: set[int] = set()
_lock = threading.Lock()
_rng = random.Random()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for source ports of outgoing connections (Linux's default when
    the kernel does not say)."""
    try:
        low, high = (int(x) for x in _RANGE_FILE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _outside_ephemeral() -> tuple[int, int]:
    low, high = ephemeral_range()
    if low - 1 - LOWEST >= 1000:
        return LOWEST, low - 1
    if 65535 - high >= 1000:
        return high + 1, 65535
    return LOWEST, 65535      # no room outside: distinctness still holds


def _bindable(port: int, host: str) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports on ``host`` that nobody listens on now, outside the ephemeral
    range, none of them handed out before by this process."""
    bottom, top = _outside_ephemeral()
    out: list[int] = []
    with _lock:
        tries = 0
        while len(out) < n:
            tries += 1
            if tries > 50 * (n + 100):
                raise OSError(f"no free port left in {bottom}-{top} on {host}")
            port = _rng.randint(bottom, top)
            if port in _given or not _bindable(port, host):
                continue
            _given.add(port)
            out.append(port)
    return out


def free_port(host: str = "127.0.0.1") -> int:
    """One port as :func:`free_ports` gives them."""
    return free_ports(1, host)[0]
