"""Scenario engines: the same plan executed four ways (DESIGN §6).

Every engine class is built as ``Engine(plan, mode, recorder, *, progress=None)`` and
``run()`` executes one mode synchronously (the trio engines call ``trio.run``
themselves), returning at least ``{"virtual_s", "frames", "outcome"}``.  They are
imported lazily, so choosing ``replay`` never imports trio.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = ["ENGINES", "engine_class"]

#: engine name -> "module:class"
ENGINES: dict[str, str] = {
    "replay": "treefed.scenario.engines.replay:ReplayEngine",
    "memory": "treefed.scenario.engines.memory:MemoryEngine",
    "tcp": "treefed.scenario.engines.tcp:TcpEngine",
    "procs": "treefed.scenario.engines.procs:ProcsEngine",
}


def engine_class(name: str) -> Any:
    """The engine class called ``name``; ValueError for an unknown name."""
    try:
        module, _, cls = ENGINES[name].partition(":")
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; one of {', '.join(ENGINES)}") from None
    return getattr(import_module(module), cls)
