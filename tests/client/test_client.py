"""The client library against real BrokerNodes on 127.0.0.1: errors, request/reply,
pipelining, batching and failover."""

from __future__ import annotations

import pytest
import trio

from treefed.client import Connection, ConnectionClosed, connect, remote_error
from treefed.errors import (DestinationError, FrameError, LimitError, RemoteError,
                            SelectorError)
from treefed.transport.framed import FramedStream
from treefed.wire.frames import PROTOCOL_VERSION, Error, Hello, Receipt, Send

from tests.node.helpers import make_config, start_node, wait_for


class TestRemoteError:
    def test_codes_map_to_error_classes(self):
        """Each broker error code becomes the matching RemoteError subclass, code kept."""
        cases = {"bad_destination": DestinationError, "limit": LimitError,
                 "bad_field": FrameError, "bad_version": FrameError,
                 "forbidden": RemoteError}
        for code, cls in cases.items():
            exc = remote_error(Error(code, "why", "r1"))
            assert type(exc) is cls and exc.code == code and exc.message == "why"

    def test_selector_error_keeps_position(self):
        """A bad_selector error carries the position parsed from the broker's text."""
        exc = remote_error(Error("bad_selector", "invalid selector at position 7: boom"))
        assert isinstance(exc, SelectorError) and exc.position == 7
        assert exc.message == "invalid selector at position 7: boom"


