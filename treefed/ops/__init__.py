"""Operator tools over running brokers: ``treefed map`` (estate_map) and ``treefed wait``
(wait).  They talk to brokers with the client library only; rendering is pure."""

from treefed.ops.estate_map import EstateMap, discover
from treefed.ops.wait import wait_ready

__all__ = ["EstateMap", "discover", "wait_ready"]
