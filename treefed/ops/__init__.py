"""Operator tools over running brokers: ``treefed map`` (estate_map) and ``treefed wait``
(wait).  They talk to brokers with the client library only; rendering is pure.

The names below are loaded on first use (PEP 562): the ``treefed`` command builds its
parser from ``ops.cli`` in every process, the broker's too, which needs none of them
(idle broker RSS, issue #14)."""

from typing import Any

__all__ = ["EstateMap", "discover", "wait_ready"]

_WHERE = {"EstateMap": "treefed.ops.estate_map", "discover": "treefed.ops.estate_map",
          "wait_ready": "treefed.ops.wait"}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'treefed.ops' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)
