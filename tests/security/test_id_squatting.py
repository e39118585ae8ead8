"""Issue #12, defect 2: confirmed, then silently dropped (message-id squatting).

Persistent sends were de-duplicated by the bare message id across all destinations and
producers: a client that saw one id could pre-send the next ones, and the victim's sends
were confirmed and then dropped; two applications choosing the same id on different
queues collided the same way.  Now the broker scopes every client id by a producer
identity it verifies (``wire/ids.py``), while a producer's own resend and a link's
re-forward after a reconnect or restart are still duplicates."""

from __future__ import annotations

import pytest
import trio

from treefed.client import connect
from treefed.persistence import SqliteStore
from treefed.wire.codec import encode
from treefed.wire.frames import PROTOCOL_VERSION, Hello, Receipt, Send
from treefed.wire.ids import SCOPE_SEP, destination_scope, original, producer_scope

from tests.node.helpers import RawPeer, make_config, port_of, start_node
from tests.security.canary import UP, open_canary

KEY = "k" * 24   # a producer key (the client library makes a random one per Connection)


async def raw_producer(uri: str, key: str | None) -> RawPeer:
    peer = RawPeer(await trio.open_tcp_stream("127.0.0.1", port_of(uri)))
    options = {"producer_key": key} if key else {}
    await peer.send_raw(encode(Hello(PROTOCOL_VERSION, "client", options=options)))
    assert type((await peer.framed.receive_frames())[0]) is Hello
    return peer


async def send_confirmed(peer: RawPeer, dst: str, msg_id: str, body: bytes) -> None:
    await peer.send_raw(encode(Send(dst, msg_id, body=body, persistent=True, receipt=True)))
    while True:
        for f in await peer.framed.receive_frames():
            if type(f) is Receipt and f.id == msg_id:
                return


async def drain(uri: str, dst: str, n: int) -> list:
    """Receive and ack ``n`` messages of ``dst``; returns [(id, body), ...]."""
    got = []
    async with connect(uri) as conn:
        sub = await conn.subscribe(dst)
        while len(got) < n:
            msg = await sub.receive()
            got.append((msg.id, msg.body))
            await msg.ack()
        with trio.move_on_after(0.3):
            msg = await sub.receive()
            got.append((msg.id, msg.body))   # nothing more may come
    return got


class TestSquatting:
    async def test_present_ids_do_not_suppress_the_victims_sends(self, nursery, tmp_path):
        """An attacker pre-sends the victim's next ids (same queue and another queue);
        every send of the victim is confirmed AND delivered; the attacker's messages
        are delivered too (they are other messages), none dropped as duplicates."""
        node, uri = await start_node(nursery, make_config(tmp_path / "d"))
        with trio.fail_after(20):
            async with connect(uri, client_id="victim") as victim:
                first = await victim.send("queue://orders", b"v1", persistent=True)
                producer, _, seq = first.rpartition(":")
                attacker = await raw_producer(uri, None)
                for n in range(int(seq) + 1, int(seq) + 4):
                    await send_confirmed(attacker, "queue://orders", f"{producer}:{n}", b"evil")
                    await send_confirmed(attacker, "queue://elsewhere", f"{producer}:{n}",
                                         b"evil")
                for body in (b"v2", b"v3", b"v4"):
                    await victim.send("queue://orders", body, persistent=True)
            got = await drain(uri, "queue://orders", 7)
            assert sorted(b for _, b in got) == [b"evil"] * 3 + [b"v1", b"v2", b"v3", b"v4"]
            assert node.site.broker.statistics()["dropped"].get("duplicate", 0) == 0

    async def test_same_id_from_two_applications_on_two_queues(self, nursery, tmp_path):
        """Two producers choosing the same id, on different queues (and on the same
        queue): every message is stored and delivered."""
        node, uri = await start_node(nursery, make_config(tmp_path / "d"))
        with trio.fail_after(20):
            async with connect(uri) as a, connect(uri) as b:
                await a.send("queue://q1", b"a", persistent=True, msg_id="order-1")
                await b.send("queue://q2", b"b", persistent=True, msg_id="order-1")
                await b.send("queue://q1", b"b1", persistent=True, msg_id="order-1")
            assert await drain(uri, "queue://q2", 1) == [("order-1", b"b")]
            assert sorted(await drain(uri, "queue://q1", 2)) == [("order-1", b"a"),
                                                                ("order-1", b"b1")]

    async def test_a_guessed_scope_is_scoped_again(self, nursery, tmp_path):
        """Sending an id that already carries the victim's scope does not reach the
        victim's id: the broker appends the sender's own scope."""
        node, uri = await start_node(nursery, make_config(tmp_path / "d"))
        victim_scope = producer_scope(KEY)
        with trio.fail_after(20):
            attacker = await raw_producer(uri, None)
            await send_confirmed(attacker, "queue://q",
                                 f"m1{SCOPE_SEP}{destination_scope(victim_scope, 'queue://q')}", b"x")
            victim = await raw_producer(uri, KEY)
            await send_confirmed(victim, "queue://q", "m1", b"v")
            got = await drain(uri, "queue://q", 2)
            assert sorted(b for _, b in got) == [b"v", b"x"]


