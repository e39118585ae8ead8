"""``treefed explain DESTINATION --from BROKER``: why a message sent at BROKER would or
would not reach each consumer of DESTINATION.

Theory of operation
-------------------
Each broker answers the admin request ``explain`` with ``explain_view``: its local
consumers of the destination, the demand entries that match it (consumer, origin, broker
path, link), and for each of its links the rules a forward would meet there (state,
``message_ttl``, the filter verdict for this destination, the consumer ttl it applies to
advisories).  ``trace`` then replays the forwarding decision over those views, purely:
from BROKER a message goes to local consumers and along every link holding active
demand for it, unless the link refuses it —

* ``link_down``  the link is not operational;
* ``loop``       the next broker is already on the message's path;
* ``ttl``        the message made ``message_ttl`` hops already;
* ``filter``     the destination is ``local_only`` here, or excluded / not included on
                 that link;
* ``permission`` the next broker's screen refuses it (the user this broker logged in as
                 may not write the destination there, or it is outside a tree child's
                 scope);

and where a broker holds no demand at all, a tree broker sends it up to its parent
(``route_unknown_up``, recorded as ``tree_rule``).  Every consumer the replay does not
reach is explained: the refusal met on the way to it, else ``no_demand`` — its interest
never reached the brokers the message visits — with the advisory refusal that stopped it
where one can be read off the views (a neighbour holds the interest but our link's
consumer ttl or filter refuses it), or ``unreachable`` when its broker did not answer.

A queue message goes to ONE of the consumers reached (priority, then round robin); a
topic message to all of them.  Nothing here does I/O.
"""

from __future__ import annotations

from typing import Any

__all__ = ["explain_view", "views_from_events", "read_run", "trace", "render", "REASONS"]

REASONS = ("ttl", "loop", "filter", "tree_rule", "no_demand", "link_down", "permission",
           "unreachable")


# --------------------------------------------------------------------------- broker side

def explain_view(node: Any, dst: str) -> dict:
    """What one broker knows about ``dst`` (runs in the broker; read only)."""
    from treefed.core.destinations import matches, parse_destination

    dst = parse_destination(dst)
    site = node.site
    broker = site.broker
    local = [{"consumer": f"{node.broker_id}/{c['conn']}/{c['sub']}", "pattern": c["dst"],
              "selector": c["selector"]}
             for c in broker.statistics()["consumers"]
             if c["peer"] is None and matches(c["dst"], dst)]
    entries, links = [], []
    for c, bridge in node.link_bridges():
        policy = bridge.policy
        permit = policy.permit(dst) if hasattr(policy, "permit") else None
        # forwards the peer sends us over this link pass our screen (permissions, a
        # tree child's scope)?  False: they are refused here as "permission"
        guard = node._conns[c["conn"]].guard   # noqa: SLF001 - same package family
        takes = guard is None or (
            (guard.authz is None or guard.authz.check(guard.user, "write", dst))
            and (guard.scope is None or guard.scope.may_send(dst)))
        links.append({"link": bridge.name, "conn": bridge.conn, "peer": bridge.peer,
                      "lane": bridge.lane, "state": "operational",
                      "message_ttl": getattr(policy, "message_ttl", -1),
                      "consumer_ttl": bridge.settings.consumer_ttl
                      if bridge.settings.kind == "mesh" else -1,
                      "filter": permit, "forwards": bridge.forwards,
                      "takes_forwards": takes})
        for it in bridge.remote.values():
            if matches(it.dst, dst):
                entries.append({"link": bridge.name, "conn": bridge.conn,
                                "peer": bridge.peer, "consumer": it.consumer,
                                "origin": it.origin, "pattern": it.dst,
                                "path": [*it.path, node.broker_id],
                                "selector": it.selector, "active": it.active})
    up = {l["conn"] for l in links}
    for d in node.dialers:
        if d.conn not in up:
            links.append({"link": d.settings.name, "conn": None, "peer": d.peer,
                          "lane": "parent" if d.settings.kind == "tree" else "mesh",
                          "state": d.state, "last_error": d.last_error, "uri": d.uri})
    for lost in node.lost_links.values():
        links.append({"link": lost["link"], "conn": None, "peer": lost["peer"],
                      "lane": lost["lane"], "state": "down", "last_error": "link lost"})
    tree = node.config.tree_connector
    return {"broker": node.broker_id, "dst": dst, "node_type": site.node_type,
            "local_only": broker.policies.for_destination(dst).local_only,
            "route_unknown_up": bool(tree and tree.route_unknown_up),
            "local_consumers": local, "entries": entries, "links": links}


