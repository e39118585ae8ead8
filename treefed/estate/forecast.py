"""Forecast: what an estate's connectors do with a workload, as configured and as a tree.

Theory of operation
-------------------
``load_estate(paths)`` reads broker configs (``treefed import activemq`` or ``treefed estate
generate`` output) and resolves who dials whom (``estate.topology``).  ``forecast`` runs
the estate twice through the synchronous replay of ``federation.testing.Estate`` -- every
site a pure ``federation.Site`` over a real ``core.Broker``, frames moved until quiet --
once with each broker's own connectors and options (``current``), once linked as the tree
``infer_tree`` finds in the same graph (``tree``).  That replay, rather than
``scenario.engines.replay``, because an imported estate is any graph with options per
connector, while the scenario engines build a generated tree with one mode for every link.

Both runs get the same workload in two phases: every consumer subscribes and the estate
settles, then every message is sent and the estate settles.  The default workload
(``default_workload``) is the scenario runner's: a consumer on each store's queue
(``queue://Store.<id>.Incoming``), on ``queue://HQ.Incoming`` at the root and on
``queue://Region.<id>.Incoming`` at each branch; one message HQ -> each store, each store
-> HQ, and each store -> the next store (ids in order).  Tiers are the roles in the tree
(root / branch / leaf) or, when the graph is not a tree, in a breadth-first spanning tree
from the chosen root.

Figures per run, from the runs' event lines as the Spark report computes them: demand
entries per broker and per tier, advisory receipts, *spilled* advisories and *wasted*
demand (at a broker not interested in the destination: no local consumer or producer, and
it neither forwarded nor delivered a message of it), deliveries per consumer, and every
*stranded* route -- (producer broker, destination) with messages left undelivered -- with
one example path: the brokers the message crossed and where it waits.

Security: when any config authenticates links or confines tree children, the ``current``
run applies it as ``treefed broker`` would (``estate.security``): a link whose login the
acceptor refuses is not linked, and the real ``security.Guard`` screens each accepted
link's advisories (read + tree scope) and forwarded messages (write + scope).  The run
is repeated without security, and ``security`` in the result lists the refused logins,
the denied (link, permission, destination) and the **routes the security config
refuses** -- delivered without it, stranded with it.  The proposed tree is forecast
without security (it is a proposal: ``--emit-tree`` writes no permissions).
"""

from __future__ import annotations

import json
import tomllib
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

from treefed.config import (
    BrokerConfig, TreeConnectorConfig, _check_table, _int, _string, dump_config,
    load_config,
)
from treefed.errors import ConfigError, TreefedError
from treefed.estate.topology import (
    WILDCARD_HOSTS, Address, Dial, Link, NotATree, Tree, Unresolved, infer_tree,
    resolve_links, spanning_tree,
)
from treefed.federation.settings import LinkSettings, TreeSettings
from treefed.federation.testing import Estate
from treefed.transport.uri import parse_uri

__all__ = ["EstateConfigs", "Workload", "ConsumerSpec", "SendSpec", "load_estate",
           "load_workload", "default_workload", "forecast", "write_forecast",
           "emit_tree", "tiers"]

STORE_QUEUE = "queue://Store.{id}.Incoming"
HQ_QUEUE = "queue://HQ.Incoming"
REGION_QUEUE = "queue://Region.{id}.Incoming"


@dataclass(slots=True)
class EstateConfigs:
    configs: dict[str, BrokerConfig]
    files: dict[str, str]
    links: list[Link]
    unresolved: list[Unresolved]

    @property
    def mode(self) -> str:
        return "tree" if any(link.kind == "tree" for link in self.links) else "mesh"


