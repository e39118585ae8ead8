"""TLS for listeners and connectors (trio's SSLStream over our TCP streams).

Theory of operation
-------------------
* ``server_context`` / ``client_context`` build ``ssl.SSLContext`` objects from config
  values (certificate, key, CA bundle, ``verify_peer``, minimum version — 1.2 unless
  raised).  A server with a CA bundle *requests* a client certificate and verifies any it
  gets; with ``verify_peer`` it *requires* one (mutual TLS, for broker links).  A client
  always verifies the server's chain, against ``ca`` or the system store, and checks the
  host name unless told not to.  Unreadable or mismatched files are a ``ConfigError``
  naming the key, raised when the context is built (start-up), never per connection.
* ``open_tls`` dials, then handshakes eagerly under ``handshake_timeout``: a failed
  handshake (wrong CA, expired or mis-named certificate, a plain-TCP server) is
  ``RemoteError(code="tls_failed")`` with OpenSSL's reason, which ``connect_with_retry``
  retries like any unreachable peer.
* ``serve_tls`` runs ``serve_tcp`` and handshakes each connection before the handler sees
  it, so a plain-TCP client on a TLS port — or one that never speaks — is dropped within
  the timeout with one ``tls.handshake_failed`` log line, and a handler only ever gets a
  stream whose peer passed verification.
* ``peer_identity(stream)`` is the verified client certificate's identity (subject CN and
  subjectAltNames, ``security.auth.PeerIdentity``) for authentication, or None.

Never: disables chain verification on the client side, or lets a handshake wait forever.
"""

from __future__ import annotations

import functools
import ssl
from typing import Any

import structlog
import trio

from treefed.errors import ConfigError, RemoteError
from treefed.security.auth import PeerIdentity, identity_from_cert
from treefed.transport.streams import (DEFAULT_CONNECT_TIMEOUT, Handler, dial_tcp,
                                       peer_address, serve_tcp)
from treefed.transport.uri import Endpoint

__all__ = ["server_context", "client_context", "default_client_context", "open_tls",
           "serve_tls", "peer_identity", "MIN_VERSIONS", "DEFAULT_HANDSHAKE_TIMEOUT"]

#: config spelling -> ssl.TLSVersion; older versions are not offered at all.
MIN_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}
DEFAULT_HANDSHAKE_TIMEOUT = 10.0


def _min_version(ctx: ssl.SSLContext, min_version: str, where: str) -> None:
    try:
        ctx.minimum_version = MIN_VERSIONS[min_version]
    except KeyError:
        raise ConfigError(f"{where}.min_version", f"must be one of "
                          f"{', '.join(MIN_VERSIONS)}, got {min_version!r}") from None


def _readable(path: str, key: str) -> None:
    # OpenSSL reports a missing key file as "PEM lib"; say which file, and why, ourselves.
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ConfigError(key, f"cannot read {path}: {exc.strerror or exc}") from None


def _load_chain(ctx: ssl.SSLContext, cert: str, key: str | None, where: str) -> None:
    _readable(cert, f"{where}.cert")
    if key:
        _readable(key, f"{where}.key")
    try:
        ctx.load_cert_chain(cert, key or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{where}.cert", f"cannot load certificate {cert} with key "
                          f"{key or cert}: {getattr(exc, 'reason', None) or exc}") from None


def _load_ca(ctx: ssl.SSLContext, ca: str, where: str) -> None:
    _readable(ca, f"{where}.ca")
    try:
        ctx.load_verify_locations(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{where}.ca", f"cannot load CA bundle {ca}: "
                          f"{getattr(exc, 'strerror', None) or exc}") from None


