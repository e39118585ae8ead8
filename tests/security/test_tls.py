"""Tests for treefed.transport.tls: contexts, dialing, serving, peer identity (real sockets)."""

from __future__ import annotations

import functools
import random
import ssl

import pytest
import structlog
import trio
from structlog.testing import capture_logs

from treefed.errors import ConfigError, RemoteError
from treefed.transport.backoff import Backoff
from treefed.transport.streams import connect_with_retry, open_tcp, serve_tcp
from treefed.transport.tls import (client_context, open_tls, peer_identity, serve_tls,
                                   server_context)
from treefed.transport.uri import Endpoint, parse_uri

LOCAL = "127.0.0.1"


async def echo(stream: trio.abc.Stream) -> None:
    async for data in stream:
        await stream.send_all(data)


def server_ctx(pki, **kw) -> ssl.SSLContext:
    cert, key = pki.leaf("127.0.0.1", "localhost", common_name="hq")
    return server_context(cert, key, **kw)


async def start(nursery, handler, ctx, **kw) -> Endpoint:
    port = await nursery.start(functools.partial(serve_tls, handler, LOCAL, 0, ctx, **kw))
    return Endpoint("ssl", LOCAL, port)


async def closed_or_broken(stream: trio.abc.Stream) -> bool:
    """True once the peer has ended the connection (EOF or a TLS alert)."""
    try:
        while await stream.receive_some(1024):
            pass
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    return True


class TestContexts:
    def test_server_defaults_to_tls_1_2_minimum_without_client_certs(self, pki):
        """A server context refuses anything below TLS 1.2 and asks no client cert."""
        ctx = server_ctx(pki)
        assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
        assert ctx.verify_mode == ssl.CERT_NONE

    def test_ca_makes_client_certs_optional_verify_peer_required(self, pki):
        """A CA bundle requests a client certificate; verify_peer requires one."""
        assert server_ctx(pki, ca=pki.ca_path).verify_mode == ssl.CERT_OPTIONAL
        assert server_ctx(pki, ca=pki.ca_path, verify_peer=True).verify_mode == \
            ssl.CERT_REQUIRED

    def test_verify_peer_without_ca_names_the_key(self, pki):
        """verify_peer with no CA bundle is a ConfigError naming security.tls.ca."""
        with pytest.raises(ConfigError) as info:
            server_ctx(pki, verify_peer=True)
        assert info.value.key == "security.tls.ca"

    def test_missing_files_name_their_key(self, pki, tmp_path):
        """An unreadable certificate, key or CA file names the key at fault."""
        cert, key = pki.leaf()
        with pytest.raises(ConfigError) as info:
            server_context(str(tmp_path / "nope.pem"), key)
        assert info.value.key == "security.tls.cert" and "nope.pem" in info.value.problem
        with pytest.raises(ConfigError) as info:
            server_context(cert, str(tmp_path / "nope.key"))
        assert info.value.key == "security.tls.key"
        with pytest.raises(ConfigError) as info:
            client_context(ca=str(tmp_path / "nope-ca.pem"), where="network_connector[0]")
        assert info.value.key == "network_connector[0].ca"

    def test_key_not_matching_certificate_is_refused(self, pki):
        """A key that does not belong to the certificate is refused at start-up."""
        cert, _ = pki.leaf()
        _, other_key = pki.leaf()
        with pytest.raises(ConfigError) as info:
            server_context(cert, other_key)
        assert info.value.key == "security.tls.cert"

    def test_bad_min_version(self, pki):
        """min_version accepts only 1.2 and 1.3."""
        with pytest.raises(ConfigError) as info:
            client_context(min_version="1.0")
        assert info.value.key == "security.tls.min_version"
        assert client_context(min_version="1.3").minimum_version == ssl.TLSVersion.TLSv1_3

    def test_client_verifies_chain_and_hostname_by_default(self, pki):
        """A client context always verifies the chain, and the host name unless told not."""
        ctx = client_context(ca=pki.ca_path)
        assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
        ctx = client_context(ca=pki.ca_path, check_hostname=False)
        assert ctx.verify_mode == ssl.CERT_REQUIRED and not ctx.check_hostname