def load_estate(paths: Iterable[str | Path]) -> EstateConfigs:
    """Broker configs from files or folders (``*.toml`` with a ``[broker]`` section)."""
    files: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            files += sorted(f for f in p.glob("*.toml") if _is_broker_file(f))
        else:
            files.append(p)
    if not files:
        raise ConfigError("", "no broker configs found (want *.toml files with [broker])")
    configs: dict[str, BrokerConfig] = {}
    where: dict[str, str] = {}
    for f in files:
        c = load_config(f)
        if c.broker.id in configs:
            raise ConfigError("broker.id", f"broker {c.broker.id!r} is in both "
                                           f"{where[c.broker.id]} and {f}")
        configs[c.broker.id], where[c.broker.id] = c, str(f)
    listeners = {bid: [_addr(u) for u in c.broker.listen] for bid, c in configs.items()}
    dials: list[Dial] = []
    for bid, c in configs.items():
        for nc in c.network_connectors:
            target = parse_uri(nc.uri)
            dials += [Dial(bid, nc.name, "mesh", Address(e.host, e.port))
                      for e in target.endpoints]
        if c.tree_connector is not None:
            target = parse_uri(c.tree_connector.uri)
            dials.append(Dial(bid, "tree", "tree",
                              Address(target.endpoints[0].host, target.endpoints[0].port)))
    links, unresolved = resolve_links(listeners, dials)
    return EstateConfigs(configs, where, links, unresolved)


def _is_broker_file(path: Path) -> bool:
    try:
        return "broker" in tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return True   # let load_config report it


def _addr(uri: str) -> Address:
    e = parse_uri(uri, listen=True).endpoints[0]
    return Address(e.host, e.port)


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    broker: str
    dst: str
    name: str
    selector: str | None = None


@dataclass(frozen=True, slots=True)
class SendSpec:
    broker: str
    dst: str
    count: int = 1
    headers: tuple[tuple[str, Any], ...] = ()


@dataclass(slots=True)
class Workload:
    consumers: list[ConsumerSpec] = field(default_factory=list)
    sends: list[SendSpec] = field(default_factory=list)
    description: str = ""


def tiers(brokers: Iterable[str], links: Iterable[Link], tree: Tree | None,
          root: str | None = None) -> dict[str, tuple[str, int]]:
    """broker -> (role, depth): from the tree, or a spanning tree when there is none."""
    brokers = sorted(brokers)
    if tree is None:
        tree = spanning_tree(brokers, links, root=root)
    out = {}
    for b in brokers:
        if b not in tree.parent:
            out[b] = ("unlinked", -1)
        else:
            out[b] = (tree.role(b), tree.depth(b))
    return out


def default_workload(tier: dict[str, tuple[str, int]]) -> Workload:
    """The scenario runner's retail workload on this estate (see the module docstring)."""
    root = [b for b, (r, _) in sorted(tier.items()) if r == "root"]
    branches = [b for b, (r, _) in sorted(tier.items()) if r == "branch"]
    stores = [b for b, (r, _) in sorted(tier.items()) if r in ("leaf", "unlinked")]
    w = Workload(description="one consumer per store queue, HQ and region queues; one "
                             "message HQ->each store, each store->HQ, each store->next store")
    for s in stores:
        w.consumers.append(ConsumerSpec(s, STORE_QUEUE.format(id=s), "store-in"))
    for b in branches:
        w.consumers.append(ConsumerSpec(b, REGION_QUEUE.format(id=b), "region-in"))
    for r in root:
        w.consumers.append(ConsumerSpec(r, HQ_QUEUE, "hq-in"))
        for s in stores:
            w.sends.append(SendSpec(r, STORE_QUEUE.format(id=s)))
    if root:
        w.sends += [SendSpec(s, HQ_QUEUE) for s in stores]
    if len(stores) > 1:
        w.sends += [SendSpec(s, STORE_QUEUE.format(id=stores[(i + 1) % len(stores)]))
                    for i, s in enumerate(stores)]
    return w


_CONSUMER = {"broker": (_string, None), "dst": (_string, None), "name": (_string, ""),
             "selector": (_string, ""), "count": (_int(1), 1)}


def _headers(value: Any, key: str) -> dict:
    if not isinstance(value, dict) or not all(
            isinstance(v, (str, int, float, bool)) for v in value.values()):
        raise ConfigError(key, "must be a table of header = string, number or boolean")
    return value


_SEND = {"broker": (_string, None), "dst": (_string, None), "count": (_int(1), 1),
         "headers": (_headers, {})}


