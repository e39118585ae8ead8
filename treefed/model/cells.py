"""Cells: an estate folded so that alike brokers are counted, not listed.

Theory of operation
-------------------
Most of a store estate is leaves that look the same: stores with one link to their
region, the same connector settings, and the same consumers up to their own name
(``queue://Store.{broker}.Incoming``).  Interest treats such stores identically, so the
model propagates one row for all of them and carries *how many* concrete instances the
row stands for.  A **cell** is either one broker, or a set of leaves (exactly one link)
under the same peer with equal link settings, equal tree position and an equal
workload *signature* -- their consumer groups with the broker's own id replaced by
``{broker}``.  A leaf whose consumers' destinations are filtered differently from its
cell-mates' by any connector in the estate (a filter naming one store) is split off.
A leaf's *own* connector naming the leaf (the tuned mesh: each store limited to its own
queue) is compared relative to the leaf (``_relative``: the id written ``{broker}``), so
such stores still share a cell; the filter verdicts then come in two kinds, for the
member's own destination and for a cell-mate's (``group_flags``, ``Folded.owner``), and
``_relative_ok`` checks once that no other verdict can depend on which member it is.

Because a leaf has one link, a route that enters a leaf cell ends there, so a path
through cells names a leaf cell only as its origin; that is what keeps counting exact:
going down from the parent into the origin's own cell reaches every member but the
origin (``n - 1``), into any other leaf cell all ``n`` members.

``fold(estate, groups)`` returns the cells, the quotient link ends (``QEnd``) and the
groups per origin cell (``CellGroup``); the Spark job propagates over these tables.
Pure: no I/O.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Sequence

from treefed.core.destinations import is_topic
from treefed.model.exact import Estate, Group, NotModelled, _End, _Shape

__all__ = ["Cell", "QEnd", "CellGroup", "Folded", "fold", "LANE_ORDER", "ROUTES"]

#: emission order of lanes in ``Site._advertise`` (mesh, then parent, then child).
LANE_ORDER = {"mesh": 0, "parent": 1, "child": 2}
#: where interest came from -> lanes it is offered to.
ROUTES = {"local": ("mesh", "parent", "child"), "mesh": ("mesh", "parent", "child"),
          "parent": ("mesh", "child"), "child": ("mesh", "parent")}
_SLOTS = 1 << 20   # rank element = lane order * _SLOTS + link index


@dataclass(frozen=True, slots=True)
class Cell:
    id: int
    members: tuple[str, ...]
    leaf: bool                    # a folded set of leaves (every member has one link)
    ancestors: tuple[int, ...]    # tree ancestors' cells
    descendants: tuple[int, ...]  # tree descendants' cells


@dataclass(frozen=True, slots=True)
class QEnd:
    """One link end of a cell (a leaf cell's one link; a broker's link, or its links to
    all members of one leaf cell)."""

    id: int
    cell: int
    peer_cell: int
    peer_qend: int
    lane: str
    kind: str
    pos: int                      # rank element: emission order at the sender
    advertises: bool
    accepts: bool
    forwards: bool
    duplex: bool
    ttl: int                      # consumer_ttl, -1 unlimited
    sid: int                      # index into Folded.settings
    fan: int                      # concrete ends this stands for at one member


@dataclass(frozen=True, slots=True)
class CellGroup:
    """``count`` consumers of ``template`` at every member of cell ``origin``."""

    id: int
    origin: int
    template: str                 # the destination, ``{broker}`` for the member's id
    selector: str | None
    count: int
    templated: bool               # the destination differs per member

    def dst(self, member: str) -> str:
        return self.template.replace("{broker}", member) if self.templated else self.template


@dataclass
class Folded:
    cells: list[Cell]
    qends: list[QEnd]
    groups: list[CellGroup]
    settings: list                # LinkSettings per sid
    cell_of: dict[str, int]
    # sid -> the leaf-cell member whose own connector these settings are, where they
    # name that member (a per-store filter, ``_relative``): verdicts then differ for
    # the member's own destinations and its cell-mates' (``group_flags``' self columns)
    owner: dict[int, str] = field(default_factory=dict)

    def brokers(self) -> int:
        return sum(len(c.members) for c in self.cells)


def _template(dst: str, member: str) -> str:
    return dst.replace(member, "{broker}") if member in dst else dst


def _signature(groups: list[Group], member: str) -> tuple:
    return tuple(sorted((_template(g.dst, member), g.selector or "", g.count)
                        for g in groups))


def fold(estate: Estate, groups: Sequence[Group], *, cells: bool = True) -> Folded:
    """Fold ``estate`` into cells (``cells=False``: one cell per broker)."""
    shape = _Shape(estate)
    by_broker: dict[str, list[Group]] = defaultdict(list)
    for g in groups:
        if g.broker not in shape.ends:
            raise ValueError(f"group {g.name}: unknown broker {g.broker}")
        by_broker[g.broker].append(g)
    settings: list = []
    sid_of: dict = {}

    def sid(s) -> int:
        if s not in sid_of:
            sid_of[s] = len(settings)
            settings.append(s)
        return sid_of[s]

    relative = cells and _relative_ok(estate, by_broker, shape)
    # candidate leaf cells: one link, same peer / settings / side / position / workload
    # (settings relative to the member: a per-store filter naming the store itself)
    buckets: dict[tuple, list[str]] = defaultdict(list)
    singles: list[str] = []
    for b in estate.brokers:
        ends = shape.ends[b]
        if not cells or len(ends) != 1:
            singles.append(b)
            continue
        e = ends[0]
        key = (e.peer, e.lane, e.accepts, e.advertises, e.forwards,
               _relative(e.settings, b) if relative else e.settings,
               estate.tree.get(b), b in estate.accepts_children,
               _signature(by_broker.get(b, []), b))
        buckets[key].append(b)
    members_of: list[tuple[str, ...]] = [(b,) for b in singles]
    # connectors whose filters name no member of a candidate cell: checked per member
    # (``_uniform``); member-relative ones are uniform by ``_relative_ok``
    distinct = list(dict.fromkeys(
        l.settings for l in estate.links
        if not (relative and len(shape.ends[l.dialer]) == 1 and _names(l.settings, l.dialer))))
    for key, members in buckets.items():
        if len(members) == 1 or not _uniform(members, by_broker, distinct, shape):
            members_of += [(m,) for m in members]
        else:
            members_of.append(tuple(members))
    # cells in broker order of their first member (stable, readable ids)
    order = {b: i for i, b in enumerate(estate.brokers)}
    members_of.sort(key=lambda ms: order[ms[0]])
    cell_of = {m: i for i, ms in enumerate(members_of) for m in ms}
    cell_list = []
    for i, ms in enumerate(members_of):
        rep = ms[0]
        cell_list.append(Cell(
            i, ms, len(ms) > 1,
            tuple(sorted({cell_of[a] for a in shape.ancestors[rep]})),
            tuple(sorted({cell_of[d] for d in shape.descendants.get(rep, ())}))))
    # quotient ends: per cell, its representative's ends, those to one leaf cell merged
    qends: list[QEnd] = []
    key_of: dict[tuple, int] = {}       # (cell, link index of rep end / peer cell) -> id
    pending = []
    for c in cell_list:
        rep = c.members[0]
        seen_peer_cells: dict[int, int] = {}
        for e in shape.ends[rep]:
            pc = cell_of[e.peer]
            peer_cell = cell_list[pc]
            if peer_cell.leaf:
                if pc in seen_peer_cells:
                    continue      # one quotient end for all links into that leaf cell
                fan = len(peer_cell.members)
                seen_peer_cells[pc] = e.index
            else:
                fan = 1
            qid = len(pending)
            key_of[(c.id, pc, e.index if not peer_cell.leaf else -1)] = qid
            pending.append((qid, c, e, pc, fan))
    owner: dict[int, str] = {}
    for qid, c, e, pc, fan in pending:
        peer_cell = cell_list[pc]
        # the link's settings are its dialer's; a leaf cell's member dialed it
        for cell, member in ((c, e.broker), (peer_cell, e.peer)):
            if cell.leaf and e.settings.kind == "mesh" and _names(e.settings, member):
                owner[sid(e.settings)] = member
        # the peer's end back to us: our cell is a leaf cell -> the peer merged its
        # links to us under index -1; otherwise the same link index
        back = key_of.get((pc, c.id, -1 if c.leaf else e.index))
        if back is None:
            raise NotModelled(f"no return end for {c.members[0]} -> {e.peer}")
        pos = LANE_ORDER[e.lane] * _SLOTS + e.index
        qends.append(QEnd(qid, c.id, pc, back, e.lane, e.kind, pos, e.advertises,
                          e.accepts, e.forwards, e.settings.duplex,
                          e.settings.consumer_ttl, sid(e.settings), fan))
    # groups per origin cell, from the representative
    cgroups: list[CellGroup] = []
    for c in cell_list:
        rep = c.members[0]
        for g in by_broker.get(rep, []):
            tmpl = _template(g.dst, rep) if c.leaf else g.dst
            cgroups.append(CellGroup(len(cgroups), c.id, tmpl, g.selector, g.count,
                                     c.leaf and "{broker}" in tmpl))
    return Folded(cell_list, qends, cgroups, settings, cell_of, owner)


_LISTS = ("dynamically_included", "excluded", "statically_included")
_BROKER = "{broker}"


def _names(s, member: str) -> bool:
    """Do the filters of ``s`` name ``member``?"""
    return any(member in p for name in _LISTS for p in getattr(s, name))


def _relative(s, member: str) -> tuple:
    """``s`` with ``member`` written ``{broker}`` in its filters: leaves whose connectors
    differ only by naming themselves (each store limited to its own queue) share it."""
    if s.kind != "mesh" or not _names(s, member):
        return (s,)
    lists = tuple(tuple(p.replace(member, _BROKER) for p in getattr(s, name))
                  for name in _LISTS)
    return (replace(s, **{name: () for name in _LISTS}), lists)


def _segments(name: str) -> list[str]:
    return name.partition("://")[2].split(".")


def _relative_ok(estate: Estate, by_broker: dict, shape: _Shape) -> bool:
    """May leaves whose filters name themselves be folded?  Only where a verdict can
    tell "the member's own destination" from "a cell-mate's" and nothing else: every
    leaf id is one plain segment (no ``.``, ``*``, ``>``), a member-relative pattern or
    destination has ``{broker}`` only as a whole segment, and no leaf id is spelled by
    any fixed segment of any filter or destination.  Then a filter of member X judges
    member Y's destination the same for every Y != X (``{broker}`` segments compare
    equal exactly when X = Y; fixed segments never equal a member), so ``group_flags``
    needs only the verdicts for X itself and for one other member.  Checked once,
    linear in brokers + filters + groups."""
    leaves = [b for b in estate.brokers if len(shape.ends[b]) == 1]
    if not any(_names(shape.ends[b][0].settings, b) for b in leaves):
        return False
    if any(set(b) & {".", "*", ">"} or _BROKER in b for b in leaves):
        return False
    fixed: set[str] = set()

    def note(name: str) -> bool:
        for seg in _segments(name):
            if _BROKER in seg and seg != _BROKER:
                return False
            if seg != _BROKER:
                fixed.add(seg)
        return True

    for link in estate.links:
        s = link.settings
        for name in _LISTS:
            for p in getattr(s, name):
                if not note(p.replace(link.dialer, _BROKER)
                            if len(shape.ends[link.dialer]) == 1 else p):
                    return False
    for b, gs in by_broker.items():
        for g in gs:
            if not note(_template(g.dst, b) if len(shape.ends[b]) == 1 else g.dst):
                return False
    return not fixed.intersection(leaves)


def _uniform(members: list[str], by_broker: dict, settings: list, shape: _Shape) -> bool:
    """Every connector treats every member's own destinations alike."""
    probes = [_End("", "", s, "mesh", True, True, True, 0) for s in settings
              if s.kind == "mesh"]
    if not probes:
        return True
    rep = members[0]
    for g in by_broker.get(rep, []):
        tmpl = _template(g.dst, rep)
        if "{broker}" not in tmpl:
            continue
        verdicts = None
        for m in members:
            dst = tmpl.replace("{broker}", m)
            v = tuple((p.offer(m, dst, ()) == "", p.permit(dst),
                       dst in p.settings.statically_included) for p in probes)
            if verdicts is None:
                verdicts = v
            elif v != verdicts:
                return False
    return True


