"""STOMP connections that misbehave or must be refused: malformed input, frames before
CONNECT, bad selectors, silent clients (heart-beats), wrong passwords, missing
permissions, TLS with a client certificate, and slow consumers — each answered with
ERROR and a close of that connection only."""

from __future__ import annotations

import functools
import ssl

import pytest
import trio

from treefed.client import connect
from treefed.security.passwords import hash_password
from treefed.stomp.codec import StompFrame, encode

from tests.stomp.helpers import Client, RawStomp, start_stomp_node, stomp, stomp_doc, \
    wait_for


@functools.cache
def pw_hash(password: str) -> str:
    return hash_password(password, n=2 ** 6)   # test speed; production: defaults


async def still_works(port: int, uri: str) -> None:
    """Another STOMP client and a native client still get messages through."""
    c = await Client(port).connect()
    await c.subscribe("/queue/alive", "s", receipt="r")
    await c.receipt("r")
    async with connect(uri) as native:
        await native.send("queue://alive", b"yes")
    [m] = await c.messages(1)
    assert m.body == "yes"
    await c.disconnect()


MALFORMED = {
    "junk": b"\x16\x03\x01\x02\x00garbage\n\n\0",
    "missing_nul": (b"SEND\ndestination:/queue/a\ncontent-length:3\n\nabcdefg\0"),
    "oversized_headers": b"SEND\n" + b"x-h:" + b"y" * 70_000 + b"\n\n\0",
    "unknown_command": b"FLY\n\n\0",
    "before_connect": b"SEND\ndestination:/queue/a\n\nx\0",
    "bad_selector": (b"SUBSCRIBE\nid:1\ndestination:/queue/a\nselector:color = = 'x'\n"
                     b"receipt:r-sel\n\n\0"),
    "bad_destination": b"SUBSCRIBE\nid:1\ndestination:/queue/a..b\n\n\0",
    "bad_escape": b"SEND\ndestination:/queue/a\nk:\\q\n\n\0",
}
EXPECTED = {"junk": "unknown_command", "missing_nul": "bad_frame",
            "oversized_headers": "headers_too_large", "unknown_command": "unknown_command",
            "before_connect": "not_connected", "bad_selector": "bad_selector",
            "bad_destination": "bad_destination", "bad_escape": "bad_header"}


class TestMalformed:
    @pytest.mark.parametrize("case", sorted(MALFORMED))
    async def test_error_and_close_harms_nobody(self, nursery, tmp_path, case):
        """Malformed or refused input gets ERROR naming the problem and a close; a
        STOMP consumer connected meanwhile and native clients keep working."""
        with trio.fail_after(20):
            node, uri, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            bystander = await Client(port).connect()
            await bystander.subscribe("/queue/by", "s", receipt="r")
            await bystander.receipt("r")
            peer = await RawStomp.open(port, connect=case != "before_connect")
            await peer.send_raw(MALFORMED[case])
            err = await peer.error_and_close()
            assert err.headers["message"].startswith(EXPECTED[case] + ":"), err.headers
            if case == "bad_selector":
                assert err.headers["receipt-id"] == "r-sel"
            if case == "oversized_headers":
                assert "65536" in err.headers["message"]
            await peer.aclose()
            await bystander.send("/queue/by", "ok")
            [m] = await bystander.messages(1)
            assert m.body == "ok" and not bystander.rec.errors
            await still_works(port, uri)
            await wait_for(lambda: len(node.statistics()["conns"]) == 1)

    async def test_oversized_body(self, nursery, tmp_path):
        """A body above max_frame_bytes: ERROR body_too_large naming the limit."""
        with trio.fail_after(20):
            _, _, port = await start_stomp_node(nursery,
                                                stomp_doc(tmp_path, max_frame_bytes=1024))
            peer = await RawStomp.open(port)
            await peer.send_raw(b"SEND\ndestination:/queue/a\ncontent-length:5000\n\n")
            err = await peer.error_and_close()
            assert err.headers["message"].startswith("body_too_large:")
            assert "1024" in err.headers["message"]

    async def test_too_many_headers(self, nursery, tmp_path):
        """More than 1000 headers: ERROR too_many_headers."""
        with trio.fail_after(20):
            _, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            peer = await RawStomp.open(port)
            await peer.send_raw(b"SEND\ndestination:/queue/a\n"
                                + b"".join(b"h%d:v\n" % i for i in range(1001)) + b"\n\0")
            err = await peer.error_and_close()
            assert err.headers["message"].startswith("too_many_headers:")