# --------------------------------------------------------------------------- a run directory

def read_run(run_dir: Any) -> Any:
    """The events of a scenario run directory (``events.jsonl.gz`` and its parts, in
    order), one dict each."""
    import gzip
    import json
    from pathlib import Path

    folder = Path(run_dir)
    files = sorted(folder.glob("events*.jsonl.gz")) + sorted(folder.glob("events*.jsonl"))
    if not files:
        from treefed.errors import LocalError

        raise LocalError(f"{folder}: no events.jsonl.gz (not a scenario run directory?)",
                         code="bad_request")
    for path in files:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


def views_from_events(events: Any, dst: str, at: float | None = None) -> dict[str, dict]:
    """Brokers' views of ``dst`` rebuilt from a run's event log, as they stood at time
    ``at`` (default: the end).  The log has no link settings, so no ttl / filter is
    checked on the message side; instead every ``advisory.dropped`` is kept, and it names
    the exact refusal that kept a consumer's interest away."""
    from treefed.core.destinations import matches, parse_destination

    dst = parse_destination(dst)
    brokers: dict[str, dict] = {}

    def view(b: str) -> dict:
        v = brokers.get(b)
        if v is None:
            v = brokers[b] = {"broker": b, "dst": dst, "node_type": None, "local_only": False,
                              "route_unknown_up": False, "local": {}, "demand": {},
                              "links_by_key": {}, "dropped_advisories": []}
        return v

    for e in events:
        if at is not None and e.get("ts", 0.0) > at:
            break
        kind, b = e.get("event"), e.get("broker")
        if not b or not kind:
            continue
        if kind == "broker.info":
            v = view(b)
            v["node_type"] = e.get("node_type")
            v["route_unknown_up"] = e.get("node_type") in ("leaf", "branch")
            v["parent"] = e.get("parent")
        elif kind == "consumer.added" and matches(e["dst"], dst):
            view(b)["local"][e["consumer"]] = e["dst"]
        elif kind == "consumer.removed":
            view(b)["local"].pop(e["consumer"], None)
        elif kind == "demand.created" and matches(e["dst"], dst):
            view(b)["demand"][(e["link"], e["peer"], e["consumer"])] = e
        elif kind == "demand.removed":
            view(b)["demand"].pop((e["link"], e["peer"], e["consumer"]), None)
        elif kind in ("link.up", "link.down"):
            lane = "tree" if e.get("connector") == "tree" else "mesh"   # side: below
            view(b)["links_by_key"][(e["link"], e["peer"])] = {
                "link": e["link"], "peer": e["peer"], "lane": lane,
                "state": "operational" if kind == "link.up" else "down",
                "message_ttl": -1, "consumer_ttl": -1, "filter": None}
        elif kind == "advisory.dropped" and e.get("kind") == "add" \
                and matches(e["dst"], dst):
            view(b)["dropped_advisories"].append(
                {"peer": e["peer"], "link": e["link"], "consumer": e["consumer"],
                 "reason": e["reason"], "ts": e["ts"]})
    out = {}
    for b, v in brokers.items():
        for link in v["links_by_key"].values():
            if link["lane"] == "tree":   # broker.info named the parent
                link["lane"] = "parent" if link["peer"] == v.get("parent") else "child"
        out[b] = {"broker": b, "dst": dst, "node_type": v["node_type"], "local_only": False,
                  "route_unknown_up": v["route_unknown_up"],
                  "local_consumers": [{"consumer": c, "pattern": p, "selector": None}
                                      for c, p in v["local"].items()],
                  "entries": [{"link": d["link"], "conn": None, "peer": d["peer"],
                               "consumer": d["consumer"], "origin": d["origin"],
                               "pattern": d["dst"], "path": [d["origin"], "...", b],
                               "selector": None, "active": True}
                              for d in v["demand"].values()],
                  "links": list(v["links_by_key"].values()),
                  "dropped_advisories": v["dropped_advisories"]}
    return out


