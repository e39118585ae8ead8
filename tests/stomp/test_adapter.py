"""StompSession, the pure STOMP <-> native mapping: connect and version negotiation,
heart-beats, destinations and headers both ways, ack tags per mode, transactions,
receipts waiting on native confirmations, and errors with receipt ids."""

from __future__ import annotations

import pytest

from treefed.errors import FrameError
from treefed.stomp.adapter import StompSession, native_destination, stomp_destination
from treefed.stomp.codec import StompFrame
from treefed.wire.frames import (Ack, Bye, Deliver, Error, Hello, Nack, Ping, Pong,
                                 Receipt, Send, Subscribe, Unsubscribe)

NOW = 1_700_000_000.0


def connected(version: str = "1.2", heart_beat: str = "0,0") -> StompSession:
    s = StompSession("sess")
    [hello] = s.receive(StompFrame("CONNECT", {"accept-version": version, "host": "h",
                                               "login": "u", "passcode": "p",
                                               "heart-beat": heart_beat}), NOW)
    assert (type(hello), hello.role, hello.username, hello.password) == (
        Hello, "client", "u", "p")
    [frame], _ = s.send(Hello(1, "broker"))
    assert frame.command == "CONNECTED"
    return s


def deliver(sub: str, msg: str, **kw) -> Deliver:
    return Deliver(sub, msg, kw.pop("dst", "queue://q"), **kw)


class TestConnect:
    def test_highest_common_version(self):
        """accept-version picks the highest version both sides speak."""
        s = StompSession("x")
        s.receive(StompFrame("CONNECT", {"accept-version": "1.0,1.1"}), NOW)
        [f], _ = s.send(Hello(1, "broker"))
        assert (s.version, f.headers["version"]) == ("1.1", "1.1")

    def test_no_accept_version_is_10(self):
        """A CONNECT without accept-version speaks 1.0 (no version header back)."""
        s = StompSession("x")
        s.receive(StompFrame("CONNECT", {}), NOW)
        [f], _ = s.send(Hello(1, "broker"))
        assert s.version == "1.0" and "version" not in f.headers

    def test_heartbeat_negotiation(self):
        """The broker sends as often as the client asks and expects what it offers,
        never more often than MIN_HEARTBEAT_MS."""
        s = connected(heart_beat="50,2000")
        assert (s.send_every, s.expect_every) == (2.0, 0.1)
        s = connected(heart_beat="0,0")
        assert (s.send_every, s.expect_every) == (0.0, 0.0)

    def test_bad_heartbeat_header(self):
        """A malformed heart-beat header is refused."""
        with pytest.raises(FrameError) as e:
            StompSession("x").receive(StompFrame("CONNECT", {"heart-beat": "x"}), NOW)
        assert e.value.code == "bad_header"

    def test_frame_before_connect(self):
        """Anything before CONNECT is refused with not_connected."""
        with pytest.raises(FrameError) as e:
            StompSession("x").receive(StompFrame("SEND", {"destination": "/queue/a"}), NOW)
        assert e.value.code == "not_connected"


class TestDestinations:
    @pytest.mark.parametrize("stomp,native", [
        ("/queue/A.B", "queue://A.B"), ("/topic/A.*", "topic://A.*"),
        ("/temp-queue/r", "temp-queue://me.r"), ("/temp-topic/t", "temp-topic://me.t"),
        ("/remote-temp-queue/other.r", "temp-queue://other.r"), ("A.B", "A.B")])
    def test_mapping(self, stomp, native):
        """STOMP names map to native ones and back; temp names are private."""
        assert native_destination(stomp, "me") == native
        if stomp.startswith("/"):
            assert stomp_destination(native, "me") == stomp

    def test_unknown_prefix_refused(self):
        """A /-prefixed destination of an unknown kind is refused."""
        with pytest.raises(FrameError) as e:
            native_destination("/exchange/x", "me")
        assert e.value.code == "bad_destination"


class TestSend:
    def test_headers_map_to_native(self):
        """persistent, priority, expires, reply-to, correlation-id and type map to native
        fields; other headers are user headers; transport headers are dropped."""
        s = connected()
        [send] = s.receive(StompFrame("SEND", {
            "destination": "/queue/a", "persistent": "true", "priority": "7",
            "expires": str(int(NOW * 1000) + 5000), "reply-to": "/temp-queue/r",
            "correlation-id": "c", "type": "t", "color": "red", "content-length": "1",
            "receipt": "r1"}, b"x"), NOW)
        assert type(send) is Send
        assert (send.dst, send.persistent, send.priority, send.ttl, send.reply_to,
                send.receipt) == ("queue://a", True, 7, 5000, "temp-queue://sess.r", True)
        assert send.headers == {"color": "red", "JMSCorrelationID": "c", "JMSType": "t"}

    def test_bad_priority(self):
        """A priority outside 0-9 or not a number is refused, naming the receipt."""
        s = connected()
        for value in ("10", "high"):
            with pytest.raises(FrameError) as e:
                s.receive(StompFrame("SEND", {"destination": "/queue/a", "priority": value,
                                              "receipt": "r"}), NOW)
            assert e.value.code == "bad_header" and e.value.receipt_id == "r"

    def test_receipt_after_native_receipt(self):
        """A SEND's RECEIPT is released by the broker's Receipt for that message."""
        s = connected()
        [send] = s.receive(StompFrame("SEND", {"destination": "/queue/a",
                                               "receipt": "r1"}), NOW)
        assert s.send(Receipt("other"))[0] == []
        [f], _ = s.send(Receipt(send.id))
        assert (f.command, f.headers) == ("RECEIPT", {"receipt-id": "r1"})

    def test_refused_send_error_has_receipt_id(self):
        """A broker refusal of a receipted SEND becomes ERROR with its receipt-id."""
        s = connected()
        [send] = s.receive(StompFrame("SEND", {"destination": "/queue/a",
                                               "receipt": "r1"}), NOW)
        [f], _ = s.send(Error("not_authorized", "no", send.id))
        assert f.command == "ERROR" and f.headers["receipt-id"] == "r1"
        assert f.headers["message"] == "not_authorized: no" and s.failed


