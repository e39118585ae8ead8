"""The memory engine: real BrokerNodes in one trio process, linked by in-memory streams.

Everything of live.py with ``memory_stream_pair`` for every link and client connection:
no sockets, no ports, so thousands of brokers fit in one process and the autojumping
virtual clock never waits on the kernel.
"""

from __future__ import annotations

from treefed.scenario.engines.live import LiveEngine

__all__ = ["MemoryEngine"]


class MemoryEngine(LiveEngine):
    name = "memory"
    tcp = False
    autojump = 0.0   # nothing outside the process: jump as soon as every task is blocked