# --------------------------------------------------------------------------- the replay

def _refusal(view: dict, link: dict, path: list[str]) -> str | None:
    if link["state"] != "operational":
        return "link_down"
    if view["local_only"]:
        return "filter"
    if link["peer"] in path or link["peer"] == view["broker"]:
        return "loop"
    ttl = link.get("message_ttl", -1)
    if ttl != -1 and len(path) >= ttl:
        return "ttl"
    if link.get("filter"):
        return "filter"
    return None


def _screened(views: dict, here: str, peer: str) -> str | None:
    """``permission`` when ``peer`` refuses forwards from ``here`` on its end of the link
    (the user ``here`` logged in as may not write the destination there)."""
    view = views.get(peer)
    if view is None:
        return None
    for link in view["links"]:
        if link["peer"] == here and link["state"] == "operational" \
                and link.get("takes_forwards") is False:
            return "permission"
    return None


def trace(views: dict[str, dict], start: str, *, max_steps: int = 100_000) -> dict:
    """Replay a message sent at ``start`` over the brokers' ``views`` (broker id -> view,
    or None when it did not answer).  Returns reached consumers (each with its hops),
    refusals met, and the unreached consumers with their reason."""
    reached: dict[str, dict] = {}
    refused: list[dict] = []
    seen: set[tuple[str, tuple]] = set()
    stack: list[tuple[str, list[str], list[dict]]] = [(start, [], [])]
    steps = 0
    while stack and steps < max_steps:
        steps += 1
        here, path, hops = stack.pop()
        key = (here, tuple(path))
        if key in seen:
            continue
        seen.add(key)
        view = views.get(here)
        if view is None:
            refused.append({"at": path[-1] if path else here, "to": here,
                            "reason": "unreachable", "consumers": []})
            continue
        for c in view["local_consumers"]:
            reached.setdefault(c["consumer"], {"broker": here, "hops": hops,
                                               "pattern": c["pattern"]})
        by_link: dict[str, list[dict]] = {}
        for e in view["entries"]:
            if e["active"]:
                by_link.setdefault(e["link"] + "\0" + str(e["peer"]), []).append(e)
        links = {(l["link"], l["peer"]): l for l in view["links"]}
        for group in by_link.values():
            link = links.get((group[0]["link"], group[0]["peer"]))
            if link is None:
                continue
            reason = _refusal(view, link, path) or _screened(views, here, link["peer"])
            consumers = sorted({e["consumer"] for e in group})
            if reason is not None:
                refused.append({"at": here, "to": link["peer"], "link": link["link"],
                                "reason": reason, "consumers": consumers})
                continue
            hop = {"from": here, "to": link["peer"], "link": link["link"],
                   "demand": [{"consumer": e["consumer"], "path": e["path"]}
                              for e in group]}
            stack.append((link["peer"], [*path, here], [*hops, hop]))
        if not view["local_consumers"] and not by_link and view["route_unknown_up"]:
            parent = next((l for l in view["links"] if l["lane"] == "parent"), None)
            if parent is not None:
                reason = _refusal(view, parent, path)
                if reason is None:
                    hop = {"from": here, "to": parent["peer"], "link": parent["link"],
                           "demand": [], "rule": "tree_rule: no demand here, "
                                                 "route_unknown_up sends it to the parent"}
                    stack.append((parent["peer"], [*path, here], [*hops, hop]))
                else:
                    refused.append({"at": here, "to": parent["peer"],
                                    "link": parent["link"], "reason": reason,
                                    "consumers": []})
    visited = {b for b, _ in seen}
    unreached = []
    for broker, view in views.items():
        if view is None:
            continue
        for c in view["local_consumers"]:
            if c["consumer"] in reached:
                continue
            unreached.append({"consumer": c["consumer"], "broker": broker,
                              **_why_not(views, c["consumer"], broker, refused, visited)})
    dst = next((v.get("dst") for v in views.values() if v is not None), None)
    return {"from": start, "dst": dst, "reached": reached, "refused": refused,
            "unreached": unreached}