class TestHeartbeats:
    async def test_silent_client_is_timed_out(self, nursery, tmp_path):
        """A client that promised heart-beats every 200 ms and then says nothing is
        closed with ERROR heartbeat_timeout."""
        with trio.fail_after(20):
            node, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            peer = await RawStomp.open(port, **{"heart-beat": "200,0"})
            start = trio.current_time()
            err = await peer.error_and_close(timeout=5)
            assert err.headers["message"].startswith("heartbeat_timeout:")
            assert 0.3 < trio.current_time() - start < 3
            await wait_for(lambda: node.statistics()["conns"] == [])

    async def test_heartbeats_both_ways_keep_idle_client(self, nursery, tmp_path):
        """stomp.py with heart-beats (500,500) stays connected while idle for three
        periods and receives the broker's heart-beats."""
        with trio.fail_after(20):
            _, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            c = await Client(port, heartbeats=(500, 500)).connect()
            await trio.sleep(1.6)
            assert c.rec.heartbeats >= 2
            assert c.conn.is_connected() and not c.rec.errors
            await c.send("/queue/hb", "x", receipt="r")
            await c.receipt("r")
            await c.disconnect()

    async def test_broker_heartbeats_to_raw_peer(self, nursery, tmp_path):
        """A client asking for heart-beats every 100 ms gets bare EOLs while idle."""
        with trio.fail_after(20):
            _, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            peer = await RawStomp.open(port, **{"heart-beat": "0,100"})
            await trio.sleep(0.6)
            data = await peer.stream.receive_some(65536)
            assert data and set(data) == {10}
            await peer.aclose()


def secure_doc(tmp_path, pki=None, *, verify_peer: bool = False) -> dict:
    doc = stomp_doc(tmp_path)
    doc["security"] = {
        "authentication": True, "failure_delay": 0.05, "max_failure_delay": 0.2,
        "user": [{"name": "till", "password_hash": pw_hash("till-pw"),
                  "groups": ["tills"]},
                 {"name": "pricing", "password_hash": "", "groups": ["hq"]}],
        "permission": [{"principal": "group:tills", "read": ["queue://Till.>"],
                        "write": ["queue://Till.>", "queue://HQ.>"]},
                       {"principal": "group:hq", "read": [">"], "write": [">"]}]}
    if pki is not None:
        cert, key = pki.leaf("127.0.0.1", common_name="broker")
        doc["security"]["tls"] = {"cert": cert, "key": key, "ca": pki.ca_path,
                                  "verify_peer": verify_peer}
        doc["broker"]["listen"] = ["tcp://127.0.0.1:0", "stomp+ssl://127.0.0.1:0"]
    return doc


class TestSecurity:
    async def test_wrong_password(self, nursery, tmp_path):
        """A wrong passcode gets ERROR auth_failed and no session; the right one
        connects."""
        with trio.fail_after(20):
            node, _, port = await start_stomp_node(nursery, secure_doc(tmp_path))
            peer = await RawStomp.open(port, connect=False)
            await peer.send(StompFrame("CONNECT", {"accept-version": "1.2", "host": "h",
                                                   "login": "till", "passcode": "nope"}))
            err = await peer.error_and_close()
            assert err.headers["message"].startswith("auth_failed:")
            assert "nope" not in err.headers["message"]
            bad = Client(port)
            with pytest.raises(stomp.exception.ConnectFailedException):
                await bad.connect("till", "wrong")
            good = await Client(port).connect("till", "till-pw")
            await good.send("/queue/Till.1", "x", receipt="r")
            await good.receipt("r")
            await good.disconnect()

    async def test_permissions_apply(self, nursery, tmp_path):
        """A STOMP user may only send and subscribe where its permissions allow: a SEND
        elsewhere gets ERROR not_authorized (with the receipt-id) and a close."""
        with trio.fail_after(20):
            _, _, port = await start_stomp_node(nursery, secure_doc(tmp_path))
            c = await Client(port).connect("till", "till-pw")
            await c.send("/queue/Other", "x", receipt="r-bad")
            await wait_for(lambda: c.rec.errors)
            err = c.rec.errors[0]
            assert err.headers["receipt-id"] == "r-bad"
            assert err.headers["message"].startswith("not_authorized:")
            await wait_for(lambda: not c.conn.is_connected())
            d = await Client(port).connect("till", "till-pw")
            await d.subscribe("/queue/HQ.in", "s", receipt="r-sub")
            await wait_for(lambda: d.rec.errors)
            assert d.rec.errors[0].headers["receipt-id"] == "r-sub"

    async def test_tls_with_client_certificate(self, nursery, tmp_path, pki):
        """stomp+ssl:// with verify_peer: a client certificate whose CN is a configured
        user logs in without a password; without a certificate the handshake fails."""
        with trio.fail_after(20):
            _, uri, port = await start_stomp_node(nursery,
                                                  secure_doc(tmp_path, pki,
                                                             verify_peer=True))
            cert, key = pki.leaf("127.0.0.1", common_name="pricing")
            c = Client(port, ssl={"cert_file": cert, "key_file": key,
                                  "ca_certs": pki.ca_path})
            await c.connect()
            await c.subscribe("/queue/Prices", "s", receipt="r")
            await c.receipt("r")
            await c.send("/queue/Prices", "tls", persistent="true")
            [m] = await c.messages(1)
            assert m.body == "tls"
            await c.disconnect()
            # without a certificate: no session (a raw TLS peer, so the refusal cannot
            # leave a blocking client thread waiting)
            ctx = ssl.create_default_context(cafile=pki.ca_path)
            tcp = await trio.open_tcp_stream("127.0.0.1", port)
            tls = trio.SSLStream(tcp, ctx, server_hostname="127.0.0.1")
            got = b""
            try:
                await tls.do_handshake()
                await tls.send_all(encode(StompFrame("CONNECT", {"accept-version": "1.2",
                                                                 "host": "h"})))
                while data := await tls.receive_some(65536):
                    got += data
            except (trio.BrokenResourceError, ssl.SSLError):
                pass
            assert b"CONNECTED" not in got
            await trio.aclose_forcefully(tls)


