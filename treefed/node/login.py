"""The shell half of the login throttle (issue #12, defect 10): serialised attempts.

Theory of operation
-------------------
``LoginGate.login(hello, identity, source)`` runs one accepted connection's password /
certificate check the way ``security/throttle.py`` describes:

1. take a lock per throttle key (``src:<address>``, ``user:<name>``; always in that
   order, so two attempts never wait for each other crosswise) -- parallel attempts from
   one address or against one user run one after the other;
2. ``gate``: a locked-out key is refused at once, without a password check (the answer
   still waits ``failure_delay``, outside the locks); otherwise sleep what earlier
   failures still owe, *before* the check;
3. the check (scrypt) in a worker thread, at most ``threads`` at a time broker-wide --
   since one key holds at most one of them, a guessing burst from one address or at one
   user leaves the others to everybody else's logins;
4. ``record`` the outcome; a failure's answer is held back its delay while the locks are
   still held, so the next queued attempt cannot start before it.

A lock lives only while someone holds or waits for it (no memory per past attempt).
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, AsyncIterator

import trio

from treefed.security.auth import AuthResult, Authenticator, safe_name
from treefed.security.throttle import throttle_keys

__all__ = ["LoginGate"]


class LoginGate:
    """Serialised, throttled logins for one broker (see the module docstring)."""

    def __init__(self, auth: Authenticator, threads: int) -> None:
        self.auth = auth
        self.throttle = auth.throttle
        self.limiter = trio.CapacityLimiter(threads)
        self._locks: dict[str, list] = {}   # key -> [trio.Lock, holders + waiters]

    @asynccontextmanager
    async def _hold(self, keys: tuple[str, ...]) -> AsyncIterator[None]:
        counted: list[str] = []
        acquired: list[trio.Lock] = []
        try:
            for key in keys:
                entry = self._locks.get(key)
                if entry is None:
                    entry = self._locks[key] = [trio.Lock(), 0]
                entry[1] += 1
                counted.append(key)
                await entry[0].acquire()
                acquired.append(entry[0])
            yield
        finally:
            for lock in reversed(acquired):
                lock.release()
            for key in counted:
                entry = self._locks[key]
                entry[1] -= 1
                if not entry[1]:
                    del self._locks[key]

    async def login(self, hello: Any, identity: Any, source: str) -> AuthResult:
        """The verdict on ``hello``; a failure's ``delay`` has already been waited."""
        auth, throttle = self.auth, self.throttle
        claimed = safe_name(hello.username) if hello.username is not None else None
        keys = throttle_keys(claimed, source)
        locked = None
        async with self._hold(keys):
            verdict, value = throttle.gate(keys, time.time())
            if verdict == "locked":
                broker_id = safe_name(hello.broker_id) if hello.role == "broker" else None
                locked = AuthResult(False, None, "password" if claimed else "none",
                                    f"locked out after {throttle.lockout_failures} "
                                    f"failures until {value:.0f}", claimed, broker_id,
                                    delay=auth.failure_delay)
            else:
                if value > 0:
                    await trio.sleep(value)
                result = await trio.to_thread.run_sync(auth.check, hello, identity,
                                                       limiter=self.limiter)
                delay = throttle.record(keys, result.ok, time.time())
                if result.ok:
                    return result
                result = replace(result, delay=delay)
                await trio.sleep(delay)
                return result
        await trio.sleep(locked.delay)
        return locked

    def statistics(self) -> dict:
        return {"waiting_keys": len(self._locks)}
