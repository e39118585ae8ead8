"""The client library across faults: the heartbeat watchdog (a broker that goes silent
is left for the next failover endpoint) and the failover audit (no message handed to the
application twice; one handed out before comes flagged redelivered)."""

from __future__ import annotations

import trio

from treefed.client import connect
from treefed.node import BrokerNode
from treefed.persistence import SqliteStore
from treefed.transport.framed import FramedStream
from treefed.transport.streams import serve_tcp
from treefed.wire.frames import PROTOCOL_VERSION, Hello

from tests.node.helpers import make_config, start_node, wait_for


async def _mute_broker(stream: trio.abc.Stream) -> None:
    """Answers the hello (announcing a 0.1 s heartbeat), then never again."""
    framed = FramedStream(stream)
    await framed.receive_frames()
    await framed.send_frames([Hello(PROTOCOL_VERSION, "broker", broker_id="mute",
                                    options={"heartbeat_interval": 0.1})])
    await trio.sleep_forever()


class TestWatchdog:
    async def test_silent_broker_is_left_for_the_next_endpoint(self, nursery, tmp_path):
        """A broker that stops answering (pings included) is given up after two
        intervals and the client fails over to a live one."""
        mute = await nursery.start(serve_tcp, _mute_broker, "127.0.0.1", 0)
        node, uri = await start_node(nursery, make_config(tmp_path, "live"))
        target = (f"failover:(tcp://127.0.0.1:{mute},{uri})"
                  "?randomize=false&initialReconnectDelay=10")
        with trio.fail_after(10):
            async with connect(target) as conn:
                assert conn.broker_hello.broker_id == "mute"
                await wait_for(lambda: conn.reconnects >= 1)
                assert conn.broker_hello.broker_id == "live"
                assert (await conn.stat())["broker"] == "live"


class TestFailoverAudit:
    async def test_message_acked_before_a_reconnect_is_not_handed_out_again(
            self, nursery, tmp_path):
        """The ack of a message dies with its socket; the broker redelivers it after the
        reconnect; the client settles it again instead of handing it out twice."""
        node, uri = await start_node(nursery, make_config(tmp_path))
        with trio.fail_after(10):
            async with connect(f"failover:({uri})?initialReconnectDelay=10") as conn:
                sub = await conn.subscribe("queue://audit", prefetch=10)
                first = await conn.send("queue://audit", b"1", persistent=True)
                msg = await sub.receive()
                await trio.aclose_forcefully(conn._stream.stream)   # the socket dies
                await msg.ack()                     # too late for the old socket
                await wait_for(lambda: conn.connected and conn.reconnects == 1)
                second = await conn.send("queue://audit", b"2", persistent=True)
                nxt = await sub.receive()
                assert (msg.id, nxt.id) == (first, second)
                await nxt.ack()
                stats = await conn.stat()
                assert stats["destinations"]["queue://audit"]["depth"] == 0
                assert stats["destinations"]["queue://audit"]["inflight"] == 0

    async def test_messages_still_queued_at_a_failover_are_handed_out_once(
            self, nursery, tmp_path):
        """Messages delivered to the client but not yet taken by the application when
        the socket dies are redelivered by the broker on the new socket: the copies
        still waiting in the subscription's queue give way to them (in place), so the
        application gets each once, in order, and its acks settle them on the broker.
        (Session 13: the queue handed out the old copy and then the new one.)"""
        node, uri = await start_node(nursery, make_config(tmp_path))
        with trio.fail_after(10):
            async with connect(f"failover:({uri})?initialReconnectDelay=10") as conn:
                sub = await conn.subscribe("queue://queued", prefetch=10)
                ids = [await conn.send("queue://queued", b"%d" % i, persistent=True)
                       for i in range(3)]
                await wait_for(lambda: sub.queued == 3)   # none taken yet
                await trio.aclose_forcefully(conn._stream.stream)   # the socket dies
                await wait_for(lambda: conn.connected and conn.reconnects == 1)
                await wait_for(lambda: conn._stream is not None and sub.queued >= 3)
                fourth = await conn.send("queue://queued", b"3", persistent=True)
                got = []
                for _ in range(4):
                    msg = await sub.receive()
                    got.append(msg.id)
                    await msg.ack()
                assert got == [*ids, fourth]
                with trio.move_on_after(0.2):
                    extra = await sub.receive()
                    raise AssertionError(f"handed out twice: {extra.id}")
                stats = await conn.stat()
                assert stats["destinations"]["queue://queued"]["depth"] == 0
                assert stats["destinations"]["queue://queued"]["inflight"] == 0

    async def test_message_handed_out_before_a_failover_comes_flagged(self, tmp_path):
        """A slave restores a message the old master had delivered (the store does not
        know): the client marks its second coming as redelivered."""
        data = tmp_path / "shared"
        master_scope = trio.CancelScope()
        master_gone = trio.Event()

        async def run_master(task_status=trio.TASK_STATUS_IGNORED) -> None:
            store = SqliteStore(data)
            try:
                with master_scope:
                    async with trio.open_nursery() as nursery:
                        task_status.started(await start_node(nursery, make_config(data),
                                                             store=store))
                        await trio.sleep_forever()
            finally:
                store.close()
                master_gone.set()

        with trio.fail_after(15):
            async with trio.open_nursery() as outer:
                _, uri = await outer.start(run_master)
                async with connect(f"failover:({uri})?initialReconnectDelay=10") as conn:
                    sub = await conn.subscribe("queue://ha", prefetch=10)
                    await conn.send("queue://ha", b"x", persistent=True)
                    first = await sub.receive()
                    assert first.redelivered == 0
                    master_scope.cancel()                  # the master dies, no ack
                    await master_gone.wait()
                    slave = BrokerNode(make_config(data, listen=[uri]),
                                       store=SqliteStore(data))
                    assert slave.restore() == 1
                    await outer.start(slave.serve)
                    again = await sub.receive()
                    assert again.id == first.id and again.redelivered == 1
                    await again.ack()
                outer.cancel_scope.cancel()
        slave.store.close()
