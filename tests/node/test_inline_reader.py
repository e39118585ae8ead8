"""A reader hands its chunk to the Site itself when the site task is idle (issue #14; the
step count of a lone message is tests/node/test_task_steps.py): what the shortcut must not
break -- order on a connection, a timer the inline batch sets -- and that a burst still
goes to the site task."""

from __future__ import annotations

import time

import trio

from tests.node.helpers import make_config, start_node
from treefed.client import connect


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
