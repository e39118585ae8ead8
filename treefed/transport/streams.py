"""Byte streams for broker links and client connections (trio).

Theory of operation
-------------------
The thin edge between treefed and the operating system's sockets:

* ``open_tcp`` dials one ``Endpoint`` (TCP_NODELAY on: frames are small and latency
  matters more than packet count, and writers already batch into one ``send_all``); an
  ``ssl://`` endpoint is handed to ``tls.open_tls`` and comes back handshaken.
* ``serve_tcp`` listens and runs ``handler(stream)`` per connection; the stream is always
  closed afterwards, and a peer that vanishes or misbehaves ends only its own connection.
* ``connect_with_retry`` walks a ``Failover``/``Static`` list pass by pass, sleeping the
  ``Backoff`` delay before each pass, and gives up with ``RemoteError("unreachable")``.
* ``memory_stream_pair`` (``memory.py``'s pipes) links two in-process brokers with no
  sockets at all; the memory scenario engine uses it.

OSError is translated here, once: a failed dial is ``RemoteError(code="unreachable")``,
a failed TLS handshake ``RemoteError(code="tls_failed")``, a failed bind
``LocalError(code="listen_failed")``.  Errors of our own making (``LocalError``, e.g. an
unknown scheme) are never retried.
"""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import trio

from treefed.errors import LocalError, RemoteError
from treefed.transport.backoff import Backoff
from treefed.transport.uri import Endpoint, Target

if TYPE_CHECKING:
    import random

__all__ = ["open_tcp", "dial_tcp", "serve_tcp", "connect_with_retry", "memory_stream_pair",
           "peer_address", "DEFAULT_CONNECT_TIMEOUT"]


def memory_stream_pair() -> tuple[trio.abc.Stream, trio.abc.Stream]:
    """Two connected in-process byte streams, for brokers in one process
    (``transport/memory.py``: trio.testing's semantics without its layers, and a
    synchronous write for ``FramedStream.send_now``)."""
    from treefed.transport.memory import pipe_pair

    return pipe_pair()


DEFAULT_CONNECT_TIMEOUT = 10.0

Handler = Callable[[trio.abc.Stream], Awaitable[Any]]
OnAttempt = Callable[[Endpoint, int, "RemoteError | None"], Any]


async def open_tcp(endpoint: Endpoint, *,
                   connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
                   ssl_context: ssl.SSLContext | None = None,
                   server_hostname: str | None = None) -> trio.abc.Stream:
    """Connect to ``endpoint``: plain TCP for ``tcp://``, TLS for ``ssl://`` (with
    ``ssl_context``, default: system CAs and host-name check; see ``tls.open_tls``).
    Raises RemoteError(code="unreachable" | "tls_failed") on failure or timeout."""
    if endpoint.scheme == "ssl":
        from treefed.transport.tls import default_client_context, open_tls  # imports us

        return await open_tls(endpoint, ssl_context or default_client_context(),
                              server_hostname=server_hostname,
                              connect_timeout=connect_timeout)
    if endpoint.scheme != "tcp":
        raise LocalError(f"{endpoint}: {endpoint.scheme}:// is not supported",
                         code="unsupported")
    return await dial_tcp(endpoint, connect_timeout)


def _os_reason(exc: OSError) -> str:
    """Why a connect failed, in the system's words ("Connection refused"), not trio's
    summary "all attempts to connect to h:p failed" (which repeats the address)."""
    errors = [e for e in getattr(exc.__cause__, "exceptions", ()) if isinstance(e, OSError)]
    reasons = [os.strerror(e.errno) if e.errno else e.strerror
               for e in [exc, *errors] if e.errno or e.strerror]
    return ", ".join(dict.fromkeys(reasons)) if reasons else str(exc)


async def dial_tcp(endpoint: Endpoint,
                   connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
                   ) -> trio.SocketStream:
    """The TCP connection under either scheme, TCP_NODELAY on."""
    try:
        with trio.move_on_after(connect_timeout if connect_timeout is not None
                                else float("inf")) as scope:
            stream = await trio.open_tcp_stream(endpoint.host, endpoint.port)
    except OSError as exc:
        raise RemoteError(f"cannot connect to {endpoint}: {_os_reason(exc)}",
                          code="unreachable") from exc
    if scope.cancelled_caught:
        raise RemoteError(f"cannot connect to {endpoint}: timed out after "
                          f"{connect_timeout} s", code="unreachable")
    stream.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, True)
    return stream


