"""The memory engine: real BrokerNodes in one trio process, linked in memory.

Everything of live.py with an in-process frame link (``transport.memory.frame_link``) for
every link and client connection: no sockets, no ports, no encoding — frames cross as
copies, as the codec would hand them over — so thousands of brokers fit in one process
and the autojumping virtual clock never waits on the kernel (issue #14: retail-4x1000).
"""

from __future__ import annotations

from treefed.scenario.engines.live import LiveEngine

__all__ = ["MemoryEngine"]


class MemoryEngine(LiveEngine):
    name = "memory"
    tcp = False
    autojump = 0.0   # nothing outside the process: jump as soon as every task is blocked