class TestSubscriptionsAndAcks:
    def test_subscribe_fields(self):
        """SUBSCRIBE maps id, destination, selector, prefetch and priority."""
        s = connected()
        [sub] = s.receive(StompFrame("SUBSCRIBE", {
            "id": "s", "destination": "/topic/PRICE.>", "selector": "a = 1",
            "activemq.prefetchSize": "5", "activemq.priority": "3"}), NOW)
        assert sub == Subscribe("s", "topic://PRICE.>", "a = 1", 5, 3)

    def test_bad_ack_mode(self):
        """An unknown ack mode is refused."""
        with pytest.raises(FrameError):
            connected().receive(StompFrame("SUBSCRIBE", {"id": "s", "ack": "x",
                                                         "destination": "/queue/a"}), NOW)

    def test_message_headers(self):
        """A Deliver becomes MESSAGE with its headers as STOMP names them."""
        s = connected()
        s.receive(StompFrame("SUBSCRIBE", {"id": "s", "destination": "/queue/q",
                                           "ack": "client"}), NOW)
        [m], _ = s.send(deliver("s", "m1", headers={"JMSCorrelationID": "c", "n": 3,
                                                    "flag": True},
                                persistent=True, priority=6, redelivered=1,
                                reply_to="temp-queue://other.r", timestamp=NOW,
                                expires=NOW + 1, body=b"b"))
        assert m.command == "MESSAGE" and m.body == b"b"
        assert {k: m.headers[k] for k in ("subscription", "message-id", "destination",
                                          "persistent", "priority", "redelivered",
                                          "reply-to", "correlation-id", "n", "flag",
                                          "timestamp", "expires")} == {
            "subscription": "s", "message-id": "m1", "destination": "/queue/q",
            "persistent": "true", "priority": "6", "redelivered": "true",
            "reply-to": "/remote-temp-queue/other.r", "correlation-id": "c", "n": "3",
            "flag": "true", "timestamp": str(int(NOW * 1000)),
            "expires": str(int(NOW * 1000) + 1000)}
        assert "ack" in m.headers
        [plain], _ = s.send(deliver("s", "m2"))
        assert "priority" not in plain.headers and "expires" not in plain.headers

    def test_client_ack_cumulative(self):
        """ack:client — ACK of the third tag is one cumulative native Ack."""
        s = connected()
        s.receive(StompFrame("SUBSCRIBE", {"id": "s", "destination": "/queue/q",
                                           "ack": "client"}), NOW)
        tags = [s.send(deliver("s", f"m{i}"))[0][0].headers["ack"] for i in range(4)]
        assert s.receive(StompFrame("ACK", {"id": tags[2]}), NOW) == [Ack("s", "m2", True)]
        assert s.receive(StompFrame("ACK", {"id": tags[3]}), NOW) == [Ack("s", "m3", False)]
        with pytest.raises(FrameError) as e:
            s.receive(StompFrame("ACK", {"id": tags[0]}), NOW)
        assert e.value.code == "no_such_message"

    def test_client_individual_ack_and_nack(self):
        """ack:client-individual — ACK and NACK settle only the named message."""
        s = connected()
        s.receive(StompFrame("SUBSCRIBE", {"id": "s", "destination": "/queue/q",
                                           "ack": "client-individual"}), NOW)
        tags = [s.send(deliver("s", f"m{i}"))[0][0].headers["ack"] for i in range(3)]
        assert s.receive(StompFrame("ACK", {"id": tags[1]}), NOW) == [Ack("s", "m1")]
        assert s.receive(StompFrame("NACK", {"id": tags[2]}), NOW) == [Nack("s", "m2")]

    def test_client_mode_nack_is_cumulative(self):
        """ack:client — NACK gives back the named message and every earlier one."""
        s = connected()
        s.receive(StompFrame("SUBSCRIBE", {"id": "s", "destination": "/queue/q",
                                           "ack": "client"}), NOW)
        tags = [s.send(deliver("s", f"m{i}"))[0][0].headers["ack"] for i in range(3)]
        assert s.receive(StompFrame("NACK", {"id": tags[1]}), NOW) == [
            Nack("s", "m0"), Nack("s", "m1")]

    def test_auto_subscriptions_listed(self):
        """ack:auto subscriptions are listed in auto_subs (the shell acks what it wrote
        for them), MESSAGE frames for them carry no ack tag, and UNSUBSCRIBE drops them."""
        s = connected()
        s.receive(StompFrame("SUBSCRIBE", {"id": "a", "destination": "/queue/q"}), NOW)
        s.receive(StompFrame("SUBSCRIBE", {"id": "c", "destination": "/queue/r",
                                           "ack": "client"}), NOW)
        assert s.auto_subs == {"a"}
        assert "ack" not in s.message(deliver("a", "m1")).headers
        s.receive(StompFrame("UNSUBSCRIBE", {"id": "a"}), NOW)
        assert s.auto_subs == set()

    def test_auto_ack_race_with_unsubscribe_is_silent(self):
        """The core refusing a fed-back auto ack (the subscription just went) is not an
        ERROR: the session stays up."""
        s = connected()
        assert s.send(Error("no_such_subscription", "gone", "m1")) == ([], [])
        assert not s.failed

    def test_v11_ack_by_message_id(self):
        """1.1 ACK names message-id and subscription."""
        s = connected("1.1")
        s.receive(StompFrame("SUBSCRIBE", {"id": "s", "destination": "/queue/q",
                                           "ack": "client-individual"}), NOW)
        s.send(deliver("s", "m1"))
        assert s.receive(StompFrame("ACK", {"message-id": "m1", "subscription": "s"}),
                         NOW) == [Ack("s", "m1")]

    def test_unsubscribe_forgets_tags(self):
        """UNSUBSCRIBE forgets the subscription's unacked tags."""
        s = connected()
        s.receive(StompFrame("SUBSCRIBE", {"id": "s", "destination": "/queue/q",
                                           "ack": "client"}), NOW)
        tag = s.send(deliver("s", "m1"))[0][0].headers["ack"]
        assert s.receive(StompFrame("UNSUBSCRIBE", {"id": "s"}), NOW) == [Unsubscribe("s")]
        with pytest.raises(FrameError):
            s.receive(StompFrame("ACK", {"id": tag}), NOW)