def load_workload(path: str | Path, brokers: Iterable[str]) -> Workload:
    """A workload file: ``[[consumer]] broker, dst [, name, selector, count]`` and
    ``[[send]] broker, dst [, count, headers]``."""
    from treefed.config import read_toml
    from treefed.core.destinations import parse_destination

    data = read_toml(path)
    known = set(brokers)
    w = Workload(description=str(data.pop("description", f"workload {path}")))
    for key in data:
        if key not in ("consumer", "send"):
            raise ConfigError(key, "unknown key; known: consumer, send, description")
    for section, table in (("consumer", _CONSUMER), ("send", _SEND)):
        for i, raw in enumerate(data.get(section, [])):
            k = f"{section}[{i}]"
            v = _check_table(raw, table, k)
            for req in ("broker", "dst"):
                if v[req] is None:
                    raise ConfigError(f"{k}.{req}", "required key is missing")
            if v["broker"] not in known:
                raise ConfigError(f"{k}.broker", f"no broker {v['broker']!r} in the estate")
            try:
                dst = str(parse_destination(v["dst"], allow_wildcards=section == "consumer"))
            except TreefedError as exc:
                raise ConfigError(f"{k}.dst", exc.message) from None
            if section == "consumer":
                for n in range(v["count"]):
                    name = v["name"] or f"c{i}"
                    w.consumers.append(ConsumerSpec(v["broker"], dst,
                                                    name if v["count"] == 1 else f"{name}-{n + 1}",
                                                    v["selector"] or None))
            else:
                w.sends.append(SendSpec(v["broker"], dst, v["count"],
                                        tuple(sorted(v["headers"].items()))))
    return w


# --------------------------------------------------------------------------- running


def _mesh_estate(est: EstateConfigs, security: dict | None = None) -> Estate:
    """The estate as configured; with ``security`` (a dict to fill) its ``[security]``
    too: links whose login the acceptor refuses are left out, accepted ones screened
    (estate/security.py)."""
    if security is not None:
        from treefed.estate.security import GuardedEstate

        e: Estate = GuardedEstate(log_advisories=True, log_messages=True)
    else:
        e = Estate(log_advisories=True, log_messages=True)
    tree_types = {c.broker.id: c.tree_connector.node_type
                  for c in est.configs.values() if c.tree_connector is not None}
    for bid, c in sorted(est.configs.items()):
        tree = None
        if est.mode == "tree":
            tree = TreeSettings(tree_types.get(bid, "root"),
                                c.tree_connector.route_unknown_up if c.tree_connector else True)
        e.add(bid, tree=tree, accept_tree_children=c.broker.accept_tree_children,
              policies=c.policy_set(), dlq=c.broker.dlq,
              max_redeliveries=c.broker.max_redeliveries)
    connectors = {(bid, nc.name): nc for bid, c in est.configs.items()
                  for nc in c.network_connectors}
    authenticators: dict = {}
    for link in _parents_first(est):
        if link.kind == "tree":
            connector = est.configs[link.dialer].tree_connector
        else:
            connector = connectors[(link.dialer, link.connector)]
        settings = connector.link_settings()
        if security is not None:
            from treefed.estate.security import login

            acceptor = est.configs[link.acceptor]
            who = login(est.configs[link.dialer], acceptor, connector, link.kind,
                        authenticators)
            if not who.ok:
                security["links_refused"].append({
                    "dialer": link.dialer, "acceptor": link.acceptor,
                    "connector": link.connector, "method": who.method,
                    "user": who.user, "reason": who.reason})
                continue
            security["logins"][who.method] += 1
            e.link(link.dialer, link.acceptor, settings)
            e.guard(link.acceptor, link.dialer, settings.name, acceptor, who.user,
                    tree_child=link.kind == "tree",
                    leaf=link.kind == "tree" and connector.node_type == "leaf")
            continue
        e.link(link.dialer, link.acceptor, settings)
    e.run_until_quiet()
    return e


def _parents_first(est: EstateConfigs) -> list[Link]:
    """Tree links in breadth-first order (a child dials an up parent); others as given."""
    if est.mode != "tree":
        return list(est.links)
    depth: dict[str, int] = {}
    parent = {link.dialer: link.acceptor for link in est.links if link.kind == "tree"}

    def d(b: str) -> int:
        if b not in depth:
            depth[b] = 0 if b not in parent else d(parent[b]) + 1
        return depth[b]

    return sorted(est.links, key=lambda link: (d(link.dialer), link.dialer))