def group_flags(folded: Folded) -> list[tuple]:
    """Per (sid, group): (skip: dynamic includes leave it out -- on a tree link: not
    sent down to a child, advertise_down --, permit reason, joins a
    static conduit, suppressed as a duplicate, is a topic) for any member's destination
    but the settings' owner's, then (skip, permit, static) for the owner's own
    destination, and whether the two differ (``split``).  They differ only where the
    settings are a leaf member's own connector naming it (``Folded.owner``) and the group
    is of that member's cell: the owner's own queue passes its filter, a cell-mate's
    does not."""
    rows = []
    for si, s in enumerate(folded.settings):
        probe = _End("", "", s, s.kind, True, True, True, 0)
        owner = folded.owner.get(si)
        for g in folded.groups:
            members = folded.cells[g.origin].members
            rep = members[0]
            if owner is not None and g.templated and owner in members:
                other = members[1] if rep == owner else rep
                v_other = _verdicts(probe, s, other, g.dst(other))
                v_self = _verdicts(probe, s, owner, g.dst(owner))
            else:
                v_other = v_self = _verdicts(probe, s, rep, g.dst(rep))
            dst = g.dst(rep)
            rows.append((si, g.id, *v_other, probe.suppresses(dst), is_topic(dst), *v_self,
                         v_self != v_other))
    return rows


def _verdicts(probe: _End, s, origin: str, dst: str) -> tuple:
    if s.kind == "mesh":
        skip = probe.offer(origin, dst, ()) == "" if s.dynamically_included else False
        return skip, probe.permit(dst), dst in s.statically_included and s.conduit_subscriptions
    # tree: skip = not sent down to a child (advertise_down)
    probe.lane = "child"
    return probe.offer(origin, dst, ()) == "", None, False
