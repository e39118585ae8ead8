"""Every STOMP frame against a running broker with the real stomp.py client: messaging
and headers, each ack mode, NACK to redelivery and the DLQ, transactions, receipts,
selectors, prefetch, temporary destinations, versions 1.0-1.2, and cross-protocol
traffic with native clients."""

from __future__ import annotations

import json
import sys
import time

import trio

from treefed.client import connect

from tests.node.helpers import child_env
from tests.stomp.helpers import Client, RawStomp, start_stomp_node, stomp_doc, wait_for
from treefed.stomp.codec import StompFrame


class TestMessaging:
    async def test_send_receive_with_headers(self, nursery, tmp_path):
        """A SEND reaches a subscriber with destination, message-id, persistent,
        priority, correlation-id, type, reply-to and user headers mapped."""
        with trio.fail_after(20):
            node, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            a = await Client(port).connect()
            b = await Client(port).connect()
            await a.subscribe("/queue/Orders.EU", "s1", receipt="r-sub")
            await a.receipt("r-sub")
            await b.send("/queue/Orders.EU", "hello", persistent="true", priority="7",
                         **{"correlation-id": "c-1", "type": "order",
                            "reply-to": "/queue/Replies", "color": "red", "receipt": "r1"})
            await b.receipt("r1")
            [m] = await a.messages(1)
            h = m.headers
            assert m.body == "hello"
            assert (h["destination"], h["subscription"], h["persistent"], h["priority"],
                    h["correlation-id"], h["type"], h["reply-to"], h["color"]) == (
                "/queue/Orders.EU", "s1", "true", "7", "c-1", "order", "/queue/Replies",
                "red")
            assert h["message-id"].startswith("ID:") and "redelivered" not in h
            assert int(h["timestamp"]) > 0 and "expires" not in h
            await a.disconnect()
            await b.disconnect()

    async def test_body_with_nul_bytes(self, nursery, tmp_path):
        """A content-length body containing NULs arrives byte for byte."""
        with trio.fail_after(20):
            _, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            peer = await RawStomp.open(port)
            await peer.send(StompFrame("SUBSCRIBE", {"id": "1", "destination": "/queue/bin"}))
            await peer.send(StompFrame("SEND", {"destination": "/queue/bin"}, b"\0a\0b\0"))
            [m] = await peer.frames(1)
            assert (m.command, m.body) == ("MESSAGE", b"\0a\0b\0")
            await peer.aclose()

    async def test_topic_wildcards(self, nursery, tmp_path):
        """Topic subscribers with * and > wildcards each get a copy of matching sends."""
        with trio.fail_after(20):
            _, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            a = await Client(port).connect()
            await a.subscribe("/topic/PRICE.>", "all", receipt="ra")
            await a.subscribe("/topic/PRICE.*.IBM", "ibm", receipt="rb")
            await a.receipt("ra")
            await a.receipt("rb")
            p = await Client(port).connect()
            for dst in ("/topic/PRICE.STOCK.IBM", "/topic/PRICE.BOND", "/topic/OTHER"):
                await p.send(dst, dst)
            await a.messages(3)
            await trio.sleep(0.1)
            got = sorted((m.headers["subscription"], m.body) for m in a.rec.messages)
            assert got == [("all", "/topic/PRICE.BOND"), ("all", "/topic/PRICE.STOCK.IBM"),
                           ("ibm", "/topic/PRICE.STOCK.IBM")]

    async def test_expires(self, nursery, tmp_path):
        """An already-expired SEND is never delivered; a future expires arrives with
        its absolute time."""
        with trio.fail_after(20):
            _, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            p = await Client(port).connect()
            await p.send("/queue/q", "expired", expires="1000", receipt="r0")
            later = str(int((time.time() + 60) * 1000))
            await p.send("/queue/q", "fresh", expires=later, receipt="r1")
            await p.receipt("r1")
            c = await Client(port).connect()
            await c.subscribe("/queue/q", "s")
            [m] = await c.messages(1)
            await trio.sleep(0.1)
            assert c.rec.bodies() == ["fresh"]
            assert abs(int(m.headers["expires"]) - int(later)) <= 1