def _tree_estate(est: EstateConfigs, tree: Tree) -> Estate:
    e = Estate(log_advisories=True, log_messages=True)
    for bid in tree.order:
        c = est.configs[bid]
        role = tree.role(bid)
        e.add(bid, tree=TreeSettings(role, True), accept_tree_children=role != "leaf",
              policies=c.policy_set(), dlq=c.broker.dlq,
              max_redeliveries=c.broker.max_redeliveries)
    for bid in tree.order[1:]:
        e.link(bid, tree.parent[bid], LinkSettings(kind="tree", name="tree",
                                                   node_type=tree.role(bid)))
    e.run_until_quiet()
    return e


def _security_report(security: dict[str, Any], secured_run: dict[str, Any],
                     open_run: dict[str, Any]) -> dict[str, Any]:
    """What the configs' [security] changes: refused logins, denied frames, and the
    routes delivered without it that it strands (the secured run is "current")."""
    before = {(r["from"], r["dst"]) for r in open_run["stranded_routes"]}
    refused = [r for r in secured_run["stranded_routes"] if (r["from"], r["dst"]) not in before]
    return {"applied": True, "logins": dict(security["logins"]),
            "links_refused": security["links_refused"],
            "denied": secured_run.pop("denied"),
            "routes_refused": refused,
            "without_security": {"messages": open_run["messages"],
                                 "totals": open_run["totals"]}}


def _run(e: Estate, workload: Workload, tier: dict[str, tuple[str, int]],
         security: dict | None = None) -> dict[str, Any]:
    """Subscribe, settle, send, settle; then the figures (see the module docstring)."""
    conns: dict[tuple[str, str], str] = {}
    for i, c in enumerate(workload.consumers):
        conn = f"c{i}"
        conns[(c.broker, c.name)] = conn
        e.subscribe(c.broker, c.name, c.dst, conn=conn, selector=c.selector)
    e.run_until_quiet()
    produced: dict[str, tuple[str, str]] = {}     # msg -> (producer broker, dst)
    for s in workload.sends:
        for mid in e.send(s.broker, s.dst, count=s.count, headers=dict(s.headers)):
            produced[mid] = (s.broker, s.dst)
    e.run_until_quiet()

    interested: set[tuple[str, str]] = set()
    for c in workload.consumers:
        interested.add((c.broker, c.dst))
    for s in workload.sends:
        interested.add((s.broker, s.dst))
    forwards: dict[str, list[str]] = defaultdict(list)
    delivered: set[str] = set()
    for broker, log in e.logs:
        ev = log.event
        if ev == "message.forwarded":
            interested.add((broker, log.fields["dst"]))
            forwards[log.fields["msg"]].append(broker)
        elif ev == "message.delivered":
            interested.add((broker, log.fields["dst"]))
            delivered.add(log.fields["msg"])
    per: dict[str, Counter] = defaultdict(Counter)
    for broker, log in e.logs:
        ev = log.event
        if ev == "advisory.received" and log.fields.get("kind", "add") == "add":
            per[broker]["advisories"] += 1
            if (broker, log.fields["dst"]) not in interested:
                per[broker]["spilled"] += 1
        elif ev == "demand.created":
            per[broker]["demand"] += 1
            if (broker, log.fields["dst"]) not in interested:
                per[broker]["wasted"] += 1
        elif ev == "advisory.sent" and log.fields.get("kind", "add") == "add":
            per[broker]["advisory_frames"] += 1
    by_tier: dict[str, Counter] = defaultdict(Counter)
    for b, (role, _) in tier.items():
        by_tier[role]["brokers"] += 1
        by_tier[role].update(per.get(b, Counter()))
    deliveries = {f"{c.broker}/{c.name}": len(e.delivered(c.broker, conns[(c.broker, c.name)],
                                                           c.name))
                  for c in workload.consumers}
    dsts = {d for _, d in produced.values()}
    depth: dict[str, dict[str, int]] = {}     # broker -> dst -> messages waiting there
    for b in sorted(e.sites):
        # one statistics() per broker: it walks every destination of the broker
        found = e.sites[b].broker.statistics().get("destinations", {})
        mine = {d: int(info.get("depth", 0)) for d, info in found.items()
                if d in dsts and info.get("depth")}
        if mine:
            depth[b] = mine
    held = {b: sum(v.values()) for b, v in depth.items()}
    waiting: dict[str, list[str]] = defaultdict(list)
    for b, v in depth.items():
        for d in v:
            waiting[d].append(b)
    stranded: dict[tuple[str, str], dict[str, Any]] = {}
    for mid, (src, dst) in produced.items():
        if mid in delivered:
            continue
        route = stranded.setdefault((src, dst), {"from": src, "dst": dst, "messages": 0})
        route["messages"] += 1
        if "example" not in route:
            path = forwards.get(mid, [])
            hops = [src] + [b for b in path if b != src]
            waits = waiting.get(dst, [])
            end = next((b for b in reversed(hops) if b in waits), None)
            route["example"] = {"msg": mid, "path": hops,
                                "waits_at": end or (waits[0] if waits else None)}
    consumer_at = {c.dst: c.broker for c in workload.consumers if "*" not in c.dst
                   and ">" not in c.dst}
    for route in stranded.values():
        route["consumer_at"] = consumer_at.get(route["dst"])
    denied: Counter = Counter()
    if security is not None:
        for broker, log in e.logs:
            if log.event == "security.denied":
                denied[(broker, log.fields.get("conn", ""), log.fields["permission"],
                        log.fields["dst"], log.fields.get("reason", ""))] += 1
    e.logs.clear()
    e.advisories.clear()
    e.forwards.clear()
    totals = Counter()
    for c in per.values():
        totals.update(c)
    return {
        "totals": {k: totals.get(k, 0) for k in ("advisory_frames", "advisories", "spilled",
                                                 "demand", "wasted")},
        "max_demand_at_one_broker": max((c["demand"] for c in per.values()), default=0),
        "messages": {"sent": len(produced), "delivered": len(delivered & produced.keys()),
                     "stranded": len(produced) - len(delivered & produced.keys())},
        "per_tier": {role: dict(c) for role, c in sorted(by_tier.items())},
        "per_broker": {b: {"role": tier[b][0], **{k: per[b].get(k, 0) for k in
                                                  ("advisories", "spilled", "demand", "wasted")}}
                       for b in sorted(tier)},
        "deliveries": deliveries,
        "held": held,
        "stranded_routes": sorted(stranded.values(), key=lambda r: (r["from"], r["dst"])),
        **({"denied": [{"broker": b, "link": c.rsplit(":", 1)[-1], "permission": p,
                        "dst": d, "reason": why}
                       for (b, c, p, d, why) in sorted(denied)]}
           if security is not None else {}),
    }


