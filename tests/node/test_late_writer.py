"""A BrokerNode serving an in-process frame link starts its writer task only when the
connection closes (node/late_writer.py, issue #14): frames still go out in order, a
refusal's error before the end, shutdown's Bye before the end."""

from __future__ import annotations

import trio

from treefed.node import BrokerNode
from treefed.transport.memory import frame_link
from treefed.wire.frames import PROTOCOL_VERSION, Bye, Error, Hello, Receipt, Send, Subscribe

from tests.node.helpers import make_config


async def _frames_until_end(end) -> list:
    got: list = []
    try:
        while True:
            got += await end.receive_frames()
    except (trio.EndOfChannel, trio.ClosedResourceError):
        return got


def _writers(node_tasks: list) -> int:
    return sum(1 for t in node_tasks if t.name.endswith("._writer"))


async def test_no_writer_task_while_open_then_bye_and_end_on_shutdown(nursery, tmp_path):
    node = BrokerNode(make_config(tmp_path, listen=[]))
    await nursery.start(node.serve)
    near, far = frame_link()
    nursery.start_soon(node.serve_stream, far)
    await near.send_frames([Hello(PROTOCOL_VERSION, "client", name="app"),
                            Subscribe("s1", "queue://q"),
                            Send("queue://q", "m1", {}, b"x", True, receipt=True)])
    got = await near.receive_frames()
    while not any(type(f) is Receipt for f in got):
        got += await near.receive_frames()
    assert type(got[0]) is Hello
    assert _writers(list(_walk(trio.lowlevel.current_root_task()))) == 0
    with trio.fail_after(1):   # virtual time: the Bye goes at once, no 5 s timeout
        nursery.start_soon(node.shutdown)
        rest = await _frames_until_end(near)
    assert [type(f) for f in rest][-1] is Bye


async def test_a_refused_hello_gets_its_error_before_the_end(nursery, tmp_path):
    node = BrokerNode(make_config(tmp_path, listen=[]))
    await nursery.start(node.serve)
    near, far = frame_link()
    nursery.start_soon(node.serve_stream, far)
    await near.send_frames([Hello(PROTOCOL_VERSION + 99, "client", name="app")])
    with trio.fail_after(10):
        got = await _frames_until_end(near)
    assert [type(f) for f in got] == [Error]


def _walk(task):
    yield task
    for n in task.child_nurseries:
        for t in n.child_tasks:
            yield from _walk(t)


async def test_the_space_watcher_starts_only_when_the_store_is_full(nursery, tmp_path):
    """``_watch_space`` sleeps until a commit finds the store full: it is started then,
    not with every node (tests/node/test_node_faults.py: refusal and recovery)."""
    node = BrokerNode(make_config(tmp_path, listen=[]))
    await nursery.start(node.serve)

    def watchers() -> int:
        return sum(1 for t in _walk(trio.lowlevel.current_root_task())
                   if t.name.endswith("._watch_space"))

    assert watchers() == 0
    node.store_full = True
    node._space_wanted.set()
    await trio.lowlevel.checkpoint()
    assert watchers() == 1
    node._space_wanted.set()   # a real event now: no second watcher
    await trio.lowlevel.checkpoint()
    assert watchers() == 1


async def test_conn_tasks_acts_as_the_connections_nursery(nursery):
    """ConnTasks: its cancel scope cancels the block, its one task runs in the host
    nursery and is cancelled when the block ends (as a nursery's child would be)."""
    from treefed.node.late_writer import ConnTasks

    ran: list = []

    async def child():
        ran.append("started")
        try:
            await trio.sleep_forever()
        finally:
            ran.append("cancelled")

    async with ConnTasks(nursery) as tasks:
        tasks.start_soon(child)
        await trio.sleep(0.01)
        tasks.cancel_scope.cancel()
        await trio.sleep_forever()   # cancelled by its own scope, which catches it
    await trio.sleep(0.01)
    assert ran == ["started", "cancelled"]