def _why_not(views: dict, consumer: str, home: str, refused: list[dict],
             visited: set[str]) -> dict:
    # a run's log says exactly where the consumer's advisory was refused on its way
    # towards the brokers the message visited
    others = sorted(b for b in views if b not in visited)
    for b in [*sorted(visited), *others]:
        view = views.get(b)
        for d in (view or {}).get("dropped_advisories", ()):
            if d["consumer"] == consumer:
                return {"reason": d["reason"], "detail": f"its advisory was dropped at {b} "
                        f"on link {d['link']} with {d['peer']} (t={d['ts']:g})"}
    for r in refused:
        if consumer in r["consumers"] or (r["to"] == home and not r["consumers"]):
            return {"reason": r["reason"], "detail": f"at {r['at']} towards {r['to']}"
                    + (f" over link {r['link']}" if r.get("link") else "")}
    holders = {b for b, v in views.items() if v is not None and
               (b == home or any(e["consumer"] == consumer for e in v["entries"]))}
    # a broker the message visited, next to one that holds the interest: why did that
    # neighbour's advisory not get in?  Read the visited broker's own link rules.
    for b in sorted(visited):
        view = views.get(b)
        if view is None or b in holders:
            continue
        for link in view["links"]:
            peer = link["peer"]
            if peer not in holders:
                continue
            if link["state"] != "operational":
                return {"reason": "link_down",
                        "detail": f"{b}'s link {link['link']} to {peer} is {link['state']}"}
            held = views[peer]
            entry = next((e for e in held["entries"] if e["consumer"] == consumer), None)
            # the advisory peer sends carries the brokers before it (origin first):
            # its entry's path without itself; none when the consumer is its own
            sent_path = len(entry["path"]) - 1 if entry is not None else 0
            ttl = link.get("consumer_ttl", -1)
            if ttl != -1 and sent_path >= ttl:
                return {"reason": "ttl", "detail": f"{peer}'s advisory has crossed "
                        f"{sent_path} broker(s) before it; {b}'s link {link['link']} "
                        f"takes advisories of fewer than consumer_ttl={ttl}"}
            if link.get("filter"):
                return {"reason": "filter", "detail": f"{b}'s link {link['link']} does "
                        "not take this destination (excluded / not included)"}
            if link["lane"] == "parent":
                return {"reason": "tree_rule", "detail": f"interest never flows down the "
                        f"tree from {peer} to {b}"}
    return {"reason": "no_demand",
            "detail": "its interest is known at " + ", ".join(sorted(holders))
            + "; none of the brokers the message visits holds it"}


# --------------------------------------------------------------------------- output

def render(result: dict, dst: str) -> str:
    lines = [f"{result.get('dst', dst)} sent at {result['from']}:"]
    for consumer, r in sorted(result["reached"].items()):
        lines.append(f"  REACHES {consumer} at {r['broker']}")
        for hop in r["hops"]:
            used = ", ".join(f"{d['consumer']} path {'>'.join(d['path'])}"
                             for d in hop["demand"]) or hop.get("rule", "")
            lines.append(f"    {hop['from']} -> {hop['to']} over {hop['link']}: {used}")
        if not r["hops"]:
            lines.append("    delivered locally")
    for u in result["unreached"]:
        lines.append(f"  NOT {u['consumer']} at {u['broker']}: {u['reason']} ({u['detail']})")
    for r in result["refused"]:
        lines.append(f"  refused at {r['at']} towards {r['to']}: {r['reason']}")
    if not result["reached"] and not result["unreached"]:
        lines.append("  no consumer of it anywhere in the estate")
    return "\n".join(lines) + "\n"