def peer_address(stream: trio.abc.Stream) -> str:
    """``host:port`` of the far end of a socket stream (through TLS), for log lines and
    failure bookkeeping; "" for in-memory streams."""
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    sock = getattr(stream, "socket", None)
    try:
        host, port = sock.getpeername()[:2]
    except (AttributeError, OSError, TypeError, ValueError):
        return ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _run_handler(handler: Handler, stream: trio.abc.Stream) -> None:
    try:
        await handler(stream)
    except (trio.BrokenResourceError, trio.ClosedResourceError, RemoteError):
        # The peer vanished or sent garbage: that ends this connection only. The handler
        # logs what it wants to before letting these out; anything else is our bug and
        # propagates to the nursery.
        pass
    finally:
        await trio.aclose_forcefully(stream)


async def serve_tcp(handler: Handler, host: str, port: int, *,
                    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Listen on ``host:port`` (port 0: any free port) and run ``handler(stream)`` for
    every connection until cancelled. ``task_status.started`` gets the bound port."""
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as exc:
        raise LocalError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                         code="listen_failed") from exc
    if port == 0 and len(listeners) > 1:
        # Each address family would get its own random port; keep one so the port we
        # report is the port that every listener uses.
        for extra in listeners[1:]:
            await extra.aclose()
        listeners = listeners[:1]
    bound = listeners[0].socket.getsockname()[1]
    task_status.started(bound)
    await trio.serve_listeners(functools.partial(_run_handler, handler), listeners)


async def connect_with_retry(
    target: Target,
    backoff: Backoff,
    rng: random.Random,
    *,
    on_attempt: OnAttempt | None = None,
    connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
    open_stream: Callable[..., Awaitable[trio.abc.Stream]] = open_tcp,
    ssl_context: ssl.SSLContext | None = None,
) -> tuple[trio.abc.Stream, Endpoint]:
    """Connect to the first endpoint of ``target`` that answers.

    Each pass tries every endpoint once (shuffled per pass when ``target.randomize``),
    after sleeping ``backoff.next_delay(rng)``; when that returns None the link gives up
    with RemoteError(code="unreachable") naming the last failure.  ``on_attempt(endpoint,
    attempt, error)`` is called after every try (error None on success) so the caller can
    log it.  On success ``backoff.connected(trio.current_time())`` is called; the caller
    calls ``backoff.disconnected(trio.current_time())`` when the stream dies.

    For a ``Static`` target the node normally runs one link per endpoint, as ActiveMQ does;
    given the whole list, this walks it like a failover list.  ``ssl_context`` is passed
    on to ``open_stream`` for ``ssl://`` endpoints.
    """
    endpoints = list(target.endpoints)
    randomize = getattr(target, "randomize", False)
    last_error: RemoteError | None = None
    tries = 0
    while True:
        delay = backoff.next_delay(rng)
        if delay is None:
            raise RemoteError(f"{target}: unreachable after {tries} attempts"
                              f"{f'; last error: {last_error}' if last_error else ''}",
                              code="unreachable") from last_error
        if delay > 0:
            await trio.sleep(delay)
        if randomize:
            rng.shuffle(endpoints)
        for endpoint in endpoints:
            tries += 1
            try:
                if ssl_context is not None and endpoint.scheme == "ssl":
                    stream = await open_stream(endpoint, connect_timeout=connect_timeout,
                                               ssl_context=ssl_context)
                else:
                    stream = await open_stream(endpoint, connect_timeout=connect_timeout)
            except RemoteError as exc:
                last_error = exc
                if on_attempt is not None:
                    on_attempt(endpoint, tries, exc)
                continue
            if on_attempt is not None:
                try:
                    on_attempt(endpoint, tries, None)
                except BaseException:
                    await trio.aclose_forcefully(stream)
                    raise
            backoff.connected(trio.current_time())
            return stream, endpoint