class TestDuplicatesStillCaught:
    async def test_resend_by_the_same_producer_after_reconnect_is_a_duplicate(
            self, nursery, tmp_path):
        """The same producer key on a new connection (a failover) re-sending an id it
        sent before: confirmed again, stored and delivered once."""
        node, uri = await start_node(nursery, make_config(tmp_path / "d"))
        with trio.fail_after(20):
            first = await raw_producer(uri, KEY)
            await send_confirmed(first, "queue://q", "p:1", b"once")
            await first.aclose()
            second = await raw_producer(uri, KEY)
            await send_confirmed(second, "queue://q", "p:1", b"once")
            assert node.site.broker.statistics()["dropped"]["duplicate"] == 1
            assert await drain(uri, "queue://q", 1) == [("p:1", b"once")]

    async def test_resend_after_a_broker_restart_is_a_duplicate(self, tmp_path):
        """A message stored (not yet consumed) before a restart: the same producer's
        resend after the restart is a duplicate; another producer's same id is not."""
        data = tmp_path / "d"
        with trio.fail_after(30):
            store = SqliteStore(data)
            async with trio.open_nursery() as nursery:
                _, uri = await start_node(nursery, make_config(data), store=store)
                peer = await raw_producer(uri, KEY)
                await send_confirmed(peer, "queue://q", "p:1", b"once")
                await peer.aclose()
                nursery.cancel_scope.cancel()
            store.close()
            store = SqliteStore(data)
            async with trio.open_nursery() as nursery:
                node, uri = await start_node(nursery, make_config(data), store=store)
                assert node.restore() == 1
                again = await raw_producer(uri, KEY)
                await send_confirmed(again, "queue://q", "p:1", b"once")
                other = await raw_producer(uri, "o" * 24)
                await send_confirmed(other, "queue://q", "p:1", b"other")
                assert node.site.broker.statistics()["dropped"]["duplicate"] == 1
                got = await drain(uri, "queue://q", 2)
                assert sorted(got) == [("p:1", b"once"), ("p:1", b"other")]
                nursery.cancel_scope.cancel()
            store.close()

    def test_scope_depends_on_key_and_user(self):
        """The scope is a function of the secret key and the authenticated user."""
        assert producer_scope(KEY) == producer_scope(KEY)
        assert producer_scope(KEY) != producer_scope("x" * 24)
        assert producer_scope(KEY, "alice") != producer_scope(KEY, "bob")
        assert original(f"a:1{SCOPE_SEP}{producer_scope(KEY)}") == "a:1"


class TestSquattingOnARealEstate:
    @pytest.mark.slow
    async def test_squatter_at_the_store_cannot_drop_the_canary(self, tmp_path):
        """Real processes (store -> region -> HQ): a client at the store pre-sends the
        canary producer's next 200 ids to another queue; every confirmed canary message
        is still delivered exactly once, in order."""
        async with open_canary(tmp_path, rate=30) as (estate, canary):
            sent = [i for i, (dst, _) in canary.ledger.sent.items() if dst == UP]
            producer, _, seq = max(sent, key=lambda i: int(i.rpartition(":")[2])) \
                .rpartition(":")
            canary.attack_started()
            with trio.fail_after(30):
                squatter = await raw_producer(estate.uri("s1"), None)
                await squatter.send_raw(b"".join(
                    encode(Send("queue://squat", f"{producer}:{n}", body=b"x",
                                persistent=True))
                    for n in range(int(seq) + 1, int(seq) + 201)))
                await trio.sleep(2.0)
                await squatter.aclose()
            canary.attack_ended()
            figures = await canary.finish()
            assert figures["during:" + UP] >= 10
            print("canary", figures)