class TestTransactions:
    def test_commit_releases_in_order_and_receipt_waits(self):
        """Sends and acks are held until COMMIT; its RECEIPT waits for every send's
        native Receipt and for the Pong of its barrier."""
        s = connected()
        s.receive(StompFrame("SUBSCRIBE", {"id": "s", "destination": "/queue/q",
                                           "ack": "client-individual"}), NOW)
        tag = s.send(deliver("s", "m1"))[0][0].headers["ack"]
        assert s.receive(StompFrame("BEGIN", {"transaction": "t"}), NOW) == []
        assert s.receive(StompFrame("SEND", {"destination": "/queue/a",
                                             "transaction": "t"}), NOW) == []
        assert s.receive(StompFrame("ACK", {"id": tag, "transaction": "t"}), NOW) == []
        out = s.receive(StompFrame("COMMIT", {"transaction": "t", "receipt": "rc"}), NOW)
        send, ack, ping = out
        assert (type(send), send.receipt, ack, type(ping)) == (Send, True, Ack("s", "m1"),
                                                               Ping)
        assert s.send(Pong(ping.token))[0] == []
        [f], _ = s.send(Receipt(send.id))
        assert f.headers == {"receipt-id": "rc"}

    def test_abort_drops(self):
        """ABORT drops the held frames; the transaction is gone."""
        s = connected()
        s.receive(StompFrame("BEGIN", {"transaction": "t"}), NOW)
        s.receive(StompFrame("SEND", {"destination": "/queue/a", "transaction": "t"}), NOW)
        assert s.receive(StompFrame("ABORT", {"transaction": "t"}), NOW) == []
        with pytest.raises(FrameError) as e:
            s.receive(StompFrame("COMMIT", {"transaction": "t"}), NOW)
        assert e.value.code == "bad_transaction"

    def test_duplicate_begin(self):
        """BEGIN of a transaction already open is refused."""
        s = connected()
        s.receive(StompFrame("BEGIN", {"transaction": "t"}), NOW)
        with pytest.raises(FrameError):
            s.receive(StompFrame("BEGIN", {"transaction": "t"}), NOW)


class TestLifecycle:
    def test_disconnect_barrier(self):
        """DISCONNECT with a receipt: a Ping barrier then Bye; the Pong releases it."""
        s = connected()
        ping, bye = s.receive(StompFrame("DISCONNECT", {"receipt": "bye"}), NOW)
        assert type(ping) is Ping and type(bye) is Bye and s.state == "closed"
        [f], _ = s.send(Pong(ping.token))
        assert f.headers == {"receipt-id": "bye"}

    def test_broker_bye_is_error(self):
        """The broker shutting down is an ERROR to a connected client."""
        s = connected()
        [f], _ = s.send(Bye("broker shutting down"))
        assert f.command == "ERROR" and "shutting down" in f.headers["message"]
