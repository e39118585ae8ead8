"""A lone message crosses a broker in about one task step: its reader's wake-up, which
handles the chunk itself while the site task is idle (node.py, "Inline batches"); the
site task and the writers take none (issue #14: a hop's latency is its task switches;
before, ~3 steps per message: the reader's wake-up, its hand-over to the inbox, the site
task's wake-up).  Counted with a trio Instrument on an in-process BrokerNode: a producer
sends one message at a time, waiting until the consumer has it, so every message is alone."""

from __future__ import annotations

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
                for i in range(N):          # acks wait until the end: one frame in each
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
    # the reader handled each Send itself: the site task slept, and the Deliver was
    # written by the reader's batch directly, so the writers slept too
    assert steps.count("BrokerNode._site_loop") <= 0.1 * N, steps.by_name
    assert steps.count("BrokerNode._writer") <= 0.1 * N, steps.by_name
    # all the broker's tasks together: the reader's wake-up per message
    assert steps.broker() <= 1.3 * N, steps.by_name
