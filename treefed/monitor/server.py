"""Monitor: the broker's HTTP endpoints, served in the broker's own trio loop.

Theory of operation
-------------------
``BrokerNode.serve`` starts one ``Monitor`` when ``[monitor] listen`` is set.  It listens
(plain TCP, or TLS with the ``[security.tls]`` certificate for ``https://``), runs
``http.serve_http`` per connection and routes each GET to a view:

=============  ==============================================================
/metrics       Prometheus text format (``metrics.py``)
/varz          identity, version, uptime, memory, limits
/connz         connections, ``?offset=&limit=&kind=``
/linkz         broker links: peer, lane, state, last error, RTT, demand counts
/demandz       demand entries with origin and broker path, ``?dst=&offset=&limit=``
/healthz       200 when ready (listeners up, parent link operational), else 503
=============  ==============================================================

With ``basic_auth`` every endpoint but /healthz (a readiness probe carries no
credentials) wants HTTP basic credentials of a ``[[security.user]]`` holding ``admin`` on
``>`` — the same right ``treefed stat`` needs.  The scrypt check runs in a worker thread;
a successful check is remembered (keyed by a salted digest, never the password) so a
scrape every few seconds does not cost 0.1 s of CPU each time.

A background task sleeps ``LAG_INTERVAL`` over and over and records how late it woke:
that is the event-loop lag a busy site task causes, exported as a histogram.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import hashlib
import json
import os
import time
from typing import Any

import trio

from treefed.errors import TreefedError
from treefed.monitor import views
from treefed.monitor.http import Request, Response, serve_http
from treefed.monitor.metrics import CONTENT_TYPE, node_registry, render
from treefed.transport.streams import peer_address, serve_tcp
from treefed.transport.tls import serve_tls
from treefed.transport.uri import parse_uri
from treefed.wire.frames import PROTOCOL_VERSION, Hello

__all__ = ["Monitor", "parse_listen", "LAG_INTERVAL", "ENDPOINTS"]

#: Seconds between two event-loop lag probes.
LAG_INTERVAL = 0.5
#: Remembered good credentials (a handful of scrapers and operators).
_AUTH_CACHE = 64
ENDPOINTS = ("/metrics", "/varz", "/connz", "/linkz", "/demandz", "/healthz")


def parse_listen(text: str) -> tuple[str, str, int]:
    """``[monitor] listen`` -> (scheme "http"|"https", host, port)."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "http", text
    ep = parse_uri(f"tcp://{rest}", key="monitor.listen", listen=True)
    return scheme.lower(), ep.host, ep.port


def _json(status: int, body: Any) -> Response:
    return Response(status, json.dumps(body, indent=1, default=str).encode() + b"\n",
                    "application/json")


class Monitor:
    """One broker's HTTP monitoring server (see module doc)."""

    def __init__(self, node: Any) -> None:
        self.node = node
        section = node.config.monitor
        self.scheme, self.host, self.port = parse_listen(section.listen)
        self.registry, self.lag = node_registry(node)
        self.address: tuple[str, int] | None = None
        self.requests = 0
        sec = node.config.security
        self._ssl = sec.tls.server_context() if self.scheme == "https" else None
        self._auth = self._authz = None
        if section.basic_auth:
            forced = dataclasses.replace(sec, authentication=True)
            self._auth = forced.authenticator()
            self._authz = forced.authorizer()
        self._salt = os.urandom(16)
        self._good: dict[bytes, str] = {}

    @property
    def uri(self) -> str | None:
        if self.address is None:
            return None
        host, port = self.address
        host = f"[{host}]" if ":" in host else host
        return f"{self.scheme}://{host}:{port}"

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        log = self.node.log
        async with trio.open_nursery() as nursery:
            if self._ssl is not None:
                serve = functools.partial(serve_tls, self._connection, self.host, self.port,
                                          self._ssl, log=log)
            else:
                serve = functools.partial(serve_tcp, self._connection, self.host, self.port)
            port = await nursery.start(serve)
            self.address = (self.host, port)
            nursery.start_soon(self._probe_lag)
            log.info("monitor.listening", uri=self.uri, basic_auth=self._auth is not None)
            task_status.started(self.address)

    async def _probe_lag(self) -> None:
        observe = self.lag.observe
        while True:
            began = trio.current_time()
            await trio.sleep(LAG_INTERVAL)
            observe(max(0.0, trio.current_time() - began - LAG_INTERVAL))

    async def _connection(self, stream: trio.abc.Stream) -> None:
        await serve_http(stream, self.handle, remote=peer_address(stream))

    # ------------------------------------------------------------------ requests
    async def handle(self, request: Request) -> Response:
        """Route one request (also callable directly, without a socket)."""
        self.requests += 1
        if request.method not in ("GET", "HEAD"):
            return Response(405, b"only GET and HEAD\n", headers=[("allow", "GET, HEAD")])
        path = request.path.rstrip("/") or "/"
        if path == "/healthz":
            ok, body = views.healthz(self.node)
            return _json(200 if ok else 503, body)
        if self._auth is not None:
            refused = await self._check_auth(request)
            if refused is not None:
                return refused
        node = self.node
        try:
            if path == "/metrics":
                return Response(200, render(self.registry), CONTENT_TYPE)
            if path == "/varz":
                return _json(200, views.varz(node, self))
            if path == "/connz":
                return _json(200, views.connz(node, request.query))
            if path == "/linkz":
                return _json(200, views.linkz(node))
            if path == "/demandz":
                return _json(200, views.demandz(node, request.query))
            if path == "/":
                return _json(200, {"broker": node.broker_id, "endpoints": list(ENDPOINTS)})
        except (ValueError, TreefedError) as exc:
            message = exc.message if isinstance(exc, TreefedError) else str(exc)
            return _json(400, {"error": message})
        return _json(404, {"error": f"no such endpoint {path}",
                           "endpoints": list(ENDPOINTS)})

    async def _check_auth(self, request: Request) -> Response | None:
        """None when the request carries an admin's credentials, else a 401/403."""
        challenge = [("www-authenticate", 'Basic realm="treefed", charset="UTF-8"')]
        header = request.headers.get("authorization", "")
        kind, _, encoded = header.partition(" ")
        if kind.lower() != "basic" or not encoded:
            return Response(401, b"credentials required\n", headers=challenge)
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True) \
                .decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return Response(401, b"malformed basic credentials\n", headers=challenge)
        if not sep:
            return Response(401, b"malformed basic credentials\n", headers=challenge)
        digest = hashlib.sha256(self._salt + header.encode()).digest()
        name = self._good.get(digest)
        if name is None:
            hello = Hello(PROTOCOL_VERSION, "client", username=user, password=password)
            result = await trio.to_thread.run_sync(self._auth.check, hello)
            result = self._auth.settle(result, time.time(),
                                       request.remote.rpartition(":")[0])
            if not result.ok:
                self.node.log.warning("monitor.auth_failed", remote=request.remote,
                                      **result.log_fields())
                await trio.sleep(result.delay)
                return Response(401, b"bad credentials\n", headers=challenge)
            name = result.user
            if len(self._good) >= _AUTH_CACHE:
                self._good.clear()
            self._good[digest] = name
        if self._authz is None or not self._authz.is_admin(name):
            return Response(403, f"user {name} lacks admin on >\n".encode())
        return None

