"""A small HTTP/1.1 server loop: h11 (sans-IO) driven by trio, one task per connection.

Theory of operation
-------------------
h11 owns the protocol: it parses requests out of the bytes we feed it and turns our
``Response`` into bytes.  This module only moves bytes between a trio stream and an
``h11.Connection`` and calls ``handle(request) -> Response`` once per request, so the
monitor runs in the broker's own trio loop (no second event loop, no thread) and a
handler reads the broker's state between two of the site task's batches.

Invariants: request bodies are read and discarded (every endpoint is a GET) up to
``MAX_BODY`` bytes; a peer that sends garbage gets a 400 (when h11 still lets us answer)
and only its connection is closed; a connection idle for ``IDLE_TIMEOUT`` between
requests is closed; keep-alive follows h11 (``start_next_cycle``).  Nothing here knows
what the endpoints are.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import h11
import trio

__all__ = ["Request", "Response", "serve_http", "MAX_BODY", "IDLE_TIMEOUT"]

#: Bytes of request body read (and thrown away) before the connection is dropped.
MAX_BODY = 64 * 1024
#: Seconds a keep-alive connection may sit between requests (and a request may take).
IDLE_TIMEOUT = 30.0
_CHUNK = 65536


@dataclass(slots=True)
class Request:
    """One parsed request."""

    method: str                 # "GET", "HEAD", ...
    path: str                   # "/metrics" (no query)
    query: dict[str, str]       # first value of each query parameter
    headers: dict[str, str]     # lower-case names
    remote: str = ""            # "host:port" of the client, for logs


@dataclass(slots=True)
class Response:
    """What a handler returns; ``serve_http`` adds Content-Length and Date."""

    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)


Handler = Callable[[Request], Awaitable[Response]]


async def _next_event(conn: h11.Connection, stream: trio.abc.Stream) -> object:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        data = await stream.receive_some(_CHUNK)
        conn.receive_data(data)   # b"" tells h11 the peer closed


async def _send(conn: h11.Connection, stream: trio.abc.Stream, response: Response,
                head_only: bool = False) -> None:
    headers = [("content-type", response.content_type),
               ("content-length", str(len(response.body))),
               *response.headers]
    data = conn.send(h11.Response(status_code=response.status, headers=headers))
    if response.body and not head_only:
        data += conn.send(h11.Data(data=response.body))
    data += conn.send(h11.EndOfMessage())
    await stream.send_all(data)


def _request(event: h11.Request, remote: str) -> Request:
    target = event.target.decode("latin-1")
    parts = urlsplit(target)
    query = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
    return Request(event.method.decode("ascii", "replace"), parts.path or "/", query,
                   headers, remote)


async def serve_http(stream: trio.abc.Stream, handle: Handler, *, remote: str = "",
                     idle_timeout: float = IDLE_TIMEOUT) -> None:
    """Serve HTTP/1.1 requests on ``stream`` until the peer closes or misbehaves."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_BODY)
    try:
        while True:
            with trio.move_on_after(idle_timeout) as idle:
                event = await _next_event(conn, stream)
                if type(event) is h11.Request:
                    body = 0
                    while True:
                        more = await _next_event(conn, stream)
                        if type(more) is h11.EndOfMessage:
                            break
                        if type(more) is h11.Data:
                            body += len(more.data)
                            if body > MAX_BODY:
                                await _send(conn, stream, Response(413, b"body too large\n"))
                                return
                        elif type(more) is h11.ConnectionClosed:
                            return
            if idle.cancelled_caught or type(event) is not h11.Request:
                return   # idle, or ConnectionClosed
            request = _request(event, remote)
            response = await handle(request)
            await _send(conn, stream, response, head_only=request.method == "HEAD")
            if conn.our_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()
    except h11.RemoteProtocolError as exc:
        if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            try:
                await _send(conn, stream, Response(exc.error_status_hint,
                                                   f"bad request: {exc}\n".encode()))
            except (h11.LocalProtocolError, trio.BrokenResourceError,
                    trio.ClosedResourceError):
                pass
    except h11.LocalProtocolError:
        return   # e.g. the peer closed mid-request while we answered
