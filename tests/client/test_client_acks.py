"""Cumulative acknowledgement in the client library: which frames acks become (unit, no
socket), and that acking in any order keeps its meaning against a real BrokerNode."""

from __future__ import annotations

import trio

from treefed.client import Connection, connect
from treefed.client.connection import ReceivedMessage, Subscription
from treefed.wire.frames import Ack, Deliver, Nack, Subscribe

from tests.node.helpers import make_config, start_node, wait_for


def delivered(prefetch: int = 100, count: int = 3) -> tuple[Connection, list]:
    """An unconnected Connection whose subscription s1 was delivered m1..m<count>."""
    conn = Connection("tcp://127.0.0.1:1")
    sub = Subscription(conn, "s1", Subscribe("s1", "queue://Q", None, prefetch))
    conn._subs["s1"] = sub
    msgs = []
    for i in range(1, count + 1):
        frame = Deliver("s1", f"m{i}", "queue://Q")
        sub._unsettled.append(frame.msg)
        msgs.append(ReceivedMessage(frame, conn, conn._gen))
    return conn, msgs


class TestAckFrames:
    def test_acks_in_delivery_order_become_one_frame(self):
        """Three acks in order leave as one Ack(upto) naming the last."""
        conn, msgs = delivered()
        for m in msgs:
            m.ack_nowait()
        assert conn._out == [Ack("s1", "m3", True)]

    def test_a_frame_the_writer_took_is_never_changed(self):
        """Once the writer took the queued frame, the next ack starts a new one."""
        conn, msgs = delivered()
        msgs[0].ack_nowait()
        taken, conn._out = conn._out, []
        msgs[1].ack_nowait()
        assert taken == [Ack("s1", "m1", True)] and conn._out == [Ack("s1", "m2", True)]

    def test_out_of_order_ack_goes_alone_and_is_skipped_later(self):
        """Acking m2 before m1 sends m2 on its own; m1 and m3 then share one frame."""
        conn, msgs = delivered()
        msgs[1].ack_nowait()
        msgs[0].ack_nowait()
        msgs[2].ack_nowait()
        assert conn._out == [Ack("s1", "m2"), Ack("s1", "m3", True)]

    def test_nack_goes_alone_and_later_acks_do_not_reach_back_over_it(self):
        """A nack between acks splits the run: the frame before it is not extended."""
        async def scenario():
            conn, msgs = delivered()
            msgs[0].ack_nowait()
            await msgs[1].nack()
            msgs[2].ack_nowait()
            return conn._out
        out = trio.run(scenario)
        assert out == [Ack("s1", "m1", True), Nack("s1", "m2"), Ack("s1", "m3", True)]

    def test_half_the_prefetch_closes_the_frame(self):
        """With prefetch 4 a frame covers at most 2 messages, so credit flows back while
        the rest of a burst is worked through."""
        conn, msgs = delivered(prefetch=4, count=4)
        for m in msgs:
            m.ack_nowait()
        assert conn._out == [Ack("s1", "m2", True), Ack("s1", "m4", True)]

    def test_ack_from_an_older_socket_is_dropped(self):
        """After a reconnect the broker requeued the message: its ack sends nothing."""
        conn, msgs = delivered()
        conn._gen += 1
        msgs[0].ack_nowait()
        assert conn._out == []


class TestAcksAgainstABroker:
    async def test_acks_in_any_order_settle_everything_once(self, nursery, tmp_path):
        """Acking each window in reverse order settles all 40 messages, none redelivered."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path))
            async with connect(uri) as conn:
                sub = await conn.subscribe("queue://acks", prefetch=8)
                for i in range(40):
                    await conn.send("queue://acks", str(i))
                seen = []
                while len(seen) < 40:
                    window = [await sub.receive()]
                    while sub.queued and len(window) < 5:
                        window.append(await sub.receive())
                    for msg in reversed(window):
                        msg.ack_nowait()
                    seen += window
                assert sorted(int(m.body) for m in seen) == list(range(40))
                assert all(m.redelivered == 0 for m in seen)

                def settled():
                    q = node.statistics()["destinations"]["queue://acks"]
                    return q["dequeued"] == 40 and q["inflight"] == 0 and q["depth"] == 0
                await wait_for(settled)

    async def test_a_held_message_stays_in_flight(self, nursery, tmp_path):
        """Acking every message but the first leaves exactly that one unacked at the
        broker; acking it later settles it."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path))
            async with connect(uri) as conn:
                sub = await conn.subscribe("queue://held", prefetch=10)
                for i in range(5):
                    await conn.send("queue://held", str(i))
                msgs = [await sub.receive() for _ in range(5)]
                for msg in msgs[1:]:
                    msg.ack_nowait()

                def queue():
                    return node.statistics()["destinations"]["queue://held"]
                await wait_for(lambda: queue()["dequeued"] == 4)
                assert queue()["inflight"] == 1
                msgs[0].ack_nowait()
                await wait_for(lambda: queue()["inflight"] == 0 and queue()["dequeued"] == 5)

    async def test_nacked_message_returns_and_acked_ones_do_not(self, nursery, tmp_path):
        """Among cumulative acks a nacked message is redelivered, and only it."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path))
            async with connect(uri) as conn:
                sub = await conn.subscribe("queue://nacks", prefetch=10)
                for i in range(6):
                    await conn.send("queue://nacks", str(i))
                first = [await sub.receive() for _ in range(6)]
                for msg in first:
                    if msg.body == b"3":
                        await msg.nack()
                    else:
                        msg.ack_nowait()
                again = await sub.receive()
                assert (again.body, again.redelivered) == (b"3", 1)
                again.ack_nowait()
                await wait_for(lambda: node.statistics()["destinations"]["queue://nacks"]
                               ["dequeued"] == 6)
                assert sub.queued == 0

    async def test_burst_larger_than_the_prefetch_never_stalls(self, nursery, tmp_path):
        """A consumer with prefetch 4 that only receives and acks gets 300 messages: the
        credit its acks return keeps the broker delivering."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path))
            async with connect(uri) as producer, connect(uri) as consumer:
                sub = await consumer.subscribe("queue://burst", prefetch=4)
                for i in range(300):
                    await producer.send("queue://burst", b"x")
                for _ in range(300):
                    (await sub.receive()).ack_nowait()
                await wait_for(lambda: node.statistics()["destinations"]["queue://burst"]
                               ["dequeued"] == 300)
