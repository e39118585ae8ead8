"""treefed.transport: URIs, reconnect back-off, trio byte streams and framed streams.

``uri`` and ``backoff`` are pure; ``streams``, ``tls`` and ``framed`` are the trio edge.
"""

from treefed.transport.backoff import Backoff, backoff_for
from treefed.transport.framed import RECEIVE_SIZE, FramedStream
from treefed.transport.streams import (
    DEFAULT_CONNECT_TIMEOUT,
    connect_with_retry,
    dial_tcp,
    memory_stream_pair,
    open_tcp,
    peer_address,
    serve_tcp,
)
from treefed.transport.tls import (
    DEFAULT_HANDSHAKE_TIMEOUT,
    client_context,
    open_tls,
    peer_identity,
    serve_tls,
    server_context,
)
from treefed.transport.uri import Endpoint, Failover, Static, Target, parse_uri

__all__ = [
    "Backoff",
    "backoff_for",
    "FramedStream",
    "RECEIVE_SIZE",
    "DEFAULT_CONNECT_TIMEOUT",
    "connect_with_retry",
    "memory_stream_pair",
    "open_tcp",
    "serve_tcp",
    "dial_tcp",
    "peer_address",
    "DEFAULT_HANDSHAKE_TIMEOUT",
    "client_context",
    "server_context",
    "open_tls",
    "serve_tls",
    "peer_identity",
    "Endpoint",
    "Failover",
    "Static",
    "Target",
    "parse_uri",
]
