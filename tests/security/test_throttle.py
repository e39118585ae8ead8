"""The password throttle (issue #12, defect 10): per user and per source address,
attempts are serialised, the delay comes before the answer (parallel attempts cannot
skip it), a key is locked out after N failures, a success does not reset its source's
counter, and a guessing burst does not delay another user's login much.

Real brokers on 127.0.0.1 with real scrypt; the second source address is a second
loopback address (127.0.0.2), which Linux routes to lo."""

from __future__ import annotations

import functools
import time

import pytest
import trio

from treefed.config import parse_config
from treefed.node import BrokerNode
from treefed.node.login import LoginGate
from treefed.security.auth import Authenticator
from treefed.security.passwords import hash_password
from treefed.security.throttle import LoginThrottle, throttle_keys
from treefed.transport.framed import FramedStream
from treefed.wire.frames import PROTOCOL_VERSION, Error, Hello


@functools.cache
def pw_hash(password: str, n: int = 2 ** 6) -> str:
    return hash_password(password, n=n)


class TestThrottleUnit:
    def test_gate_owes_earlier_delays_and_locks_out(self):
        t = LoginThrottle(failure_delay=1.0, max_failure_delay=8.0, failure_window=60.0,
                          lockout_failures=3)
        keys = throttle_keys("alice", "10.0.0.1")
        assert t.gate(keys, 0.0) == ("wait", 0.0)
        assert t.record(keys, False, 0.0) == 1.0
        assert t.gate(keys, 0.25) == ("wait", 0.75)    # owed before the next check
        assert t.record(keys, False, 1.0) == 2.0
        assert t.record(keys, False, 3.0) == 4.0
        assert t.gate(keys, 7.0) == ("locked", 63.0)
        assert t.gate(keys, 64.0) == ("wait", 0.0)     # the window passed

    def test_success_clears_the_user_not_the_source(self):
        t = LoginThrottle(failure_delay=1.0)
        t.record(throttle_keys("alice", "s"), False, 0.0)
        t.record(throttle_keys("mallory", "s"), True, 1.0)     # the guesser's own login
        t.record(throttle_keys("alice", "s"), True, 2.0)
        assert t.failures("src:s") == 1 and t.failures("user:alice") == 0

    def test_other_users_and_sources_are_not_slowed(self):
        t = LoginThrottle(failure_delay=1.0, lockout_failures=2)
        for i in range(5):
            t.record(throttle_keys("alice", "evil"), False, float(i))
        assert t.gate(throttle_keys("bob", "good"), 5.0) == ("wait", 0.0)
        assert t.gate(throttle_keys("alice", "good"), 5.0)[0] == "locked"
        assert t.gate(throttle_keys("bob", "evil"), 5.0)[0] == "locked"


def doc(tmp_path, *, n: int = 2 ** 6, **security) -> dict:
    return {
        "broker": {"id": "hq", "data_dir": str(tmp_path / "hq"),
                   "listen": ["tcp://127.0.0.1:0"], "heartbeat_interval": 0.0},
        "logging": {"level": "warning"},
        "security": {
            "authentication": True, "failure_delay": 0.05, "max_failure_delay": 0.4,
            "user": [{"name": "victim", "password_hash": pw_hash("victim-pw", n)},
                     {"name": "ops", "password_hash": pw_hash("ops-pw", n)},
                     {"name": "mallory", "password_hash": pw_hash("mallory-pw", n)}],
            "permission": [{"principal": "*", "read": ["queue://>"]}],
            **security},
    }


async def start(nursery, document) -> tuple[BrokerNode, int]:
    node = BrokerNode(parse_config(document))
    (_, port), *_ = await nursery.start(node.serve)
    return node, port


async def login(port: int, user: str, password: str, *,
                source: str = "127.0.0.1") -> tuple[bool, float]:
    """One raw login from ``source``: (accepted?, seconds until the answer)."""
    started = time.monotonic()
    stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=source)
    framed = FramedStream(stream)
    try:
        await framed.send_frame(Hello(PROTOCOL_VERSION, "client", username=user,
                                      password=password))
        frames = await framed.receive_frames()
    finally:
        await trio.aclose_forcefully(stream)
    answer = frames[0]
    assert type(answer) in (Hello, Error), answer
    return type(answer) is Hello, time.monotonic() - started


async def test_parallel_guesses_are_serialised_and_delayed(nursery, tmp_path):
    """Five parallel wrong guesses from one address take the sum of their delays
    (0.05 + 0.1 + 0.2 + 0.4 + 0.4), not the longest one: none skips the queue."""
    with trio.fail_after(20):
        node, port = await start(nursery, doc(tmp_path))
        results = []

        async def guess(i):
            results.append(await login(port, "victim", f"guess-{i}"))

        started = time.monotonic()
        async with trio.open_nursery() as burst:
            for i in range(5):
                burst.start_soon(guess, i)
        elapsed = time.monotonic() - started
        assert not any(ok for ok, _ in results)
        assert elapsed >= 0.9 * (0.05 + 0.1 + 0.2 + 0.4 + 0.4)
        assert node._auth.failures("src:127.0.0.1") == 5


