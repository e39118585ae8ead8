"""Tests for treefed.transport.streams (trio): dialing, serving, reconnecting."""

from __future__ import annotations

import random

import pytest
import trio

from treefed.errors import LocalError, RemoteError
from treefed.transport.backoff import Backoff
from treefed.transport.streams import (
    connect_with_retry,
    memory_stream_pair,
    open_tcp,
    serve_tcp,
)
from treefed.transport.uri import Endpoint, Failover, Static, parse_uri

LOCAL = "127.0.0.1"


async def echo(stream: trio.abc.Stream) -> None:
    async for data in stream:
        await stream.send_all(data)


async def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    sock = trio.socket.socket()
    await sock.bind((LOCAL, 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


class TestOpenTcp:
    async def test_connects_with_nodelay(self, nursery):
        """open_tcp reaches a listener and turns Nagle off."""
        with trio.fail_after(5):
            port = await nursery.start(serve_tcp, echo, LOCAL, 0)
            stream = await open_tcp(Endpoint("tcp", LOCAL, port))
            assert stream.getsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY)
            await stream.send_all(b"ping")
            assert await stream.receive_some(10) == b"ping"
            await stream.aclose()

    async def test_refused_is_unreachable(self):
        """A refused connection becomes RemoteError(code='unreachable') naming the URI."""
        port = await closed_port()
        with trio.fail_after(5), pytest.raises(RemoteError) as info:
            await open_tcp(Endpoint("tcp", LOCAL, port))
        assert info.value.code == "unreachable"
        assert f"tcp://127.0.0.1:{port}" in info.value.message
        assert isinstance(info.value.__cause__, OSError)

    async def test_timeout_is_unreachable(self, nursery):
        """A connect that outlasts connect_timeout is RemoteError(code='unreachable')."""
        port = await nursery.start(serve_tcp, echo, LOCAL, 0)
        with trio.fail_after(5), pytest.raises(RemoteError) as info:
            await open_tcp(Endpoint("tcp", LOCAL, port), connect_timeout=0)
        assert info.value.code == "unreachable" and "timed out" in info.value.message

    async def test_unknown_scheme_is_a_local_error(self):
        """A scheme open_tcp cannot dial is a LocalError, never a retryable error
        (ssl:// is dialed through tls.open_tls: tests/security/test_tls.py)."""
        with pytest.raises(LocalError) as info:
            await open_tcp(Endpoint("udp", LOCAL, 1))
        assert info.value.code == "unsupported"


class TestServeTcp:
    async def test_reports_port_and_serves_many_connections(self, nursery):
        """The bound port comes back through task_status; connections are independent."""
        with trio.fail_after(5):
            port = await nursery.start(serve_tcp, echo, LOCAL, 0)
            assert port > 0
            streams = [await open_tcp(Endpoint("tcp", LOCAL, port)) for _ in range(3)]
            for i, stream in enumerate(streams):
                await stream.send_all(b"n%d" % i)
            for i, stream in enumerate(streams):
                assert await stream.receive_some(10) == b"n%d" % i
                await stream.aclose()

    async def test_stream_closed_after_handler_returns(self, nursery):
        """When the handler returns, the connection is closed: the client sees EOF."""
        async def greet(stream):
            await stream.send_all(b"bye")

        with trio.fail_after(5):
            port = await nursery.start(serve_tcp, greet, LOCAL, 0)
            stream = await open_tcp(Endpoint("tcp", LOCAL, port))
            received = b""
            while chunk := await stream.receive_some(10):
                received += chunk
            assert received == b"bye"
            await stream.aclose()

    async def test_peer_fault_ends_only_that_connection(self, nursery):
        """A handler failing with RemoteError closes its connection; the server goes on."""
        async def picky(stream):
            data = await stream.receive_some(10)
            if data == b"bad":
                raise RemoteError("garbage", code="bad_frame")
            await stream.send_all(b"ok:" + data)

        with trio.fail_after(5):
            port = await nursery.start(serve_tcp, picky, LOCAL, 0)
            bad = await open_tcp(Endpoint("tcp", LOCAL, port))
            await bad.send_all(b"bad")
            assert await bad.receive_some(10) == b""
            good = await open_tcp(Endpoint("tcp", LOCAL, port))
            await good.send_all(b"fine")
            assert await good.receive_some(10) == b"ok:fine"
            await bad.aclose()
            await good.aclose()

    async def test_port_in_use_is_a_local_error(self, nursery):
        """Binding a port that is taken is LocalError(code='listen_failed')."""
        port = await nursery.start(serve_tcp, echo, LOCAL, 0)
        with trio.fail_after(5), pytest.raises(LocalError) as info:
            await serve_tcp(echo, LOCAL, port)
        assert info.value.code == "listen_failed"


class FakeDialer:
    """Refuses the first ``failures`` dials, then answers with an in-memory stream."""

    def __init__(self, failures: int, refuse: set[Endpoint] = frozenset()) -> None:
        self.failures = failures
        self.refuse = refuse
        self.calls: list[tuple[Endpoint, float]] = []

    async def __call__(self, endpoint: Endpoint, *, connect_timeout=None):
        self.calls.append((endpoint, trio.current_time()))
        await trio.lowlevel.checkpoint()
        if self.failures > 0 or endpoint in self.refuse:
            self.failures -= 1
            raise RemoteError(f"cannot connect to {endpoint}: refused", code="unreachable")
        return memory_stream_pair()[0]


A, B, C = (Endpoint("tcp", "10.0.0.%d" % i, 61616) for i in (1, 2, 3))


class TestConnectWithRetry:
    async def test_waits_the_backoff_between_passes(self, autojump_clock):
        """Failed passes are followed by the back-off delays, then the link connects."""
        dial = FakeDialer(failures=3)
        start = trio.current_time()
        stream, endpoint = await connect_with_retry(
            A, Backoff(1.0, 30.0), random.Random(1), open_stream=dial)
        assert endpoint == A
        assert [round(t - start, 6) for _, t in dial.calls] == [0.0, 1.0, 3.0, 7.0]

    async def test_failover_walks_the_list_in_order(self, autojump_clock):
        """Without randomize, each pass tries the endpoints left to right."""
        target = Failover((A, B, C), randomize=False)
        dial = FakeDialer(failures=0, refuse={A, B})
        attempts = []
        _, endpoint = await connect_with_retry(
            target, Backoff(0.01, 1.0), random.Random(1), open_stream=dial,
            on_attempt=lambda ep, n, err: attempts.append((ep, n, err and err.code)))
        assert endpoint == C
        assert attempts == [(A, 1, "unreachable"), (B, 2, "unreachable"), (C, 3, None)]

    async def test_randomize_shuffles_with_the_given_rng(self, autojump_clock):
        """With randomize, the order comes from the seeded rng, reproducibly."""
        async def first_order(seed):
            dial = FakeDialer(failures=3)
            await connect_with_retry(Failover((A, B, C)), Backoff(0.01, 1.0),
                                     random.Random(seed), open_stream=dial)
            return [ep for ep, _ in dial.calls[:3]]

        orders = {tuple(await first_order(seed)) for seed in range(12)}
        assert len(orders) > 1
        assert all(sorted(o, key=str) == [A, B, C] for o in orders)
        assert await first_order(5) == await first_order(5)

    async def test_gives_up_after_max_attempts(self, autojump_clock):
        """When the back-off runs out, RemoteError('unreachable') names the last failure."""
        target = Static((A, B))
        dial = FakeDialer(failures=100)
        with pytest.raises(RemoteError) as info:
            await connect_with_retry(target, Backoff(1.0, 30.0, max_attempts=2),
                                     random.Random(1), open_stream=dial)
        assert info.value.code == "unreachable"
        assert "after 6 attempts" in info.value.message
        assert "refused" in info.value.message
        assert len(dial.calls) == 6

    async def test_local_errors_are_not_retried(self, autojump_clock):
        """Our own misuse (e.g. ssl not built) propagates at once."""
        calls = []

        async def dial(endpoint, **kw):
            calls.append(endpoint)
            raise LocalError("nope", code="unsupported")

        with pytest.raises(LocalError):
            await connect_with_retry(A, Backoff(1.0, 30.0), random.Random(1),
                                     open_stream=dial)
        assert calls == [A]

    async def test_success_marks_the_backoff_connected(self, autojump_clock):
        """After connecting, the back-off counts a fresh round on the next loss."""
        backoff = Backoff(1.0, 30.0, max_attempts=1)
        await connect_with_retry(A, backoff, random.Random(1), open_stream=FakeDialer(1))
        assert backoff.attempts == 0
        backoff.disconnected(trio.current_time() + 10)
        assert backoff.next_delay(random.Random(1)) == 1.0

    async def test_failover_over_real_sockets(self, nursery):
        """A failover URI skips a dead endpoint and connects to the live one."""
        with trio.fail_after(5):
            port = await nursery.start(serve_tcp, echo, LOCAL, 0)
            dead = await closed_port()
            target = parse_uri(f"failover:(tcp://{LOCAL}:{dead},tcp://{LOCAL}:{port})"
                               "?randomize=false")
            stream, endpoint = await connect_with_retry(target, Backoff(0.01, 0.1),
                                                        random.Random(1))
            assert endpoint.port == port
            await stream.send_all(b"hi")
            assert await stream.receive_some(10) == b"hi"
            await stream.aclose()
