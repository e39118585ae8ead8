"""The tcp engine: real BrokerNodes in one trio process, linked over loopback TCP.

Everything of live.py with every node listening on 127.0.0.1 (its port kept across
restarts) and every link and client connection a real socket.  The virtual clock jumps
only after all tasks have been blocked for ``autojump`` real seconds, so bytes still in
the kernel's loopback buffers are delivered before time moves on.
"""

from __future__ import annotations

from treefed.scenario.engines.live import LiveEngine

__all__ = ["TcpEngine"]


class TcpEngine(LiveEngine):
    name = "tcp"
    tcp = True
    autojump = 0.02
