"""A relaying broker writes a forwarded message on before it acks it upstream (issue #14).

A hop of the chain HQ -> region -> store is "read the Forward, write it on"; the
ForwardAck to the upstream link is written after the batch's message-carrying
connections, so the ack's loopback write (which wakes the upstream broker) is not in
front of the message.  Checked on the batch's flush (``BrokerNode._perform``) with two
connections whose streams record the order of their writes."""

from __future__ import annotations

from tests.node.helpers import make_config
from treefed.core.actions import Out
from treefed.node.node import BrokerNode, _Conn
from treefed.wire.frames import Deliver, Forward, ForwardAck


class _Recorder:
    """Stands in for a FramedStream: ``send_now`` takes the frames and records them."""

    pending = b""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def send_now(self, frames: list) -> bool:
        self.log.append((self.name, [type(f).__name__ for f in frames]))
        return True


def _conns(node: BrokerNode, log: list, *names: str) -> list:
    conns = []
    for name in names:
        c = _Conn(name, _Recorder(name, log), "127.0.0.1:1", None)
        node._conns[name] = c
        conns.append(c)
    return conns


async def test_the_forward_leaves_before_the_upstream_ack(tmp_path):
    node = BrokerNode(make_config(tmp_path, "region"))
    log: list = []
    _conns(node, log, "L:up:hq", "L:down:store")
    # the core's order for a forwarded message: ForwardAck upstream, then the Forward
    actions = [Out("L:up:hq", ForwardAck(["m1"])),
               Out("L:down:store", Forward("queue://Q", "m1", ["hq", "region"],
                                           {}, b"x"))]
    await node._perform(actions, 0.0)
    assert log == [("L:down:store", ["Forward"]), ("L:up:hq", ["ForwardAck"])]


async def test_a_batch_delivers_before_it_acks_and_keeps_each_connections_order(tmp_path):
    node = BrokerNode(make_config(tmp_path, "store"))
    log: list = []
    _conns(node, log, "L:up:region", "c1", "L:up:other")
    actions = []
    for i in range(3):
        actions.append(Out("L:up:region", ForwardAck([f"m{i}"])))
        actions.append(Out("c1", Deliver("s1", f"m{i}", "queue://Q", {}, b"x")))
    actions.append(Out("L:up:other", ForwardAck(["o1"])))
    actions.append(Out("L:up:other", Forward("queue://Q", "o2", ["x"], {}, b"x")))
    await node._perform(actions, 0.0)
    # the three acks merged into one frame, written after the deliveries; a connection
    # with a message and an ack keeps its own order and is not held back
    assert log == [("c1", ["Deliver"] * 3), ("L:up:other", ["ForwardAck", "Forward"]),
                   ("L:up:region", ["ForwardAck"])]
