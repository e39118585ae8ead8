"""``treefed wait URI``: block until a broker answers (and, with ``--link-up``, its links
are up), so a walk-through pasted as one block does not race a broker still starting.

Theory of operation
-------------------
``wait_ready`` asks ``stat(uri)`` again and again (each attempt bounded by what is left of
the timeout) until ``ready(stats)`` says yes, sleeping ``POLL`` between attempts.  Ready
means "answered"; with ``link_up``, also that its tree connector (the parent link) is
operational, or — on a broker without one — every connector it dials.  The reason the
broker is not ready yet is kept, so a timeout says why (refused, no answer, link
waiting with its last error) rather than only "timed out".
"""

from __future__ import annotations

import time
from typing import Awaitable, Callable

import trio

__all__ = ["wait_ready", "not_ready_reason", "POLL"]

#: Seconds between two attempts.
POLL = 0.1


def not_ready_reason(stats: dict, link_up: bool) -> str | None:
    """Why a broker that answered is not ready yet (None: it is)."""
    if not link_up:
        return None
    connectors = stats.get("connectors", ())
    tree = [c for c in connectors if c.get("connector") == "tree"]
    for c in tree or connectors:
        if c.get("state") != "operational":
            why = f": {c['last_error']}" if c.get("last_error") else ""
            return f"link {c.get('name')} to {c.get('uri')} is {c.get('state')}{why}"
    return None


async def wait_ready(uri: str, stat: Callable[[str], Awaitable[dict]], *,
                     timeout: float, link_up: bool = False) -> tuple[bool, str]:
    """(True, "") once ready; (False, last reason) when ``timeout`` passed first."""
    deadline = time.monotonic() + timeout
    reason = "no attempt made"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False, reason
        try:
            with trio.fail_after(left):
                stats = await stat(uri)
        except trio.TooSlowError:
            return False, reason if reason != "no attempt made" else "no answer"
        except Exception as exc:   # noqa: BLE001 - not ready yet, whatever it was
            reason = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        else:
            why = not_ready_reason(stats, link_up)
            if why is None:
                return True, ""
            reason = why
        await trio.sleep(min(POLL, max(0.0, deadline - time.monotonic())))
