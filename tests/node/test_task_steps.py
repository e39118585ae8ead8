"""A lone message through a broker costs the site task one step and the writers none
(issue #14: a hop's latency is its task switches).  Counted with a trio Instrument on an
in-process BrokerNode: a producer sends one message at a time, waiting until the consumer
has it, so every message is alone."""

from __future__ import annotations

import trio

from tests.node.helpers import TaskSteps, make_config, start_node
from treefed.client import connect

N = 200


async def test_a_lone_message_costs_one_site_step_and_no_writer_step(tmp_path):
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
                steps.on = True
                got = []
                for i in range(N):          # acks wait until the end: one frame in each
                    await producer.send("queue://Lone", b"x", persistent=False,
                                        confirm=False)
                    await producer.flush()
                    got.append(await sub.receive())
                await trio.sleep(0.2)
                steps.on = False
                for msg in got:
                    msg.ack_nowait()
            nursery.cancel_scope.cancel()
    finally:
        trio.lowlevel.remove_instrument(steps)
    site = steps.count("BrokerNode._site_loop")
    writers = steps.count("BrokerNode._writer")
    # per message the site task wakes once, for the Send; before issue #14 it also
    # yielded once per batch in ``async with`` its lock (2 steps per message)
    assert site <= 1.3 * N, steps.by_name
    # the Deliver is written by the site task itself: the broker's writers sleep
    assert writers <= 0.1 * N, steps.by_name
    # the reader of the producer's connection: two steps per Send (its receive, and the
    # checkpoint handing the chunk to the site task: kept so one batch holds one chunk
    # per reader -- without it a pipelining client's answers overflowed, see node.py)
    readers = steps.count("_run_handler")
    assert readers <= 2.3 * N, steps.by_name
