"""Issue #12, "Also": what a client is told must be clear.

* a peer that is not a treefed broker (an HTTP server, a silent port) gets a clear error
  within the hello timeout; ``treefed stat failover:(...)`` to nobody gives up;
* a connection error names each address once; usage errors exit 2."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import trio

from treefed.client import ConnectionClosed, connect
from treefed.errors import RemoteError

from tests.node.helpers import REPO_ROOT, child_env


def run_cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "treefed.cli", *args],
                          capture_output=True, text=True, timeout=timeout, env=child_env(),
                          cwd=str(REPO_ROOT))


async def _http_server(stream: trio.SocketStream) -> None:
    try:
        await stream.receive_some(1024)
        await stream.send_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    except trio.BrokenResourceError:
        pass
    finally:
        await stream.aclose()


async def _silent_server(stream: trio.SocketStream) -> None:
    await trio.sleep_forever()


async def _listen(nursery: trio.Nursery, handler) -> int:
    listeners = await nursery.start(trio.serve_tcp, handler, 0)
    return listeners[0].socket.getsockname()[1]


class TestNotATreefedBroker:
    async def test_http_server_is_named_as_not_a_broker(self, nursery):
        """Connecting to an HTTP server fails at once with not_a_broker, saying so."""
        port = await _listen(nursery, _http_server)
        with trio.fail_after(5):
            with pytest.raises(RemoteError) as info:
                async with connect(f"tcp://127.0.0.1:{port}"):
                    pass
        assert info.value.code == "not_a_broker"
        assert f"tcp://127.0.0.1:{port} is not a treefed broker" in info.value.message

    async def test_silent_port_fails_within_the_hello_timeout(self, nursery):
        """A port that accepts and never speaks: hello_timeout, within that timeout,
        with a reason (not an empty one)."""
        port = await _listen(nursery, _silent_server)
        start = trio.current_time()
        with trio.fail_after(5):
            with pytest.raises(RemoteError) as info:
                async with connect(f"tcp://127.0.0.1:{port}", hello_timeout=0.5):
                    pass
        assert 0.5 <= trio.current_time() - start < 3
        assert info.value.code == "hello_timeout" and "no hello within 0.5 s" in str(
            info.value)

    async def test_failover_to_nobody_gives_up_after_connect_timeout(self):
        """failover:(...) to a closed port retries, but connect_timeout ends it with
        the last attempt's reason."""
        with trio.fail_after(10):
            with pytest.raises(ConnectionClosed) as info:
                async with connect("failover:(tcp://127.0.0.1:1)", connect_timeout=0.5):
                    pass
        text = info.value.message
        assert text.startswith("cannot connect to failover:(tcp://127.0.0.1:1) within 0.5 s")
        assert "last attempt: tcp://127.0.0.1:1: Connection refused" in text


class TestCommandLine:
    def test_stat_failover_to_nobody_does_not_hang(self):
        """`treefed stat 'failover:(tcp://127.0.0.1:61699)'` exits 1 within its
        --connect-timeout instead of retrying for ever."""
        start = time.monotonic()
        done = run_cli("stat", "failover:(tcp://127.0.0.1:61699)", "--connect-timeout", "1",
                       timeout=30)
        assert done.returncode == 1 and time.monotonic() - start < 20
        assert "within 1 s" in done.stderr and "Connection refused" in done.stderr

    def test_connection_error_names_the_address_once(self):
        """A refused connection's message says "cannot connect to <uri>" once, with
        the system's reason, not trio's "all attempts ... failed" summary."""
        done = run_cli("stat", "tcp://127.0.0.1:1")
        assert done.returncode == 1
        assert done.stderr.count("127.0.0.1:1") == 1, done.stderr
        assert "Connection refused" in done.stderr

    @pytest.mark.parametrize("args", [
        ("send", "tcp://127.0.0.1:1", "queue://q", "x", "--header", "novalue"),
        ("send", "tcp://127.0.0.1:1", "queue://q", "x", "--priority", "12"),
        ("send", "tcp://127.0.0.1:1", "queue://q", "x", "--ttl", "-1"),
        ("send", "tcp://127.0.0.1:1", "queue://q", "x", "--count", "-1"),
        ("consume", "tcp://127.0.0.1:1", "queue://q", "--count", "-3"),
        ("stat", "bogus://127.0.0.1:1"),
        ("stat", "tcp://127.0.0.1:1", "--connect-timeout", "0"),
        ("stat",),
    ], ids=["header", "priority", "ttl", "count", "consume_count", "uri_scheme",
            "connect_timeout", "missing_uri"])
    def test_usage_errors_exit_2(self, args):
        """A command line that cannot work exits 2 with a one-line reason, before any
        connection is attempted."""
        done = run_cli(*args)
        assert done.returncode == 2, (done.returncode, done.stderr)
        assert done.stderr.strip() and "Traceback" not in done.stderr
