"""Paged, filtered ``stat`` replies (issue #12, defect 9).

Theory of operation
-------------------
A broker's statistics grow with what it serves: an HQ over 4 x 1,000 stores holds about
40,000 destinations, and one reply carrying all of them passed the 4 MiB frame limit,
so ``treefed stat`` ended in "connection lost".  ``select`` cuts a full statistics
snapshot (``BrokerNode.statistics()``) down to one *page*:

* ``what`` picks the sections: ``all`` (every scalar figure and the first page of each
  list), ``summary`` (figures only, with the list totals), or one list section.
* List sections (``PAGED``) are sorted (by destination name, by connection id) so pages
  are stable while the broker changes between requests, then ``offset`` / ``limit``
  cut them (``limit`` 0 = ``DEFAULT_PAGE``; at most ``MAX_PAGE``).
* ``match`` (a destination pattern, wildcards allowed: ``queue://Store.s1.>``) keeps
  only the destinations it matches and the consumers whose destination it matches.
* The reply's ``pages`` map says, per list section, ``total`` (after the filter),
  ``offset``, ``returned`` and ``next`` -- the offset of the next page, or None.

A client that wants everything (``Connection.stat_all``) asks ``all`` once, then each
section that has a ``next`` until it has none.  Pure: no I/O, no clock; the node sizes
the page so its encoded reply fits the frame limit (``shrink``).
"""

from __future__ import annotations

from typing import Any

from treefed.core.destinations import matches, parse_destination
from treefed.errors import DestinationError, RemoteError

__all__ = ["PAGED", "SECTIONS", "DEFAULT_PAGE", "MAX_PAGE", "select"]

#: Statistics that are lists (or maps) growing with the broker's size, and the key
#: their entries are sorted by.
PAGED: dict[str, str | None] = {"destinations": None, "consumers": "conn", "conns": "conn",
                                "links": "conn", "connectors": "uri"}
SECTIONS = ("all", "summary", *PAGED)
DEFAULT_PAGE = 1000
MAX_PAGE = 10_000


def _consumer_key(c: dict) -> tuple:
    return (str(c.get("conn")), str(c.get("sub")))


def select(stats: dict, what: str = "all", *, match: str | None = None, offset: int = 0,
           limit: int = 0) -> dict:
    """One page of ``stats`` (see the module doc).  Raises RemoteError(bad_request) for
    an unknown section or a malformed ``match`` pattern."""
    if what not in SECTIONS:
        raise RemoteError(f"stat: unknown section {what!r} (one of {', '.join(SECTIONS)})",
                          code="bad_request")
    pattern = None
    if match:
        try:
            pattern = parse_destination(match, allow_wildcards=True)
        except DestinationError as exc:
            raise RemoteError(f"stat: match {match!r}: {exc.message}",
                              code="bad_request") from None
    limit = DEFAULT_PAGE if limit <= 0 else min(limit, MAX_PAGE)
    offset = max(offset, 0)
    if what in ("all", "summary"):
        out: dict[str, Any] = {k: v for k, v in stats.items() if k not in PAGED}
    else:
        out = {"broker": stats.get("broker"), "name": stats.get("name")}
    pages: dict[str, dict] = {}
    for section, key in PAGED.items():
        value = stats.get(section)
        if value is None:
            continue
        items = _filtered(section, value, pattern)
        total = len(items)
        if what not in ("all", section):
            if what == "summary":
                pages[section] = {"total": total, "offset": 0, "returned": 0,
                                  "next": 0 if total else None}
            continue
        if section == "destinations":
            names = sorted(items)
            chosen = names[offset:offset + limit]
            out[section] = {name: items[name] for name in chosen}
            returned = len(chosen)
        else:
            ordered = sorted(items, key=_consumer_key if section == "consumers"
                             else (lambda e, k=key: str(e.get(k))))
            out[section] = ordered[offset:offset + limit]
            returned = len(out[section])
        end = offset + returned
        pages[section] = {"total": total, "offset": offset, "returned": returned,
                          "next": end if end < total else None}
    out["pages"] = pages
    return out


def _filtered(section: str, value: Any, pattern: str | None) -> Any:
    if pattern is None:
        return value
    if section == "destinations":
        return {name: v for name, v in value.items() if matches(pattern, name)}
    if section == "consumers":
        return [c for c in value
                if isinstance(c.get("dst"), str)
                and (c["dst"] == pattern or matches(pattern, c["dst"]))]
    return value