async def test_lockout_after_n_failures_refuses_even_the_right_password(nursery, tmp_path):
    with trio.fail_after(20):
        node, port = await start(nursery, doc(tmp_path, lockout_failures=3))
        for i in range(3):
            assert not (await login(port, "victim", f"guess-{i}"))[0]
        # locked: the right password from the same address -- and from another
        # address, since the user's key is locked too -- is refused without a check
        assert not (await login(port, "victim", "victim-pw"))[0]
        assert not (await login(port, "victim", "victim-pw", source="127.0.0.2"))[0]
        # another user from another address is not locked out
        assert (await login(port, "ops", "ops-pw", source="127.0.0.2"))[0]


async def test_a_success_does_not_reset_the_source(nursery, tmp_path):
    """A guesser who owns an account logs in between guesses: its address's delay keeps
    growing (on main it went back to the first delay)."""
    with trio.fail_after(20):
        node, port = await start(nursery, doc(tmp_path))
        await login(port, "victim", "g1")
        await login(port, "victim", "g2")
        assert (await login(port, "mallory", "mallory-pw"))[0]
        ok, seconds = await login(port, "victim", "g3")
        assert not ok and seconds >= 0.2 * 0.9
        assert node._auth.failures("src:127.0.0.1") == 3


@pytest.mark.slow
async def test_guessing_burst_does_not_delay_another_users_login(nursery, tmp_path,
                                                                monkeypatch):
    """200 parallel guesses at one user (real scrypt cost, n=2**14) while another user
    logs in from another address: that login does not queue behind the burst's password
    checks (on main it did: seconds) -- its own check starts with at most one of the
    burst's starting in between, and the burst is still checking around the first.

    Judged on the order of the broker's own events (a login entering the gate, a
    password check starting), not on wall-clock times: on a loaded 2-core machine a
    login's time swings with the load, whatever the broker does (the times are printed)."""
    n = 2 ** 14
    events: list = []   # ("enter" | "check", user), in the order the broker did them
    login_, check = LoginGate.login, Authenticator.check

    async def recording_login(self, hello, identity, source):
        events.append(("enter", hello.username))
        return await login_(self, hello, identity, source)

    def recording_check(self, hello, peer=None):
        events.append(("check", hello.username))   # in the worker thread
        return check(self, hello, peer)

    monkeypatch.setattr(LoginGate, "login", recording_login)
    monkeypatch.setattr(Authenticator, "check", recording_check)
    with trio.fail_after(120):
        node, port = await start(nursery, doc(tmp_path, n=n))
        baseline = []
        for _ in range(3):
            ok, seconds = await login(port, "ops", "ops-pw", source="127.0.0.2")
            assert ok
            baseline.append(seconds)
        during = []
        async with trio.open_nursery() as burst:
            for i in range(200):
                burst.start_soon(login, port, "victim", f"guess-{i}")
            await trio.sleep(0.3)   # the burst is queued and checking
            for _ in range(3):
                ok, seconds = await login(port, "ops", "ops-pw", source="127.0.0.2")
                assert ok
                during.append(seconds)
        print(f"legit login: idle {[round(x, 3) for x in baseline]} s, during a "
              f"200-guess burst {[round(x, 3) for x in during]} s")
    ops = [i for i, e in enumerate(events) if e[1] == "ops"][6:]   # the 3 during the burst
    assert [events[i][0] for i in ops] == ["enter", "check"] * 3, events
    victim = [i for i, e in enumerate(events) if e == ("check", "victim")]
    # the burst was checking before the first and still after it (the login met it) ...
    assert victim[0] < ops[0] and victim[-1] > ops[1], events
    for enter, checked in zip(ops[::2], ops[1::2]):
        # ... and no legit check waited for the burst's checks in between
        between = [i for i in victim if enter < i < checked]
        assert len(between) <= 1, events


async def test_a_reload_swaps_the_users_and_keeps_the_lockout(nursery, tmp_path):
    """A reload (SIGHUP / `treefed reload`) installs the new users for the next login --
    the gate must not keep checking against the old authenticator -- and what the
    throttle counted before it still holds (a guesser cannot reset it by waiting for a
    config change)."""

    document = doc(tmp_path, lockout_failures=3)
    node, port = await start(nursery, document)
    with trio.fail_after(20):
        for _ in range(3):
            assert not (await login(port, "mallory", "wrong"))[0]
        assert not (await login(port, "mallory", "mallory-pw"))[0]   # locked out
        document["security"]["user"].append({"name": "newbie",
                                             "password_hash": pw_hash("newbie-pw")})
        node.set_security(parse_config(document).security)
        # from another address: the guesses also locked out 127.0.0.1
        assert (await login(port, "newbie", "newbie-pw", source="127.0.0.2"))[0]
        assert not (await login(port, "mallory", "mallory-pw",
                                source="127.0.0.3"))[0]              # still locked out