def forecast(est: EstateConfigs, workload: Workload | None = None, *,
             root: str | None = None) -> dict[str, Any]:
    """Run the estate as configured and as the inferred tree; the comparison as a dict."""
    try:
        tree: Tree | None = infer_tree(est.configs, est.links, root=root)
        refused: list[str] = []
    except NotATree as exc:
        tree, refused = None, exc.reasons
    tier = tiers(est.configs, est.links, tree, root)
    if workload is None:
        workload = default_workload(tier)
    from treefed.estate.security import secured

    security: dict[str, Any] | None = None
    if secured(est.configs):
        security = {"links_refused": [], "logins": Counter()}
        current = _run(_mesh_estate(est, security), workload, tier, security)
        if security["links_refused"] or current["denied"]:
            open_run = _run(_mesh_estate(est), workload, tier)
        else:   # nothing refused: the open estate routes exactly the same
            open_run = current
        security = _security_report(security, current, open_run)
    else:
        current = _run(_mesh_estate(est), workload, tier)
    proposed = _run(_tree_estate(est, tree), workload, tier) if tree is not None else None
    return {
        "security": security,
        "estate": {"brokers": len(est.configs), "links": len(est.links),
                   "mode": est.mode,
                   "unresolved": [{"broker": u.dial.broker, "connector": u.dial.connector,
                                   "address": str(u.dial.address), "reason": u.reason}
                                  for u in est.unresolved],
                   "tiers": dict(Counter(r for r, _ in tier.values()))},
        "workload": {"description": workload.description,
                     "consumers": len(workload.consumers),
                     "messages": sum(s.count for s in workload.sends)},
        "tree": ({"root": tree.root, "parent": {b: tree.parent[b] for b in tree.order}}
                 if tree is not None else {"refused": refused}),
        "current": current,
        "proposed_tree": proposed,
    }