class TestOpenTls:
    async def test_valid_certificate_carries_data(self, nursery, pki):
        """A certificate from the trusted CA for the dialed IP: handshake and echo work."""
        with trio.fail_after(5):
            endpoint = await start(nursery, echo, server_ctx(pki))
            stream = await open_tls(endpoint, client_context(ca=pki.ca_path))
            assert stream.version() in ("TLSv1.2", "TLSv1.3")
            await stream.send_all(b"hello")
            assert await stream.receive_some(10) == b"hello"
            await stream.aclose()

    async def test_ssl_uri_through_open_tcp(self, nursery, pki):
        """open_tcp dials ssl:// URIs with the given context (config and clients use it)."""
        with trio.fail_after(5):
            endpoint = await start(nursery, echo, server_ctx(pki))
            target = parse_uri(f"ssl://localhost:{endpoint.port}")
            stream = await open_tcp(target, ssl_context=client_context(ca=pki.ca_path))
            assert isinstance(stream, trio.SSLStream)
            await stream.send_all(b"x")
            assert await stream.receive_some(10) == b"x"
            await stream.aclose()

    async def test_expired_certificate_is_refused(self, nursery, pki):
        """A server certificate past its notAfter fails the handshake: 'expired'."""
        cert, key = pki.leaf("127.0.0.1", expired=True)
        with trio.fail_after(5):
            endpoint = await start(nursery, echo, server_context(cert, key))
            with pytest.raises(RemoteError) as info:
                await open_tls(endpoint, client_context(ca=pki.ca_path))
        assert info.value.code == "tls_failed" and "expired" in info.value.message

    async def test_wrong_ca_is_refused(self, nursery, pki):
        """A certificate from a CA the client does not trust fails the handshake."""
        cert, key = pki.leaf("127.0.0.1", ca=pki.other_ca)
        with trio.fail_after(5):
            endpoint = await start(nursery, echo, server_context(cert, key))
            with pytest.raises(RemoteError) as info:
                await open_tls(endpoint, client_context(ca=pki.ca_path))
        assert info.value.code == "tls_failed"
        assert "unable to get local issuer certificate" in info.value.message

    async def test_system_store_does_not_trust_a_private_ca(self, nursery, pki):
        """Without a CA bundle the system store is used, so a private CA is refused."""
        with trio.fail_after(5):
            endpoint = await start(nursery, echo, server_ctx(pki))
            with pytest.raises(RemoteError) as info:
                await open_tcp(endpoint)
        assert info.value.code == "tls_failed"

    async def test_wrong_hostname_is_refused(self, nursery, pki):
        """A valid certificate for another name fails the host-name check."""
        cert, key = pki.leaf("broker.example")
        with trio.fail_after(5):
            endpoint = await start(nursery, echo, server_context(cert, key))
            with pytest.raises(RemoteError) as info:
                await open_tls(endpoint, client_context(ca=pki.ca_path))
            assert info.value.code == "tls_failed" and "mismatch" in info.value.message
            with pytest.raises(RemoteError) as info:
                await open_tls(endpoint, client_context(ca=pki.ca_path),
                               server_hostname="other.example")
            assert "mismatch" in info.value.message
            # the right name, given explicitly, passes
            stream = await open_tls(endpoint, client_context(ca=pki.ca_path),
                                    server_hostname="broker.example")
            await stream.aclose()

    async def test_plain_tcp_server_times_out_the_handshake(self, nursery, pki):
        """A server that never answers the ClientHello is tls_failed after the timeout."""
        async def silent(stream):
            await trio.sleep_forever()

        with trio.fail_after(5):
            port = await nursery.start(serve_tcp, silent, LOCAL, 0)
            with pytest.raises(RemoteError) as info:
                await open_tls(Endpoint("ssl", LOCAL, port), client_context(ca=pki.ca_path),
                               handshake_timeout=0.2)
        assert info.value.code == "tls_failed" and "no answer" in info.value.message

    async def test_minimum_version_is_enforced(self, nursery, pki):
        """A TLS 1.3-only server refuses a client capped at TLS 1.2."""
        with trio.fail_after(5):
            endpoint = await start(nursery, echo, server_ctx(pki, min_version="1.3"))
            ctx = client_context(ca=pki.ca_path)
            ctx.maximum_version = ssl.TLSVersion.TLSv1_2
            with pytest.raises(RemoteError) as info:
                await open_tls(endpoint, ctx)
        assert info.value.code == "tls_failed"

    async def test_connect_with_retry_passes_the_context(self, nursery, pki):
        """connect_with_retry dials ssl:// endpoints with its ssl_context."""
        with trio.fail_after(5):
            endpoint = await start(nursery, echo, server_ctx(pki))
            stream, used = await connect_with_retry(
                endpoint, Backoff(0.0, 0.0, max_attempts=1), random.Random(1),
                ssl_context=client_context(ca=pki.ca_path))
            assert used == endpoint and isinstance(stream, trio.SSLStream)
            await stream.aclose()