def server_context(cert: str, key: str | None = None, *, ca: str | None = None,
                   verify_peer: bool = False, min_version: str = "1.2",
                   where: str = "security.tls") -> ssl.SSLContext:
    """Context for a listener.  ``ca`` + ``verify_peer``: mutual TLS (a client without a
    certificate signed by ``ca`` is refused); ``ca`` alone: a certificate is optional but
    verified when offered.  ``where`` prefixes the config key named in errors."""
    if verify_peer and not ca:
        raise ConfigError(f"{where}.ca", "verify_peer needs a CA bundle to verify "
                                         "client certificates against")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    _min_version(ctx, min_version, where)
    _load_chain(ctx, cert, key, where)
    if ca:
        _load_ca(ctx, ca, where)
        ctx.verify_mode = ssl.CERT_REQUIRED if verify_peer else ssl.CERT_OPTIONAL
    else:
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def client_context(*, ca: str | None = None, cert: str | None = None,
                   key: str | None = None, check_hostname: bool = True,
                   min_version: str = "1.2", where: str = "security.tls") -> ssl.SSLContext:
    """Context for dialing.  The server's chain is always verified (against ``ca``, or
    the system store without one); ``cert``/``key`` is our certificate for mutual TLS."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    _min_version(ctx, min_version, where)
    if ca:
        _load_ca(ctx, ca, where)
    if cert:
        _load_chain(ctx, cert, key, where)
    ctx.check_hostname = check_hostname
    return ctx


@functools.lru_cache(maxsize=1)
def default_client_context() -> ssl.SSLContext:
    """System CAs, host-name check on: built once (loading the system store is slow)."""
    return client_context()


def _reason(exc: BaseException) -> str:
    """OpenSSL's words for a failed handshake ("certificate has expired", ...)."""
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, ssl.SSLCertVerificationError) and cause.verify_message:
        return cause.verify_message
    if isinstance(cause, ssl.SSLError):
        return (cause.reason or str(cause)).lower().replace("_", " ")
    if isinstance(cause, OSError):
        return cause.strerror or str(cause)
    return str(exc) or "connection closed during the handshake"


async def open_tls(endpoint: Endpoint, context: ssl.SSLContext, *,
                   server_hostname: str | None = None,
                   connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
                   handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT) -> trio.SSLStream:
    """Dial ``endpoint`` and complete the TLS handshake.  The host name checked against
    the certificate is ``server_hostname`` or the endpoint's host.  Raises
    RemoteError(code="unreachable") when the dial fails, RemoteError(code="tls_failed")
    when the handshake does."""
    tcp = await dial_tcp(endpoint, connect_timeout)
    stream = trio.SSLStream(tcp, context, server_hostname=server_hostname or endpoint.host)
    try:
        with trio.fail_after(handshake_timeout):
            await stream.do_handshake()
    except trio.TooSlowError:
        await trio.aclose_forcefully(stream)
        raise RemoteError(f"TLS handshake with {endpoint}: no answer within "
                          f"{handshake_timeout} s", code="tls_failed") from None
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        await trio.aclose_forcefully(stream)
        raise RemoteError(f"TLS handshake with {endpoint} failed: {_reason(exc)}",
                          code="tls_failed") from exc
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return stream


async def _handshake_then(handler: Handler, context: ssl.SSLContext, timeout: float,
                          log: Any, stream: trio.abc.Stream) -> None:
    tls = trio.SSLStream(stream, context, server_side=True)
    try:
        with trio.fail_after(timeout):
            await tls.do_handshake()
    except (trio.TooSlowError, trio.BrokenResourceError) as exc:
        reason = (f"no TLS handshake within {timeout} s" if isinstance(exc, trio.TooSlowError)
                  else _reason(exc))
        log.warning("tls.handshake_failed", peer=peer_address(stream), reason=reason)
        return  # serve_tcp closes the TCP stream
    try:
        await handler(tls)
    finally:
        await trio.aclose_forcefully(tls)


async def serve_tls(handler: Handler, host: str, port: int, context: ssl.SSLContext, *,
                    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT, log: Any = None,
                    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """Like ``serve_tcp``, but each connection is TLS and handshaken before
    ``handler(ssl_stream)`` runs; failed handshakes are logged on ``log`` (a structlog
    logger; the node passes one bound to its broker) and dropped."""
    wrapped = functools.partial(_handshake_then, handler, context, handshake_timeout,
                                log if log is not None else structlog.get_logger())
    await serve_tcp(wrapped, host, port, task_status=task_status)


def peer_identity(stream: trio.abc.Stream) -> PeerIdentity | None:
    """The verified client certificate's identity, or None (plain TCP, no certificate,
    or an unverified one)."""
    if not isinstance(stream, trio.SSLStream):
        return None
    try:
        return identity_from_cert(stream.getpeercert())
    except (ValueError, AttributeError):  # handshake not done / no SSL object
        return None
