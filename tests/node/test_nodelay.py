"""Every TCP socket on a message's path has Nagle off (issue #14: "find where the 0.3 ms
per hop goes ... Nagle"): a small frame written after an unacknowledged one would
otherwise wait for the peer's delayed ACK (up to 40 ms on Linux).  Checked on the real
sockets of two in-process brokers joined by a tree link and a client of each: the
accepted and the dialed side of the link, both clients' accepted sockets, and the
client library's own socket."""

from __future__ import annotations

import socket

import trio

from tests.node.helpers import make_config, start_node, wait_for
from treefed.client import connect


def _nodelay(stream) -> bool:
    sock = stream.socket
    return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


async def test_every_broker_and_client_socket_has_nodelay(nursery, tmp_path):
    with trio.fail_after(15):
        root, root_uri = await start_node(nursery, make_config(tmp_path / "r", "root"))
        leaf, leaf_uri = await start_node(nursery, make_config(
            tmp_path / "l", "leaf", accept_tree_children=False,
            tree={"node_type": "leaf",
                  "uri": f"failover:({root_uri})?initialReconnectDelay=20"}))
        await wait_for(lambda: leaf.dialers[0].state == "operational")
        async with connect(root_uri) as a, connect(leaf_uri) as b:
            await a.stat()
            await b.stat()
            conns = [c for node in (root, leaf) for c in node._conns.values()]
            # root: the leaf's link + client a; leaf: its dialed link + client b
            assert len(conns) >= 4, [c.id for c in conns]
            for c in conns:
                assert _nodelay(c.framed.stream), c.id
            for client in (a, b):
                assert _nodelay(client._stream.stream)
            # control: the check sees Nagle when it is on
            sock = conns[0].framed.stream.socket
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
            assert not _nodelay(conns[0].framed.stream)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