class TestFlowControl:
    async def test_slow_stomp_consumer_bounded_by_prefetch(self, nursery, tmp_path):
        """A STOMP consumer that never acks holds only its prefetch; the rest waits on
        the broker (pending), not in the connection's queue."""
        with trio.fail_after(20):
            node, uri, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            c = await Client(port).connect()
            await c.subscribe("/queue/slow", "s", ack="client",
                              **{"activemq.prefetchSize": "5"})
            async with connect(uri) as native:
                for i in range(200):
                    native.send_nowait("queue://slow", b"x" * 100)
                await native.flush()
            await wait_for(lambda: node.site.broker.statistics()["destinations"]
                           ["queue://slow"]["depth"] == 195)
            await trio.sleep(0.1)
            assert len(c.rec.messages) == 5
            conn = next(x for x in node.statistics()["conns"] if x["protocol"] == "stomp")
            assert conn["queued"] == 0

    async def test_auto_ack_consumer_that_stops_reading(self, nursery, tmp_path):
        """An ack:auto consumer that stops reading is acked only for what was written:
        once the socket is full, at most its prefetch waits in its connection's queue and
        the rest stays on the broker."""
        with trio.fail_after(30):
            # the broker, not the producer, holds the rest: producer flow control off (on,
            # the producer's flush would wait for the stalled consumer -- README "Backlog
            # memory"; tests/node/test_store_cursor.py covers it)
            node, uri, port = await start_stomp_node(
                nursery, stomp_doc(tmp_path, max_queue_memory_bytes=0))
            peer = await RawStomp.open(port)
            await peer.send(StompFrame("SUBSCRIBE", {"id": "s", "destination": "/queue/big",
                                                     "activemq.prefetchSize": "10",
                                                     "receipt": "r"}))
            [receipt] = await peer.frames(1)
            assert receipt.command == "RECEIPT"
            body = b"y" * 8192
            async with connect(uri) as native:
                for _ in range(4000):              # 32 MiB: more than loopback buffers
                    native.send_nowait("queue://big", body)
                await native.flush()

                def depth() -> dict:
                    return node.site.broker.statistics()["destinations"]["queue://big"]

                # settled: everything arrived and nothing moved for a while (the socket
                # buffers are full, so no more acks, so no more deliveries)
                previous = None
                while True:
                    dst = depth()
                    if dst["enqueued"] == 4000 and previous == dst["depth"]:
                        break
                    previous = dst["depth"] if dst["enqueued"] == 4000 else None
                    await trio.sleep(0.3)
            assert dst["depth"] > 0
            conn = next(x for x in node.statistics()["conns"] if x["protocol"] == "stomp")
            assert conn["queued"] <= 10 and dst["inflight"] <= 10
            await peer.aclose()

    async def test_producer_blocked_by_destination_limit(self, nursery, tmp_path):
        """A STOMP producer to a full queue with limit behaviour 'block' is paused (its
        receipt waits) until a consumer makes room."""
        with trio.fail_after(20):
            doc = stomp_doc(tmp_path)
            doc["policy"] = [{"pattern": "queue://limited", "max_messages": 2,
                              "limit_behaviour": "block"}]
            node, _, port = await start_stomp_node(nursery, doc)
            p = await Client(port).connect()
            for i in range(3):
                await p.send("/queue/limited", str(i), receipt=f"r{i}")
            await p.receipt("r1")
            await trio.sleep(0.3)
            assert "r2" not in p.rec.receipts
            c = await Client(port).connect()
            await c.subscribe("/queue/limited", "s")
            await p.receipt("r2")
            await c.messages(3)