class TestServeTls:
    async def test_plain_tcp_client_is_dropped_with_a_log_line(self, nursery, pki):
        """A plain-TCP client on a TLS port is closed at once and one line says why."""
        handled = []

        async def handler(stream):
            handled.append(stream)

        with capture_logs() as logs, trio.fail_after(5):
            endpoint = await start(nursery, handler, server_ctx(pki),
                                   log=structlog.get_logger())
            plain = await open_tcp(Endpoint("tcp", LOCAL, endpoint.port))
            await plain.send_all(b"\x00\x00\x00\x05\x85\x01\x01fclient")  # a treefed hello
            assert await closed_or_broken(plain)
            await plain.aclose()
            while not logs:
                await trio.sleep(0.01)
        assert handled == []
        assert logs[0]["event"] == "tls.handshake_failed"
        assert logs[0]["log_level"] == "warning"
        assert logs[0]["peer"].startswith("127.0.0.1:") and logs[0]["reason"]

    async def test_silent_client_is_dropped_after_the_timeout(self, nursery, pki):
        """A client that never starts TLS is dropped after handshake_timeout."""
        with capture_logs() as logs, trio.fail_after(5):
            endpoint = await start(nursery, echo, server_ctx(pki), handshake_timeout=0.2,
                                   log=structlog.get_logger())
            plain = await open_tcp(Endpoint("tcp", LOCAL, endpoint.port))
            assert await closed_or_broken(plain)
            await plain.aclose()
            while not logs:
                await trio.sleep(0.01)
        assert "no TLS handshake within 0.2 s" in logs[0]["reason"]

    async def test_failures_do_not_stop_the_listener(self, nursery, pki):
        """After refused handshakes a good client is still served."""
        with capture_logs(), trio.fail_after(5):
            endpoint = await start(nursery, echo, server_ctx(pki))
            for _ in range(3):
                plain = await open_tcp(Endpoint("tcp", LOCAL, endpoint.port))
                await plain.send_all(b"GET / HTTP/1.0\r\n\r\n")
                assert await closed_or_broken(plain)
                await plain.aclose()
            good = await open_tls(endpoint, client_context(ca=pki.ca_path))
            await good.send_all(b"ok")
            assert await good.receive_some(10) == b"ok"
            await good.aclose()