class TestConnection:
    async def test_bad_selector_raises_with_position(self, nursery, tmp_path):
        """subscribe() raises the broker's SelectorError, position included."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path))
            async with connect(uri) as conn:
                with pytest.raises(SelectorError) as info:
                    await conn.subscribe("queue://q", selector="price > > 3")
                assert info.value.position is not None
                with pytest.raises(DestinationError):
                    await conn.subscribe("queue://two words")
                sub = await conn.subscribe("queue://q", selector="price > 3")
                await conn.send("queue://q", b"cheap", headers={"price": 1})
                await conn.send("queue://q", b"dear", headers={"price": 9})
                assert (await sub.receive()).body == b"dear"

    async def test_persistent_send_refused_raises_limit_error(self, nursery, tmp_path):
        """A send the broker refuses raises its error; pipelined refusals surface
        from wait_confirmed."""
        config = make_config(tmp_path, policies=[
            {"pattern": "queue://small.>", "max_message_bytes": 200}])
        with trio.fail_after(10):
            node, uri = await start_node(nursery, config)
            async with connect(uri) as conn:
                with pytest.raises(LimitError):
                    await conn.send("queue://small.a", b"x" * 1000, persistent=True)
                await conn.send("queue://small.a", b"y" * 1000, persistent=True,
                                confirm=False)
                await conn.send("queue://small.a", b"ok", persistent=True, confirm=False)
                with pytest.raises(LimitError):
                    await conn.wait_confirmed()
                assert conn.unconfirmed() == []

    async def test_request_reply(self, nursery, tmp_path):
        """request() gets the reply correlated to it through a temporary queue."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path))
            async with connect(uri) as server, connect(uri) as client:
                service = await server.subscribe("queue://svc.echo")

                async def serve():
                    async for msg in service:
                        await msg.reply(msg.body.upper())
                        await msg.ack()

                nursery.start_soon(serve)
                replies = [await client.request("queue://svc.echo", b"ping%d" % i)
                           for i in range(3)]
                assert [r.body for r in replies] == [b"PING0", b"PING1", b"PING2"]
                assert replies[0].dst.startswith("temp-queue://")

    async def test_request_times_out(self, nursery, tmp_path):
        """With nobody answering, request() raises TooSlowError after its timeout."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path))
            async with connect(uri) as client:
                with pytest.raises(trio.TooSlowError):
                    await client.request("queue://nobody", b"?", timeout=0.2)

    async def test_ids_unique_and_sequenced(self, nursery, tmp_path):
        """Message ids are producer id + sequence, unique across connections."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path))
            async with connect(uri, client_id="app") as a, connect(uri, client_id="app") as b:
                ids = [await a.send("queue://ids", b"") for _ in range(3)]
                other = await b.send("queue://ids", b"")
            assert ids == [f"{a.producer_id}:{n}" for n in (1, 2, 3)]
            assert a.producer_id.startswith("app-") and a.producer_id != b.producer_id
            assert other not in ids

    async def test_send_nowait_would_block_over_high_water(self, nursery, tmp_path):
        """send_nowait raises WouldBlock once the outgoing queue is at its high-water
        mark, and succeeds again after the writer drained it."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path))
            async with connect(uri, high_water=3) as conn:
                for _ in range(3):
                    conn.send_nowait("queue://hw", b"x")
                with pytest.raises(trio.WouldBlock):
                    conn.send_nowait("queue://hw", b"x")
                await conn.flush()
                conn.send_nowait("queue://hw", b"x")
                await conn.flush()
                stats = await conn.stat()
                assert stats["destinations"]["queue://hw"]["enqueued"] == 4

    async def test_burst_of_acks_leaves_in_few_writes(self, nursery, tmp_path):
        """A consumer draining a burst queues its acks and they reach the broker in far
        fewer batches than messages (one write per wake-up, not per ack)."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path))
            async with connect(uri) as producer, connect(uri) as consumer:
                for _ in range(500):
                    await producer.send("queue://burst", b"b")
                await producer.flush()
                await wait_for(lambda: node.statistics()["destinations"]
                               .get("queue://burst", {}).get("depth") == 500)
                sub = await consumer.subscribe("queue://burst", prefetch=500)
                await wait_for(lambda: sub.queued == 500)
                before = node.batches
                for _ in range(500):
                    (await sub.receive()).ack_nowait()
                await wait_for(lambda: node.statistics()["destinations"]["queue://burst"]
                               ["dequeued"] == 500)
                assert node.batches - before < 20

    async def test_unsubscribe_ends_iteration(self, nursery, tmp_path):
        """Closing a subscription ends `async for` over it."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path))
            async with connect(uri) as conn:
                sub = await conn.subscribe("queue://bye")
                await sub.close()
                assert [m async for m in sub] == []
                await wait_for(lambda: node.statistics()["consumers"] == [])

    async def test_connect_refused_raises_connection_closed(self, tmp_path):
        """Connecting to a port nobody listens on fails with ConnectionClosed."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        await listeners[0].aclose()
        with trio.fail_after(10):
            with pytest.raises(ConnectionClosed):
                async with connect(f"tcp://127.0.0.1:{port}"):
                    pass

    async def test_broker_refusing_hello_raises_remote_error(self, nursery):
        """A broker answering our hello with an error frame raises that error."""
        async def refuse(stream):
            framed = FramedStream(stream)
            await framed.receive_frames()
            await framed.send_frame(Error("bad_version", "speak version 7"))
            await stream.aclose()

        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, refuse, listeners)
        with trio.fail_after(10):
            with pytest.raises(FrameError) as info:
                async with connect(f"tcp://127.0.0.1:{port}"):
                    pass
            assert info.value.code == "bad_version"

    def test_rejects_static_uri(self):
        """A client URI must be tcp:// or failover:, not a broker's static: list."""
        with pytest.raises(Exception) as info:
            Connection("static:(tcp://127.0.0.1:1)")
        assert "failover" in str(info.value)


def _failover(*uris: str) -> str:
    inner = ",".join(uris)
    return (f"failover:({inner})?randomize=false&initialReconnectDelay=10"
            f"&maxReconnectDelay=50&maxReconnectAttempts=50")


