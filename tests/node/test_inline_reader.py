"""A reader hands its chunk to the Site itself when the site task is idle (issue #14:
a lone message crossed a broker in three task steps -- the reader's wake-up, its
hand-over to the inbox, the site task's wake-up -- each a scheduler pass).  Counted with
a trio Instrument on an in-process BrokerNode; plus the two things the shortcut must not
break: order on a connection, and a timer the inline batch sets."""

from __future__ import annotations

import time

import trio

from tests.node.helpers import TaskSteps, make_config, start_node
from treefed.client import connect

N = 200


async def test_a_lone_message_crosses_the_broker_in_about_one_task_step(tmp_path):
    steps = TaskSteps()
    trio.lowlevel.add_instrument(steps)
    try:
        async with trio.open_nursery() as nursery:
            node, uri = await start_node(nursery, make_config(tmp_path))
            async with connect(uri) as consumer, connect(uri) as producer:
                sub = await consumer.subscribe("queue://Lone", prefetch=N + 10)
                await producer.send("queue://Lone", b"warm", persistent=False)
                (await sub.receive()).ack_nowait()
                await trio.sleep(0.2)
                batches = node.batches
                steps.on = True
                got = []
                for _ in range(N):
                    await producer.send("queue://Lone", b"x", persistent=False,
                                        confirm=False)
                    await producer.flush()
                    got.append(await sub.receive())
                await trio.sleep(0.2)
                steps.on = False
                assert node.batches - batches >= N     # every Send was handled as a batch
                for msg in got:
                    msg.ack_nowait()
            nursery.cancel_scope.cancel()
    finally:
        trio.lowlevel.remove_instrument(steps)
    # before: ~3 per message (reader 2 + site task 1); now the reader's wake-up only
    assert steps.broker() <= 1.3 * N, steps.by_name
    assert steps.by_name.get("treefed.node.node.BrokerNode._site_loop", 0) <= 0.1 * N, \
        steps.by_name


async def test_order_on_each_connection_is_kept_while_readers_and_site_task_mix(tmp_path):
    """Three pipelining producers: batches alternate between the site task (queued
    chunks) and readers handling their own; each producer's messages arrive in order."""
    n = 3000
    async with trio.open_nursery() as nursery:
        node, uri = await start_node(nursery, make_config(tmp_path))
        async with connect(uri) as consumer:
            sub = await consumer.subscribe("queue://Order", prefetch=500)

            async def produce(name: str) -> None:
                async with connect(uri) as producer:
                    for i in range(n):
                        await producer.send("queue://Order", b"x", headers={"p": name, "i": i},
                                            persistent=False, confirm=False)
                        if i % 97 == 0:
                            await producer.flush()
                            await trio.sleep(0)
                    await producer.flush()

            seen: dict[str, int] = {}
            async with trio.open_nursery() as inner:
                for name in ("a", "b", "c"):
                    inner.start_soon(produce, name)
                with trio.fail_after(60):
                    for _ in range(3 * n):
                        msg = await sub.receive()
                        p, i = msg.headers["p"], msg.headers["i"]
                        assert i == seen.get(p, -1) + 1, (p, i, seen.get(p))
                        seen[p] = i
                        msg.ack_nowait()
        nursery.cancel_scope.cancel()
    assert seen == {"a": n - 1, "b": n - 1, "c": n - 1}


async def test_a_timer_set_by_a_readers_batch_wakes_the_site_task(tmp_path):
    """The site task waits without a deadline (nothing expires); a message with a TTL
    handled by its reader sets the Site's next deadline: the site task must wake for it
    then, not at the next input (fails without moving ``_site_wait``)."""
    async with trio.open_nursery() as nursery:
        node, uri = await start_node(nursery, make_config(tmp_path))
        async with connect(uri) as producer:
            await trio.sleep(0.2)   # hello handled, the site task idle again
            assert node.site.next_deadline() is None
            await producer.send("queue://Ttl", b"x", persistent=False, ttl=300)
            t0 = time.monotonic()
            with trio.fail_after(5):
                while node.site.broker.statistics()["dropped"].get("expired", 0) < 1:
                    await trio.sleep(0.02)
            assert time.monotonic() - t0 < 2.0
        nursery.cancel_scope.cancel()


async def test_a_burst_goes_to_the_site_task_and_a_lone_frame_does_not(tmp_path):
    """A chunk of more than INLINE_MAX_FRAMES frames is queued for the site task as before
    (it folds several readers' chunks into one batch); a lone Send is handled by its
    reader.  Counted by wrapping ``_inline_batch`` on a real node with a raw peer that
    writes 50 Sends in one write, then one."""
    from tests.node.helpers import RawPeer
    from treefed.node.node import INLINE_MAX_FRAMES
    from treefed.wire.codec import encode_many
    from treefed.wire.frames import Send

    async with trio.open_nursery() as nursery:
        node, uri = await start_node(nursery, make_config(tmp_path))
        inline: list[int] = []
        handle = node._inline_batch

        async def counting(c, frames):
            inline.append(len(frames))
            await handle(c, frames)

        node._inline_batch = counting
        async with connect(uri) as consumer:
            sub = await consumer.subscribe("queue://Burst", prefetch=100)
            await trio.sleep(0.2)
            peer = await RawPeer.open(uri)
            inline.clear()
            await peer.send_raw(encode_many([Send("queue://Burst", f"b:{i}", body=b"x")
                                             for i in range(50)]))
            with trio.fail_after(10):
                for _ in range(50):
                    (await sub.receive()).ack_nowait()
            assert not [n for n in inline if n > INLINE_MAX_FRAMES], inline
            await trio.sleep(0.2)
            inline.clear()
            await peer.send_raw(encode_many([Send("queue://Burst", "b:lone", body=b"x")]))
            with trio.fail_after(10):
                assert (await sub.receive()).id == "b:lone"
            assert 1 in inline, inline
            await peer.aclose()
        nursery.cancel_scope.cancel()