class TestAckModes:
    async def test_auto_ack_beyond_prefetch(self, nursery, tmp_path):
        """ack:auto settles each delivery, so a prefetch of 2 still drains 50 messages
        and nothing is left on the queue."""
        with trio.fail_after(20):
            node, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            c = await Client(port).connect()
            await c.subscribe("/queue/auto", "s", **{"activemq.prefetchSize": "2"})
            p = await Client(port).connect()
            for i in range(50):
                await p.send("/queue/auto", str(i))
            await c.messages(50)
            assert c.rec.bodies() == [str(i) for i in range(50)]
            await wait_for(lambda: node.site.broker.statistics()["destinations"]
                           ["queue://auto"]["inflight"] == 0)

    async def test_client_ack_is_cumulative(self, nursery, tmp_path):
        """ack:client — ACK of the third message settles the first three; after the
        client goes, only the unacked fourth is redelivered (redelivered:true)."""
        with trio.fail_after(20):
            _, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            p = await Client(port).connect()
            for i in range(4):
                await p.send("/queue/cum", str(i))
            c = await Client(port).connect()
            await c.subscribe("/queue/cum", "s", ack="client")
            msgs = await c.messages(4)
            await c.call(c.conn.ack, msgs[2].headers["ack"], receipt="ra")
            await c.receipt("ra")
            await c.disconnect()
            d = await Client(port).connect()
            await d.subscribe("/queue/cum", "s", ack="client")
            [m] = await d.messages(1)
            await trio.sleep(0.1)
            assert (m.body, m.headers.get("redelivered")) == ("3", "true")
            assert len(d.rec.messages) == 1

    async def test_client_individual_ack(self, nursery, tmp_path):
        """ack:client-individual — ACK settles only the named message."""
        with trio.fail_after(20):
            _, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            p = await Client(port).connect()
            for i in range(3):
                await p.send("/queue/ind", str(i))
            c = await Client(port).connect()
            await c.subscribe("/queue/ind", "s", ack="client-individual")
            msgs = await c.messages(3)
            await c.call(c.conn.ack, msgs[1].headers["ack"], receipt="ra")
            await c.receipt("ra")
            await c.disconnect()
            d = await Client(port).connect()
            await d.subscribe("/queue/ind", "s", ack="client")
            await d.messages(2)
            await trio.sleep(0.1)
            assert d.rec.bodies() == ["0", "2"]

    async def test_nack_redelivers_then_dead_letters(self, nursery, tmp_path):
        """NACK redelivers (redelivered:true); past max_redeliveries the message goes to
        the DLQ, as for native consumers."""
        with trio.fail_after(20):
            _, _, port = await start_stomp_node(nursery,
                                                stomp_doc(tmp_path, max_redeliveries=2))
            c = await Client(port).connect()
            await c.subscribe("/queue/DLQ", "dlq", receipt="r0")
            await c.subscribe("/queue/poison", "s", ack="client-individual", receipt="r1")
            await c.receipt("r1")
            await c.send("/queue/poison", "bad")
            for n in range(3):
                msgs = await c.messages(n + 1)
                m = msgs[n]
                assert m.headers["subscription"] == "s"
                assert m.headers.get("redelivered") == ("true" if n else None)
                await c.call(c.conn.nack, m.headers["ack"])
            msgs = await c.messages(4)
            assert (msgs[3].headers["subscription"], msgs[3].body) == ("dlq", "bad")

    async def test_unknown_ack_id_is_an_error(self, nursery, tmp_path):
        """ACK of an id never delivered gets ERROR naming it, with the receipt-id."""
        with trio.fail_after(20):
            _, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            peer = await RawStomp.open(port)
            await peer.send(StompFrame("ACK", {"id": "nope", "receipt": "r9"}))
            err = await peer.error_and_close()
            assert err.headers["receipt-id"] == "r9"
            assert "no_such_message" in err.headers["message"]


