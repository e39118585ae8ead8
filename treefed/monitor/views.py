"""The JSON endpoints: a running BrokerNode -> plain dicts (NATS-style /varz, /connz ...).

Theory of operation
-------------------
Each function reads the node's state and returns a JSON-able dict; none awaits, so a
view is a consistent snapshot (the site task cannot run in between) and never changes
anything.  Lists that grow with the estate (connections, demand entries) are paginated
with ``offset`` / ``limit`` as NATS does, so a scrape of a broker holding 100,000 demand
entries costs what the caller asked for.  The demand view shows, for every entry, the
consumer's origin and the **broker path** its advisory took (origin first, then every
broker it crossed, this broker last) — the question "why is this consumer known here?"
answered without logs.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from typing import Any

import treefed

__all__ = ["varz", "connz", "linkz", "demandz", "healthz", "page_args", "rss_bytes",
           "DEFAULT_LIMIT", "MAX_LIMIT"]

DEFAULT_LIMIT = 1024
MAX_LIMIT = 100_000


def page_args(query: dict[str, str]) -> tuple[int, int]:
    """``offset`` and ``limit`` of a query; ValueError with a message on bad values."""
    try:
        offset = int(query.get("offset", "0"))
        limit = int(query.get("limit", str(DEFAULT_LIMIT)))
    except ValueError:
        raise ValueError("offset and limit must be integers") from None
    if offset < 0 or not 0 < limit <= MAX_LIMIT:
        raise ValueError(f"offset must be >= 0 and limit 1..{MAX_LIMIT}")
    return offset, limit


def rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc; else the peak)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def varz(node: Any, monitor: Any = None) -> dict:
    """Who and what this broker is: identity, version, uptime, memory, limits."""
    b = node.config.broker
    now = time.time()
    broker = node.site.broker
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "broker": node.broker_id,
        "name": b.name,
        "node_type": node.site.node_type,
        "version": treefed.__version__,
        "python": sys.version.split()[0],
        "pid": os.getpid(),
        "start": round(node.started, 3),
        "now": round(now, 3),
        "uptime": round(now - node.started, 3),
        "mem_rss": rss_bytes(),
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 3),
        "listeners": node.listen_uris(),
        "monitor": monitor.uri if monitor is not None else None,
        "config": node.config.source_path,
        "connections": sum(1 for _ in node.connections()),
        "destinations": len(broker.destination_sizes()),
        "store_full": node.store_full,
        "messages": {"produced": broker.produced, "received": broker.received,
                     "delivered": broker.delivered, "forwarded": broker.forwarded},
        "limits": {
            "max_frame_bytes": b.max_frame_bytes,
            "max_store_bytes": b.max_store_bytes,
            "max_redeliveries": b.max_redeliveries,
            "heartbeat_interval": b.heartbeat_interval,
            "hello_timeout": b.hello_timeout,
            "max_demand_per_link": {d.settings.name: d.settings.max_demand_per_link
                                    for d in node.dialers},
        },
    }


def connz(node: Any, query: dict[str, str]) -> dict:
    """Connections, paginated; ``kind=client|link|pending`` filters."""
    offset, limit = page_args(query)
    kind = query.get("kind")
    conns = [c for c in node.connections() if kind is None or c["kind"] == kind]
    return {"broker": node.broker_id, "now": round(time.time(), 3), "total": len(conns),
            "offset": offset, "limit": limit, "conns": conns[offset:offset + limit]}


def linkz(node: Any) -> dict:
    """Every broker link: dialed connectors (whatever their state) and accepted links,
    with peer, lane, state, last error, round trip and demand counts."""
    site = node.site
    conns = {c["conn"]: c for c in node.connections() if c["kind"] == "link"}
    links: list[dict] = []
    seen: set[str] = set()
    for d in node.dialers:
        entry = {"link": d.settings.name, "connector": d.settings.kind, "uri": d.uri,
                 "dialed": True, "state": d.state, "endpoint": d.endpoint, "peer": d.peer,
                 "conn": d.conn, "attempts": d.attempts, "connects": d.connects,
                 "last_error": d.last_error}
        if d.conn is not None and d.state == "operational":
            _link_detail(entry, site.bridge(d.conn), conns.get(d.conn))
            seen.add(d.conn)
        links.append(entry)
    for cid, c in conns.items():
        if cid in seen:
            continue
        bridge = site.bridge(cid)
        entry = {"link": bridge.name if bridge is not None else None,
                 "connector": bridge.settings.kind if bridge is not None else None,
                 "dialed": False, "state": "operational" if bridge is not None else "refused",
                 "peer": c["peer"], "conn": cid, "remote": c["remote"],
                 "last_error": None}
        _link_detail(entry, bridge, c)
        links.append(entry)
    for lost in node.lost_links.values():   # accepted links that went down
        links.append({**lost, "connector": None, "dialed": False, "state": "down",
                      "conn": None, "last_error": "link lost"})
    return {"broker": node.broker_id, "now": round(time.time(), 3), "links": links}


def _link_detail(entry: dict, bridge: Any, conn: dict | None) -> None:
    if conn is not None:
        entry["rtt"] = conn.get("rtt")
        entry["queued"] = conn["queued"]
        entry["since"] = conn["since"]
        if "listen" in conn:
            entry["listen"] = conn["listen"]
    if bridge is not None:
        entry["lane"] = bridge.lane
        entry["remote_interest"] = len(bridge.remote)
        entry["demand"] = bridge.demand_count()


def _entries(node: Any, dst: str | None):
    """(link, peer, Interest) for every demand entry, in link order."""
    for _, bridge in node.link_bridges():
        for it in bridge.remote.values():
            if dst is None or it.dst == dst:
                yield bridge, it


def demandz(node: Any, query: dict[str, str]) -> dict:
    """Demand entries (consumers known over links), ``dst=`` filters one destination;
    each with its origin, broker path, selector and whether it holds demand."""
    offset, limit = page_args(query)
    dst = query.get("dst") or None
    if dst is not None:
        from treefed.core.destinations import parse_destination

        dst = parse_destination(dst, allow_wildcards=True)
    me = node.broker_id
    entries = []
    total = 0
    for bridge, it in _entries(node, dst):
        if offset <= total < offset + limit:
            entries.append({
                "link": bridge.name, "conn": bridge.conn, "peer": bridge.peer,
                "lane": bridge.lane, "dst": it.dst, "consumer": it.consumer,
                "origin": it.origin, "path": [*it.path, me], "hops": len(it.path),
                "selector": it.selector, "priority": it.priority,
                "active": it.active,
                "demand": it.demand.sub if it.demand is not None else None})
        total += 1
    # with a destination named, its local consumers too (the end of every path)
    local = None if dst is None else [
        c for c in node.site.broker.statistics()["consumers"]
        if c["peer"] is None and c["dst"] == dst]
    out = {"broker": me, "now": round(time.time(), 3), "dst": dst, "total": total,
           "offset": offset, "limit": limit, "entries": entries}
    if local is not None:
        out["local_consumers"] = [{"conn": c["conn"], "sub": c["sub"], "dst": c["dst"],
                                   "selector": c["selector"]} for c in local]
    return out


def healthz(node: Any) -> tuple[bool, dict]:
    """Ready when every listener is up and the parent link (if any) is operational."""
    problems = []
    wanted = len(node.config.broker.listen)
    if len(node.addresses) < wanted:
        problems.append(f"{len(node.addresses)} of {wanted} listeners up")
    if node._stopping:   # noqa: SLF001 - a stopping broker is not ready
        problems.append("broker is stopping")
    parent = None
    for d in node.dialers:
        if d.settings.kind == "tree":
            parent = d
    if parent is not None and parent.state != "operational":
        why = f": {parent.last_error}" if parent.last_error else ""
        problems.append(f"parent link {parent.uri} is {parent.state}{why}")
    body = {"status": "ok" if not problems else "unavailable", "broker": node.broker_id,
            "parent": None if parent is None else parent.state, "problems": problems}
    return not problems, body