# --------------------------------------------------------------------------- output


def write_forecast(result: dict[str, Any], out: str | Path) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    j, m = out / "forecast.json", out / "forecast.md"
    j.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    m.write_text(_markdown(result), encoding="utf-8")
    return [m, j]


def _markdown(r: dict[str, Any]) -> str:
    est, cur, tree = r["estate"], r["current"], r["proposed_tree"]
    modes = [("current (" + est["mode"] + ")", cur)] + ([("proposed tree", tree)] if tree else [])
    lines = ["# Forecast", "",
             f"{est['brokers']} brokers, {est['links']} links, connectors: {est['mode']}. "
             f"Workload: {r['workload']['description']} ({r['workload']['consumers']} "
             f"consumers, {r['workload']['messages']} messages).", ""]
    if est["unresolved"]:
        lines += [f"**{len(est['unresolved'])} connector addresses match no broker** "
                  "(links missing from both runs):", ""]
        lines += [f"- {u['broker']} / {u['connector']} -> {u['address']}: {u['reason']}"
                  for u in est["unresolved"][:20]]
        lines.append("")
    lines += ["## Totals", "", "| | " + " | ".join(n for n, _ in modes) + " |",
              "|---|" + "---|" * len(modes)]
    rows = [("advisory frames", lambda x: x["totals"]["advisory_frames"]),
            ("advisory receipts", lambda x: x["totals"]["advisories"]),
            ("spilled advisories", lambda x: x["totals"]["spilled"]),
            ("demand entries", lambda x: x["totals"]["demand"]),
            ("wasted demand", lambda x: x["totals"]["wasted"]),
            ("most demand at one broker", lambda x: x["max_demand_at_one_broker"]),
            ("messages delivered / sent",
             lambda x: f"{x['messages']['delivered']} / {x['messages']['sent']}"),
            ("stranded messages", lambda x: x["messages"]["stranded"]),
            ("stranded routes", lambda x: len(x["stranded_routes"]))]
    lines += [f"| {name} | " + " | ".join(str(f(x)) for _, x in modes) + " |"
              for name, f in rows]
    lines += ["", "## Per tier (demand entries / spilled advisories)", "",
              "| tier | brokers | " + " | ".join(n for n, _ in modes) + " |",
              "|---|---|" + "---|" * len(modes)]
    for role, c in cur["per_tier"].items():
        cells = []
        for _, x in modes:
            t = x["per_tier"].get(role, {})
            cells.append(f"{t.get('demand', 0)} / {t.get('spilled', 0)}")
        lines.append(f"| {role} | {c.get('brokers', 0)} | " + " | ".join(cells) + " |")
    if "refused" in r["tree"]:
        lines += ["", "## No tree proposed", "", "The links do not form a tree:", ""]
        lines += [f"- {why}" for why in r["tree"]["refused"]]
    else:
        lines += ["", f"Proposed tree: root **{r['tree']['root']}** "
                      "(`--emit-tree DIR` writes its configs)."]
    for name, x in modes:
        lines += ["", f"## Stranded routes: {name}", ""]
        if not x["stranded_routes"]:
            lines.append("None: every message reached a consumer.")
            continue
        lines += ["| from | destination | consumer at | messages | example path | waits at |",
                  "|---|---|---|---|---|---|"]
        for s in x["stranded_routes"][:50]:
            ex = s["example"]
            lines.append(f"| {s['from']} | {s['dst']} | {s['consumer_at'] or '-'} | "
                         f"{s['messages']} | {' -> '.join(ex['path'])} | "
                         f"{ex['waits_at'] or '-'} |")
        if len(x["stranded_routes"]) > 50:
            lines.append(f"| … {len(x['stranded_routes']) - 50} more in forecast.json | | | "
                         "| | |")
    lines += ["", "## Demand per broker (top 20, current)", "",
              "| broker | role | demand | spilled | wasted |", "|---|---|---|---|---|"]
    top = sorted(cur["per_broker"].items(), key=lambda kv: (-kv[1]["demand"], kv[0]))[:20]
    lines += [f"| {b} | {v['role']} | {v['demand']} | {v['spilled']} | {v['wasted']} |"
              for b, v in top]
    lines += _security_markdown(r.get("security"))
    return "\n".join(lines) + "\n"