class TestFailover:
    async def test_reconnects_to_second_broker_and_resubscribes(self, nursery, tmp_path):
        """When the first broker goes away the client moves to the second, re-opens its
        subscription there and keeps sending and receiving."""
        with trio.fail_after(15):
            async with trio.open_nursery() as first:
                a, uri_a = await start_node(first, make_config(tmp_path / "a", "a"))
                b, uri_b = await start_node(nursery, make_config(tmp_path / "b", "b"))
                async with connect(_failover(uri_a, uri_b)) as conn:
                    sub = await conn.subscribe("queue://fo")
                    await conn.send("queue://fo", b"one")
                    assert (await sub.receive()).body == b"one"
                    assert conn.broker_hello.broker_id == "a"
                    await a.shutdown()
                    await wait_for(lambda: conn.connected and conn.reconnects == 1)
                    assert conn.broker_hello.broker_id == "b"
                    await wait_for(lambda: b.statistics()["consumers"])
                    await conn.send("queue://fo", b"two", persistent=True)
                    msg = await sub.receive()
                    assert msg.body == b"two"
                    await msg.ack()
                    async with connect(uri_b) as other:
                        await other.send("queue://fo", b"three")
                    assert (await sub.receive()).body == b"three"
                first.cancel_scope.cancel()

    async def test_unconfirmed_sends_are_resent_after_failover(self, nursery, tmp_path):
        """Persistent sends a broker never confirmed are re-sent, same ids, to the
        broker the client fails over to."""
        seen: list = []

        async def black_hole(stream):
            framed = FramedStream(stream)
            await framed.receive_frames()
            await framed.send_frame(Hello(PROTOCOL_VERSION, "broker", broker_id="hole"))
            try:
                while len(seen) < 2:
                    seen.extend(f for f in await framed.receive_frames()
                                if type(f) is Send)
            except trio.EndOfChannel:
                pass
            await stream.aclose()   # lost before confirming anything

        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        hole = f"tcp://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        nursery.start_soon(trio.serve_listeners, black_hole, listeners)
        with trio.fail_after(15):
            b, uri_b = await start_node(nursery, make_config(tmp_path, "b"))
            async with connect(_failover(hole, uri_b)) as conn:
                ids = [await conn.send("queue://resend", str(i).encode(), persistent=True,
                                       confirm=False) for i in range(2)]
                await conn.wait_confirmed()
                assert conn.broker_hello.broker_id == "b"
                assert [f.id for f in seen] == ids
                sub = await conn.subscribe("queue://resend")
                got = [(await sub.receive()).id for _ in range(2)]
                assert got == ids

    async def test_gives_up_after_max_reconnect_attempts(self, nursery, tmp_path):
        """With every broker gone and attempts exhausted, calls raise ConnectionClosed."""
        with trio.fail_after(15):
            async with trio.open_nursery() as inner:
                a, uri_a = await start_node(inner, make_config(tmp_path, "a"))
                uri = (f"failover:({uri_a})?initialReconnectDelay=10&maxReconnectDelay=20"
                       "&maxReconnectAttempts=2")
                async with connect(uri) as conn:
                    await a.shutdown()
                    await wait_for(lambda: conn._closed is not None)
                    with pytest.raises(ConnectionClosed):
                        await conn.send("queue://x", b"late")


class TestWireDetails:
    async def test_persistent_send_sets_receipt_flag(self, nursery):
        """The client asks for a receipt on persistent sends only."""
        frames: list = []

        async def recorder(stream):
            framed = FramedStream(stream)
            await framed.receive_frames()
            await framed.send_frame(Hello(PROTOCOL_VERSION, "broker", broker_id="rec"))
            try:
                while True:
                    batch = await framed.receive_frames()
                    frames.extend(f for f in batch if type(f) is Send)
                    for f in batch:
                        if type(f) is Send and f.persistent:
                            await framed.send_frame(Receipt(f.id))
            except trio.EndOfChannel:
                pass   # the client said bye and closed

        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, recorder, listeners)
        with trio.fail_after(10):
            async with connect(f"tcp://127.0.0.1:{port}") as conn:
                await conn.send("queue://a", b"1")
                await conn.send("queue://a", b"2", persistent=True, ttl=500, priority=7)
            assert [(f.persistent, f.receipt) for f in frames] == [(False, False),
                                                                  (True, True)]
            assert (frames[1].ttl, frames[1].priority) == (500, 7)