class TestMutualTls:
    async def _refused(self, nursery, pki, client_cert) -> list:
        """Dial a verify_peer server with ``client_cert`` (or none); return the logs."""
        handled = []

        async def handler(stream):
            handled.append(stream)
            await echo(stream)

        with capture_logs() as logs, trio.fail_after(5):
            endpoint = await start(nursery, handler,
                                   server_ctx(pki, ca=pki.ca_path, verify_peer=True),
                                   log=structlog.get_logger())
            cert, key = client_cert or (None, None)
            ctx = client_context(ca=pki.ca_path, cert=cert, key=key)
            try:
                # TLS 1.3 finishes the client's side before the server judges its
                # certificate, so the refusal may arrive on the first read instead.
                stream = await open_tls(endpoint, ctx)
                await stream.send_all(b"x")
                assert await closed_or_broken(stream)
                await trio.aclose_forcefully(stream)
            except (RemoteError, trio.BrokenResourceError):
                pass
            while not logs:
                await trio.sleep(0.01)
        assert handled == []
        return logs

    async def test_client_without_certificate_is_refused(self, nursery, pki):
        """verify_peer: a client with no certificate never reaches the handler."""
        logs = await self._refused(nursery, pki, None)
        assert "certificate" in logs[0]["reason"]

    async def test_client_certificate_from_wrong_ca_is_refused(self, nursery, pki):
        """verify_peer: a client certificate from an untrusted CA is refused."""
        logs = await self._refused(nursery, pki, pki.leaf(common_name="x",
                                                          ca=pki.other_ca))
        assert logs[0]["event"] == "tls.handshake_failed"

    async def test_expired_client_certificate_is_refused(self, nursery, pki):
        """verify_peer: an expired client certificate is refused."""
        logs = await self._refused(nursery, pki, pki.leaf(common_name="x", expired=True))
        assert "expired" in logs[0]["reason"]

    async def test_peer_identity_from_client_certificate(self, nursery, pki):
        """The handler sees the verified client certificate's CN and subjectAltNames."""
        seen = []

        async def handler(stream):
            seen.append(peer_identity(stream))
            await stream.send_all(b"k")

        with trio.fail_after(5):
            endpoint = await start(nursery, handler,
                                   server_ctx(pki, ca=pki.ca_path, verify_peer=True))
            cert, key = pki.leaf("store-uk-0001.example", "ops@example.org",
                                 common_name="store-uk-0001")
            stream = await open_tls(endpoint, client_context(ca=pki.ca_path, cert=cert,
                                                             key=key))
            assert await stream.receive_some(1) == b"k"
            await stream.aclose()
        identity = seen[0]
        assert identity.common_name == "store-uk-0001"
        assert identity.dns_names == ("store-uk-0001.example",)
        assert identity.emails == ("ops@example.org",)

    async def test_optional_client_certificate(self, nursery, pki):
        """With a CA but no verify_peer, a client may come without a certificate
        (identity None) or with one (identity set)."""
        seen = []

        async def handler(stream):
            seen.append(peer_identity(stream))
            await stream.send_all(b"k")

        with trio.fail_after(5):
            endpoint = await start(nursery, handler, server_ctx(pki, ca=pki.ca_path))
            cert, key = pki.leaf(common_name="alice")
            for ctx in (client_context(ca=pki.ca_path),
                        client_context(ca=pki.ca_path, cert=cert, key=key)):
                stream = await open_tls(endpoint, ctx)
                assert await stream.receive_some(1) == b"k"
                await stream.aclose()
        assert seen[0] is None and seen[1].common_name == "alice"

    async def test_no_identity_on_plain_tcp(self, nursery):
        """peer_identity is None for a stream without TLS."""
        seen = []

        async def handler(stream):
            seen.append(peer_identity(stream))

        with trio.fail_after(5):
            port = await nursery.start(serve_tcp, handler, LOCAL, 0)
            stream = await open_tcp(Endpoint("tcp", LOCAL, port))
            assert await closed_or_broken(stream)
            await stream.aclose()
        assert seen == [None]
