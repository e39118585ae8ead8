"""Estate topologies: HQ -> optional layers -> regions -> stores, as a tree of broker ids.

Theory of operation
-------------------
``build(TopologySpec)`` generates the tree a scenario runs on.  Every count is *per
parent*: ``layers=[LayerSpec("country", 4)]``, ``regions=4``, ``stores_per_region=60``
is HQ -> 4 countries -> 4 regions each (16) -> 60 stores each (960).

Broker ids are stable and readable: the root is ``hq``; layer brokers are
``<layer>-<n>`` and regions ``region-<n>``, numbered from 1 across the whole layer;
stores are ``store-r<region n>-<nnnn>``, numbered from 1 within their region (zero-padded
to at least four digits).  Roles follow the tree connector: the root is ``root``, anything
with children ``branch``, stores ``leaf``.  ``kind`` says which level a broker was
generated as (``hq``, a layer name, ``region``, ``store``), ``region`` the region it
belongs to (None above the regions).

A Topology is immutable: ``insert_layer`` returns a new one in which a parent's children
are shared out, in order and in near-equal contiguous blocks, among new brokers of a new
layer (the reconfigure scenario: depth 2 becomes depth 3 under a running estate).
``brokers`` is in breadth-first order, parents before children, so engines can start
brokers in list order.  Pure: no I/O, no randomness; bad arguments raise ValueError.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, replace

__all__ = ["LayerSpec", "TopologySpec", "BrokerSpec", "Topology", "build", "ROOT_ID"]

ROOT_ID = "hq"


@dataclass(frozen=True, slots=True)
class LayerSpec:
    name: str                # id prefix and kind of the layer's brokers, e.g. "country"
    count: int               # brokers per parent


@dataclass(frozen=True, slots=True)
class TopologySpec:
    regions: int                         # regions per parent (per HQ, or per last layer)
    stores_per_region: int
    layers: tuple[LayerSpec, ...] = ()   # between HQ and the regions, outermost first


@dataclass(frozen=True, slots=True)
class BrokerSpec:
    id: str
    role: str                # "root" | "branch" | "leaf" (tree connector node type)
    depth: int               # hops from the root
    parent: str | None       # None for the root
    region: str | None       # the region this broker is or belongs to
    kind: str = "store"      # "hq", a layer name, "region" or "store"


class Topology:
    """A rooted tree of brokers; see the module docstring."""

    __slots__ = ("brokers", "_by_id", "_children")

    def __init__(self, brokers: Iterable[BrokerSpec]) -> None:
        self.brokers: list[BrokerSpec] = list(brokers)
        self._by_id = {b.id: b for b in self.brokers}
        if len(self._by_id) != len(self.brokers):
            raise ValueError("duplicate broker id")
        self._children: dict[str, list[str]] = {b.id: [] for b in self.brokers}
        for b in self.brokers:
            if b.parent is not None:
                self._children[b.parent].append(b.id)

    # ------------------------------------------------------------------ queries

    @property
    def root(self) -> BrokerSpec:
        return self.brokers[0]

    @property
    def depth(self) -> int:
        """Depth of the deepest broker (HQ -> regions -> stores is 2)."""
        return max(b.depth for b in self.brokers)

    def __len__(self) -> int:
        return len(self.brokers)

    def __contains__(self, broker_id: object) -> bool:
        return broker_id in self._by_id

    def broker(self, broker_id: str) -> BrokerSpec:
        return self._by_id[broker_id]

    def children(self, broker_id: str) -> list[str]:
        return list(self._children[broker_id])

    def path_to_root(self, broker_id: str) -> list[str]:
        """``[broker_id, parent, ..., root]``."""
        path = [broker_id]
        parent = self._by_id[broker_id].parent
        while parent is not None:
            path.append(parent)
            parent = self._by_id[parent].parent
        return path

    def links(self) -> list[tuple[str, str]]:
        """Every (parent, child) edge, children in ``brokers`` order."""
        return [(b.parent, b.id) for b in self.brokers if b.parent is not None]

    def of_kind(self, kind: str) -> list[BrokerSpec]:
        return [b for b in self.brokers if b.kind == kind]

    def match(self, pattern: str) -> list[str]:
        """Broker ids equal to ``pattern`` or matching it as a glob (``store-r1-*``)."""
        if pattern in self._by_id:
            return [pattern]
        return [b.id for b in self.brokers if fnmatch.fnmatchcase(b.id, pattern)]

    # ------------------------------------------------------------------ reshaping

    def insert_layer(self, name: str, count: int, *, parent: str = ROOT_ID) -> Topology:
        """A new topology with ``count`` brokers ``<name>-<n>`` between ``parent`` and its
        children, which are shared among them in order, in near-equal blocks."""
        if parent not in self._by_id:
            raise ValueError(f"no broker {parent!r}")
        below = self._children[parent]
        if not 1 <= count <= len(below):
            raise ValueError(f"count must be between 1 and {len(below)} (the children of "
                             f"{parent}), got {count}")
        first = 1 + sum(1 for b in self.brokers if b.kind == name)
        new_ids = [f"{name}-{first + i}" for i in range(count)]
        if clash := [i for i in new_ids if i in self._by_id]:
            raise ValueError(f"broker id {clash[0]!r} already exists")
        new_parent = {child: new_ids[i * count // len(below)] for i, child in enumerate(below)}
        moved = set(self._subtree(parent)) - {parent}
        depth = self._by_id[parent].depth + 1
        out: dict[str, BrokerSpec] = {}
        for b in self.brokers:
            if b.id in moved:
                b = replace(b, depth=b.depth + 1, parent=new_parent.get(b.id, b.parent))
            out[b.id] = b
        for layer_id in new_ids:
            out[layer_id] = BrokerSpec(layer_id, "branch", depth, parent, None, name)
        return Topology(_breadth_first(out))

    def _subtree(self, broker_id: str) -> list[str]:
        out, todo = [], [broker_id]
        while todo:
            b = todo.pop()
            out.append(b)
            todo.extend(self._children[b])
        return out


def _breadth_first(by_id: dict[str, BrokerSpec]) -> list[BrokerSpec]:
    """Order brokers root first, each level in the previous level's order."""
    children: dict[str | None, list[BrokerSpec]] = {}
    for b in by_id.values():
        children.setdefault(b.parent, []).append(b)
    order = list(children[None])
    for b in order:  # the list grows while we walk it: a queue without popping
        order.extend(children.get(b.id, ()))
    return order