def _security_markdown(sec: dict[str, Any] | None) -> list[str]:
    if sec is None:
        return ["", "## Security", "", "No config authenticates links or confines tree "
                "children: every link is up and carries everything (the current run)."]
    lines = ["", "## Security (applied to the current run)", "",
             "Logins: " + (", ".join(f"{n} by {m}" for m, n in sorted(sec["logins"].items()))
                           or "none") + f"; refused: {len(sec['links_refused'])}.", ""]
    if sec["links_refused"]:
        lines += ["| link refused | connector | user | reason |", "|---|---|---|---|"]
        lines += [f"| {x['dialer']} -> {x['acceptor']} | {x['connector']} | "
                  f"{x['user'] or '-'} | {x['reason']} |" for x in sec["links_refused"][:50]]
        lines.append("")
    if sec["denied"]:
        lines += ["| at broker | from link | denied | destination | reason |",
                  "|---|---|---|---|---|"]
        lines += [f"| {x['broker']} | {x['link']} | {x['permission']} | {x['dst']} | "
                  f"{x['reason']} |" for x in sec["denied"][:50]]
        lines.append("")
    w = sec["without_security"]["messages"]
    lines.append(f"Routes the security config refuses (delivered without it, stranded with "
                 f"it): {len(sec['routes_refused'])}; without security "
                 f"{w['delivered']} / {w['sent']} messages would be delivered.")
    if sec["routes_refused"]:
        lines += ["", "| from | destination | consumer at | messages | waits at |",
                  "|---|---|---|---|---|"]
        lines += [f"| {x['from']} | {x['dst']} | {x['consumer_at'] or '-'} | {x['messages']} "
                  f"| {x['example']['waits_at'] or '-'} |" for x in sec["routes_refused"][:50]]
    return lines


def emit_tree(est: EstateConfigs, tree: Tree, out: str | Path) -> tuple[list[Path], list[str]]:
    """Tree configs for every broker: the mesh connectors replaced by one tree connector
    to the parent.  Returns the files and notes (addresses that need checking)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dialed: dict[tuple[str, str], Address] = {}
    for link in est.links:
        if link.address is not None:
            dialed[(link.dialer, link.acceptor)] = link.address
    notes: list[str] = []
    written = []
    for bid in tree.order:
        c = est.configs[bid]
        role = tree.role(bid)
        parent = tree.parent[bid]
        tc = None
        if parent is not None:
            addr = dialed.get((bid, parent))
            if addr is None:
                listen = est.configs[parent].broker.listen
                a = _addr(listen[0]) if listen else Address(parent, 61616)
                host = parent if a.host.lower() in WILDCARD_HOSTS - {"localhost", "127.0.0.1",
                                                                     "::1"} else a.host
                addr = Address(host, a.port)
                if host == parent:
                    notes.append(f"{bid}: parent {parent} listens on a wildcard address; "
                                 f"assumed host {parent!r}, check it")
            scheme = "ssl" if any(u.startswith("ssl://") for u in
                                  est.configs[parent].broker.listen) else "tcp"
            host = f"[{addr.host}]" if ":" in addr.host else addr.host
            # credentials of the connector that dialed the parent carry over
            creds = next(((nc.username, nc.password) for link in est.links
                          if link.dialer == bid and link.acceptor == parent
                          for nc in c.network_connectors
                          if nc.name == link.connector and nc.username), ("", ""))
            tc = TreeConnectorConfig(uri=f"{scheme}://{host}:{addr.port}",
                                     node_type="leaf" if role == "leaf" else "branch",
                                     username=creds[0], password=creds[1])
        new = replace(c, network_connectors=(), tree_connector=tc,
                      broker=replace(c.broker, accept_tree_children=role != "leaf",
                                     data_dir=f"data/{bid}"))
        path = out / f"{bid}.toml"
        path.write_text(f"# proposed tree configuration ({role}) by treefed forecast\n"
                        + dump_config(new), encoding="utf-8")
        written.append(path)
    return written, notes