class TestTransactions:
    async def test_commit_releases_sends_and_acks(self, nursery, tmp_path):
        """Sends in a transaction are not delivered before COMMIT; the COMMIT receipt
        comes once they are admitted; an ACK in the transaction settles at COMMIT."""
        with trio.fail_after(20):
            node, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            c = await Client(port).connect()
            await c.subscribe("/queue/tx", "s", ack="client-individual", receipt="r0")
            await c.receipt("r0")
            p = await Client(port).connect()
            await p.call(p.conn.begin, "t1")
            await p.send("/queue/tx", "a", transaction="t1", persistent="true")
            await p.send("/queue/tx", "b", transaction="t1")
            await trio.sleep(0.2)
            assert c.rec.messages == []
            await p.call(p.conn.commit, "t1", receipt="rc")
            await p.receipt("rc")
            msgs = await c.messages(2)
            assert c.rec.bodies() == ["a", "b"]
            await c.call(c.conn.begin, "t2")
            await c.call(c.conn.ack, msgs[0].headers["ack"], transaction="t2")
            await c.call(c.conn.commit, "t2", receipt="rc2")
            await c.receipt("rc2")
            stats = node.site.broker.statistics()["destinations"]["queue://tx"]
            assert stats["inflight"] == 1

    async def test_abort_discards(self, nursery, tmp_path):
        """ABORT drops the transaction's sends; its ACKs never happen (the message is
        redelivered to the next consumer)."""
        with trio.fail_after(20):
            _, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            c = await Client(port).connect()
            await c.subscribe("/queue/ab", "s", ack="client-individual", receipt="r0")
            await c.receipt("r0")
            await c.send("/queue/ab", "keep")
            [m] = await c.messages(1)
            await c.call(c.conn.begin, "t")
            await c.send("/queue/ab", "dropped", transaction="t")
            await c.call(c.conn.ack, m.headers["ack"], transaction="t")
            await c.call(c.conn.abort, "t", receipt="ra")
            await c.receipt("ra")
            await c.disconnect()
            d = await Client(port).connect()
            await d.subscribe("/queue/ab", "s")
            await d.messages(1)
            await trio.sleep(0.2)
            assert d.rec.bodies() == ["keep"]

    async def test_commit_unknown_transaction(self, nursery, tmp_path):
        """COMMIT of a transaction never begun: ERROR with the receipt-id, then close."""
        with trio.fail_after(20):
            _, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            peer = await RawStomp.open(port)
            await peer.send(StompFrame("COMMIT", {"transaction": "x", "receipt": "r"}))
            err = await peer.error_and_close()
            assert err.headers["receipt-id"] == "r"
            assert "bad_transaction" in err.headers["message"]