def build(spec: TopologySpec) -> Topology:
    """Generate the estate described by ``spec`` (see the module docstring)."""
    if spec.regions < 1 or spec.stores_per_region < 1:
        raise ValueError("regions and stores_per_region must be >= 1")
    brokers = [BrokerSpec(ROOT_ID, "root", 0, None, None, "hq")]
    level = [ROOT_ID]
    for depth, layer in enumerate(spec.layers, 1):
        if layer.count < 1:
            raise ValueError(f"layer {layer.name!r}: count must be >= 1")
        nxt = []
        for parent in level:
            for _ in range(layer.count):
                bid = f"{layer.name}-{len(nxt) + 1}"
                brokers.append(BrokerSpec(bid, "branch", depth, parent, None, layer.name))
                nxt.append(bid)
        level = nxt
    depth = len(spec.layers) + 1
    regions: list[str] = []
    for parent in level:
        for _ in range(spec.regions):
            rid = f"region-{len(regions) + 1}"
            regions.append(rid)
            brokers.append(BrokerSpec(rid, "branch", depth, parent, rid, "region"))
    width = max(4, len(str(spec.stores_per_region)))
    for n, rid in enumerate(regions, 1):
        for s in range(1, spec.stores_per_region + 1):
            brokers.append(BrokerSpec(f"store-r{n}-{s:0{width}d}", "leaf", depth + 1, rid, rid,
                                      "store"))
    return Topology(brokers)

