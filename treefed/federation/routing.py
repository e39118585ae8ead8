"""Routing: where interest goes -- the one table both connector policies read.

Theory of operation
-------------------
Every link of a Site sits in one *lane*: ``mesh`` (a classic network connector),
``parent`` (our tree connector) or ``child`` (a tree child that dialed us).  Interest
reaches a Site from a lane, or from a local consumer (``local``), and is offered to the
links of the lanes this table lists -- never back to the link it came over, and each
link's policy may still refuse one (``Drop``) or skip it silently (``SKIP``).

``ROUTES[kind][from]`` is the half of the table one connector kind contributes:

* mesh (DESIGN §4.1): from anywhere to every other mesh link; flooding is bounded by
  ``consumer_ttl`` and the loop check, not by the table;
* tree (AMQ-2875, DESIGN §4.2): local interest goes up and down, interest from a child
  up only (siblings never learn of each other's consumers -- not sending is the saving,
  so nothing is logged), interest from the parent down only, to every child.

A Site may run both kinds at once (a tree node with a mesh link to a partner), so it
reads ``ROUTES_ALL``: both halves merged, mesh lanes first.  ``ROUTES_UP`` is the same
table without the downward lane, used for interest whose kind a tree Site does not
advertise down (``TreeSettings.advertise_down``): with ``route_unknown_up`` a queue
message climbs to where the consumer is anyway, so telling the children is pure spill.

Nothing here has state; the tables are read-only mappings.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

__all__ = ["LANES", "SOURCES", "ROUTES", "ROUTES_ALL", "ROUTES_UP", "DOWN", "lanes_for"]

#: lanes a link may sit in
LANES = ("mesh", "parent", "child")
#: where interest may come from: a local consumer or one of the lanes
SOURCES = ("local", *LANES)
#: the lane that leads down the tree
DOWN = "child"



def _frozen(table: Mapping) -> Mapping[str, tuple[str, ...]]:
    return MappingProxyType(dict(table))


_TREE = _frozen({"local": ("parent", "child"), "child": ("parent",), "parent": ("child",),
                 "mesh": ("parent", "child")})
_MESH = _frozen({"local": ("mesh",), "mesh": ("mesh",), "parent": ("mesh",),
                 "child": ("mesh",)})


#: connector kind -> (where interest came from -> lanes it is offered to)
ROUTES: Mapping[str, Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {"mesh": _MESH, "tree": _TREE})

#: both kinds merged: what a Site with links of both kinds does
ROUTES_ALL: Mapping[str, tuple[str, ...]] = _frozen(
    {src: _MESH[src] + _TREE[src] for src in SOURCES})

#: the same without the downward lane (interest not advertised down)
ROUTES_UP: Mapping[str, tuple[str, ...]] = _frozen(
    {src: tuple(lane for lane in ROUTES_ALL[src] if lane != DOWN) for src in SOURCES})


def lanes_for(source: str, *, down: bool = True) -> tuple[str, ...]:
    """Lanes interest from ``source`` ("local" or a lane) is offered to."""
    return (ROUTES_ALL if down else ROUTES_UP)[source]