class TestReceiptsAndLifecycle:
    async def test_receipts_on_every_frame(self, nursery, tmp_path):
        """SUBSCRIBE, SEND, BEGIN, ABORT, UNSUBSCRIBE and DISCONNECT all answer a
        receipt header with RECEIPT."""
        with trio.fail_after(20):
            _, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            c = await Client(port).connect()
            await c.subscribe("/queue/r", "s", receipt="sub")
            await c.send("/queue/r", "x", receipt="send")
            await c.call(c.conn.begin, "t", receipt="begin")
            await c.call(c.conn.abort, "t", receipt="abort")
            await c.call(c.conn.unsubscribe, "s", receipt="unsub")
            for r in ("sub", "send", "begin", "abort", "unsub"):
                await c.receipt(r)
            await c.call(c.conn.disconnect, receipt="bye")
            await c.receipt("bye")

    async def test_persistent_receipt_means_stored(self, nursery, tmp_path):
        """The RECEIPT of a persistent:true SEND comes after the message was committed
        to the store."""
        from treefed.persistence import SqliteStore
        with trio.fail_after(20):
            store = SqliteStore(tmp_path / "store.db")
            _, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path), store=store)
            c = await Client(port).connect()
            await c.send("/queue/keep", "x", persistent="true", receipt="r")
            await c.receipt("r")
            other = SqliteStore(tmp_path / "store.db")
            assert [m.body for m in other.load()] == [b"x"]
            other.close()

    async def test_versions_and_heartbeat_negotiation(self, nursery, tmp_path):
        """1.0, 1.1 and 1.2 clients all connect; CONNECTED names the version and the
        heart-beats granted; a 1.1 client acks by message-id and subscription."""
        with trio.fail_after(20):
            _, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            for version in ("1.0", "1.1", "1.2"):
                c = await Client(port, version=version).connect()
                await c.subscribe("/queue/v" + version, "s", ack="client")
                await c.send("/queue/v" + version, version)
                [m] = await c.messages(1)
                assert m.body == version
                if version == "1.1":
                    await c.call(c.conn.ack, m.headers["message-id"], "s", receipt="ra")
                    await c.receipt("ra")
                await c.disconnect()
            peer = await RawStomp.open(port, connect=False)
            await peer.send(StompFrame("STOMP", {"accept-version": "1.1,1.2", "host": "h",
                                                 "heart-beat": "300,500"}))
            [f] = await peer.frames(1)
            assert (f.command, f.headers["version"], f.headers["heart-beat"]) == (
                "CONNECTED", "1.2", "500,300")
            await peer.aclose()

    async def test_unsupported_version(self, nursery, tmp_path):
        """CONNECT accepting only an unknown version: ERROR listing the supported ones."""
        with trio.fail_after(20):
            _, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            peer = await RawStomp.open(port, connect=False)
            await peer.send(StompFrame("CONNECT", {"accept-version": "2.0", "host": "h"}))
            err = await peer.error_and_close()
            assert err.headers["version"] == "1.0,1.1,1.2"

    async def test_stat_shows_protocol(self, nursery, tmp_path):
        """stat lists STOMP connections with protocol 'stomp' and the listener."""
        with trio.fail_after(20):
            node, uri, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            c = await Client(port).connect()
            async with connect(uri) as native:
                stats = await native.stat()
            protocols = sorted(x["protocol"] for x in stats["conns"])
            assert protocols == ["stomp", "treefed"]
            assert any(u.startswith("stomp://") for u in stats["listeners"])
            await c.disconnect()


    async def test_treefed_stat_command_lists_stomp(self, nursery, tmp_path):
        """`treefed stat` (the command, in a subprocess) lists a STOMP client's
        connection with protocol 'stomp'."""
        with trio.fail_after(30):
            _, uri, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            c = await Client(port).connect()
            got = await trio.run_process([sys.executable, "-m", "treefed.cli", "stat", uri],
                                         capture_stdout=True, capture_stderr=True,
                                         env=child_env(), check=False)
            assert got.returncode == 0, got.stderr
            conns = json.loads(got.stdout)["conns"]
            assert [x["protocol"] for x in conns if x["protocol"] == "stomp"] == ["stomp"]
            await c.disconnect()


class TestSelectorsAndPrefetch:
    async def test_selector_on_user_header(self, nursery, tmp_path):
        """A selector header filters on STOMP user headers and JMS names."""
        with trio.fail_after(20):
            _, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            c = await Client(port).connect()
            await c.subscribe("/topic/t", "s", selector="color = 'red' AND JMSPriority > 5",
                              receipt="r")
            await c.receipt("r")
            await c.send("/topic/t", "1", color="red", priority="9")
            await c.send("/topic/t", "2", color="blue", priority="9")
            await c.send("/topic/t", "3", color="red", priority="1")
            await c.send("/topic/t", "4", color="red", priority="6", receipt="r2")
            await c.receipt("r2")
            await c.messages(2)
            await trio.sleep(0.1)
            assert c.rec.bodies() == ["1", "4"]

    async def test_prefetch_bounds_unacked(self, nursery, tmp_path):
        """activemq.prefetchSize bounds unacknowledged deliveries; an ACK lets more
        through."""
        with trio.fail_after(20):
            _, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            c = await Client(port).connect()
            await c.subscribe("/queue/pf", "s", ack="client",
                              **{"activemq.prefetchSize": "3"})
            for i in range(10):
                await c.send("/queue/pf", str(i))
            msgs = await c.messages(3)
            await trio.sleep(0.2)
            assert len(c.rec.messages) == 3
            await c.call(c.conn.ack, msgs[2].headers["ack"])
            await c.messages(6)
            await trio.sleep(0.2)
            assert len(c.rec.messages) == 6


class TestTempDestinations:
    async def test_request_reply_over_temp_queue(self, nursery, tmp_path):
        """A requester's /temp-queue/ as reply-to: a STOMP responder sees it as
        /remote-temp-queue/... and its reply reaches the requester; the name is private
        to each connection."""
        with trio.fail_after(20):
            _, uri, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            req = await Client(port).connect()
            other = await Client(port).connect()
            await req.subscribe("/temp-queue/replies", "r", receipt="r0")
            await other.subscribe("/temp-queue/replies", "r", receipt="r1")
            await req.receipt("r0")
            await other.receipt("r1")
            srv = await Client(port).connect()
            await srv.subscribe("/queue/service", "s", receipt="r2")
            await srv.receipt("r2")
            await req.send("/queue/service", "ping", **{"reply-to": "/temp-queue/replies"})
            [m] = await srv.messages(1)
            reply_to = m.headers["reply-to"]
            assert reply_to.startswith("/remote-temp-queue/")
            await srv.send(reply_to, "pong")
            [r] = await req.messages(1)
            assert (r.body, r.headers["destination"]) == ("pong", "/temp-queue/replies")
            # a native responder replies to the same temp queue
            async with connect(uri) as native:
                await native.send("queue://service", b"ping2")  # nobody: just traffic
                sub = await native.subscribe("queue://service2")
                await req.send("/queue/service2", "ping3",
                               **{"reply-to": "/temp-queue/replies"})
                msg = await sub.receive()
                await msg.reply(b"pong3")
                await msg.ack()
            await req.messages(2)
            assert req.rec.bodies() == ["pong", "pong3"]
            await trio.sleep(0.1)
            assert other.rec.messages == []


    async def test_temp_topic_dies_with_its_connection(self, nursery, tmp_path):
        """A /temp-topic/ given as reply-to fans a reply out to each of its owner's
        subscriptions; once the owner is gone, a SEND to it is refused
        (no_such_destination)."""
        with trio.fail_after(20):
            _, _, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            owner = await Client(port).connect()
            await owner.subscribe("/temp-topic/events", "a", receipt="ra")
            await owner.subscribe("/temp-topic/events", "b", receipt="rb")
            await owner.receipt("rb")
            helper = await Client(port).connect()
            await helper.subscribe("/queue/svc", "s", receipt="rs")
            await helper.receipt("rs")
            await owner.send("/queue/svc", "hi", **{"reply-to": "/temp-topic/events"})
            [m] = await helper.messages(1)
            reply_to = m.headers["reply-to"]
            assert reply_to.startswith("/remote-temp-topic/")
            await helper.send(reply_to, "e1")
            msgs = await owner.messages(2)
            assert sorted(m.headers["subscription"] for m in msgs) == ["a", "b"]
            assert {m.headers["destination"] for m in msgs} == {"/temp-topic/events"}
            await owner.disconnect()
            peer = await RawStomp.open(port)
            await peer.send(StompFrame("SEND", {"destination": reply_to, "receipt": "r"}))
            err = await peer.error_and_close()
            assert err.headers["message"].startswith("no_such_destination:")
            assert err.headers["receipt-id"] == "r"


class TestCrossProtocol:
    async def test_native_and_stomp_see_each_others_headers(self, nursery, tmp_path):
        """User headers, correlation id and type cross between native and STOMP clients
        both ways, and selectors see them."""
        with trio.fail_after(20):
            _, uri, port = await start_stomp_node(nursery, stomp_doc(tmp_path))
            s = await Client(port).connect()
            await s.subscribe("/queue/toStomp", "s", selector="region = 'EU'", receipt="r")
            await s.receipt("r")
            async with connect(uri) as native:
                sub = await native.subscribe("queue://toNative", selector="till = '7'")
                await native.send("queue://toStomp", b"n1",
                                  headers={"region": "EU", "JMSCorrelationID": "c9",
                                           "qty": 3})
                await native.send("queue://toStomp", b"n2", headers={"region": "US"})
                [m] = await s.messages(1)
                assert (m.body, m.headers["region"], m.headers["correlation-id"],
                        m.headers["qty"]) == ("n1", "EU", "c9", "3")
                await s.send("/queue/toNative", "s1", till="7", type="sale",
                             **{"correlation-id": "c10"})
                msg = await sub.receive()
                assert msg.body == b"s1"
                assert msg.headers["till"] == "7"
                assert msg.headers["JMSType"] == "sale"
                assert msg.headers["JMSCorrelationID"] == "c10"
                await msg.ack()
