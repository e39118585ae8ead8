"""``treefed map ROOT_URI``: the estate as its brokers see it, walked from the root down.

Theory of operation
-------------------
Discovery (``discover``) asks the root for its statistics over treefed's own protocol
(``stat``: admin-protected like every broker-wide view) and follows its links: a link
we dialed is reached at the endpoint we dialed, an accepted link at the listeners its
peer announced in its hello (``listen``; a wildcard host is replaced by the address the
peer connected from).  Every broker is asked once (by broker id), ``concurrency`` at a
time, each within ``timeout`` — so 4,000 stores are walked in parallel and a broker that
does not answer is shown ``unreachable`` with its subtree unknown instead of stalling the
walk.  Links that are down show as such: a connector the broker keeps dialing
(``waiting`` / ``failed`` with its last error) and an accepted link that was lost
(``lost_links``: the peer used to dial in and stopped).

Rendering is pure (``render_text`` / ``render_dot`` / ``render_html``, and the JSON is the
``EstateMap`` itself): a tree is printed from the root through child lanes; mesh links
and links to brokers already printed are listed under the broker as ``~ peer``.
"""

from __future__ import annotations

import html
import json
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import trio

__all__ = ["BrokerView", "EstateMap", "discover", "render_text", "render_dot",
           "render_html", "DEFAULT_CONCURRENCY", "DEFAULT_TIMEOUT"]

DEFAULT_CONCURRENCY = 64
DEFAULT_TIMEOUT = 5.0
_WILDCARD = ("0.0.0.0", "::", "[::]", "")

Stat = Callable[[str], Awaitable[dict]]


@dataclass
class BrokerView:
    """One broker as the walk found it."""

    uri: str                            # where it was asked
    broker: str | None = None           # its id (None: never answered)
    node_type: str | None = None
    reachable: bool = False
    error: str | None = None            # why it was unreachable
    links: list[dict] = field(default_factory=list)   # see _links()
    destinations: int = 0
    connections: int = 0

    def as_dict(self) -> dict:
        return {"uri": self.uri, "broker": self.broker, "node_type": self.node_type,
                "reachable": self.reachable, "error": self.error, "links": self.links,
                "destinations": self.destinations, "connections": self.connections}


@dataclass
class EstateMap:
    root: str                           # the root's URI
    brokers: dict[str, BrokerView]      # key: broker id, or "?<uri>" when unreachable
    root_key: str | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"root": self.root, "root_broker": self.root_key,
                "seconds": round(self.seconds, 3), "brokers": len(self.brokers),
                "unreachable": sum(1 for b in self.brokers.values() if not b.reachable),
                "estate": {k: v.as_dict() for k, v in self.brokers.items()}}


def _reach(listen: list, remote: str | None) -> str | None:
    """The first announced listener, with a wildcard host swapped for the peer's
    address as we saw it."""
    for uri in listen or ():
        scheme, sep, rest = uri.partition("://")
        host, _, port = rest.rpartition(":")
        if host in _WILDCARD and remote:
            host = remote.rpartition(":")[0]
        return f"{scheme}{sep}{host}:{port}"
    return None


def _links(stats: dict) -> list[dict]:
    """A broker's links (up, dialing, lost) with where each peer can be reached."""
    conns = {c["conn"]: c for c in stats.get("conns", ()) if c.get("kind") == "link"}
    links: list[dict] = []
    dialed_conns = set()
    for d in stats.get("connectors", ()):
        link = next((l for l in stats.get("links", ()) if l["conn"] == d.get("conn")), None)
        dialed_conns.add(d.get("conn"))
        links.append({"peer": d.get("peer"), "link": d.get("name"),
                      "connector": d.get("connector"),
                      "lane": link["lane"] if link else
                      ("parent" if d.get("connector") == "tree" else "mesh"),
                      "state": d.get("state"), "dialed": True,
                      "reach": d.get("endpoint") or d.get("uri"),
                      "last_error": d.get("last_error"),
                      "demand": link["demand"] if link else 0,
                      "remote_interest": link["remote_interest"] if link else 0})
    for link in stats.get("links", ()):
        if link["conn"] in dialed_conns:
            continue
        c = conns.get(link["conn"], {})
        links.append({"peer": link["peer"], "link": link["link"],
                      "connector": link["connector"], "lane": link["lane"],
                      "state": "operational", "dialed": False,
                      "reach": _reach(c.get("listen"), c.get("remote")),
                      "last_error": None, "demand": link["demand"],
                      "remote_interest": link["remote_interest"]})
    for lost in stats.get("lost_links", ()):
        links.append({"peer": lost["peer"], "link": lost.get("link"), "connector": None,
                      "lane": lost.get("lane") or "child", "state": "down",
                      "dialed": False, "reach": _reach(lost.get("listen"), lost.get("remote")),
                      "last_error": "link lost", "since": lost.get("since"),
                      "demand": 0, "remote_interest": 0})
    return links


async def discover(root_uri: str, stat: Stat, *, concurrency: int = DEFAULT_CONCURRENCY,
                   timeout: float = DEFAULT_TIMEOUT) -> EstateMap:
    """Walk the estate from ``root_uri``; ``stat(uri)`` returns a broker's statistics
    (raises, or takes longer than ``timeout``, when it cannot)."""
    began = time.monotonic()
    brokers: dict[str, BrokerView] = {}
    asked: set[str] = set()             # broker ids (or uris) already scheduled
    limiter = trio.CapacityLimiter(concurrency)
    result = EstateMap(root_uri, brokers)

    async def visit(uri: str, expected: str | None, nursery: trio.Nursery,
                    is_root: bool = False) -> None:
        view = BrokerView(uri, broker=expected)
        async with limiter:
            try:
                with trio.fail_after(timeout):
                    stats = await stat(uri)
            except trio.TooSlowError:
                view.error = f"no answer within {timeout:g} s"
            except Exception as exc:   # noqa: BLE001 - any failure: this broker only
                view.error = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        if view.error is None:
            view.reachable = True
            view.broker = stats.get("broker") or expected
            view.node_type = stats.get("node_type")
            view.links = _links(stats)
            view.destinations = len(stats.get("destinations", ()))
            view.connections = len(stats.get("conns", ()))
        key = view.broker if view.broker is not None else f"?{uri}"
        if key in brokers and brokers[key].reachable:
            return   # reached twice under two addresses: keep the first
        brokers[key] = view
        if is_root:
            result.root_key = key
        if not view.reachable:
            return
        asked.add(key)
        for link in view.links:
            peer, reach = link["peer"], link["reach"]
            if peer is None or peer in asked:
                continue
            if link["lane"] == "parent" and not is_root:
                continue   # walking down: the parent is already known or not ours
            asked.add(peer)
            if reach is None:
                brokers[peer] = BrokerView("?", broker=peer,
                                           error="no address known (it announced none)")
                continue
            nursery.start_soon(visit, reach, peer, nursery)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(visit, root_uri, None, nursery, True)
    result.seconds = time.monotonic() - began
    return result


# --------------------------------------------------------------------------- rendering

def _link_text(link: dict) -> str:
    state = link["state"]
    text = f"[{state}] demand={link['demand']} interest={link['remote_interest']}"
    if state != "operational" and link.get("last_error"):
        text += f" ({link['last_error']})"
    return text


def _children(m: EstateMap, key: str) -> list[tuple[dict, str]]:
    view = m.brokers.get(key)
    if view is None:
        return []
    return [(link, link["peer"]) for link in view.links
            if link["lane"] == "child" and link["peer"] is not None]


def render_text(m: EstateMap) -> str:
    """An indented tree: each broker under the link that reaches it."""
    lines: list[str] = []
    printed: set[str] = set()

    def broker_line(key: str, prefix: str, via: dict | None) -> None:
        view = m.brokers.get(key)
        label = key
        if view is None:
            label += " (not walked)"
        elif not view.reachable:
            label += f" UNREACHABLE at {view.uri}: {view.error}"
        else:
            label += f" ({view.node_type}, {view.uri}, {view.destinations} destinations)"
        if via is not None:
            label += "  <- " + _link_text(via)
        lines.append(prefix + label)
        if key in printed:
            return
        printed.add(key)
        if view is None or not view.reachable:
            return
        for link in view.links:
            if link["lane"] != "child" and link["peer"] not in printed and \
                    link["lane"] == "mesh":
                lines.append(f"{prefix}  ~ {link['peer']} mesh {link['link']} "
                             + _link_text(link))
            elif link["lane"] == "parent" and key == m.root_key:
                lines.append(f"{prefix}  ^ {link['peer']} parent " + _link_text(link))
        for link, peer in _children(m, key):
            broker_line(peer, prefix + "  ", link)

    if m.root_key is not None:
        broker_line(m.root_key, "", None)
    for key in m.brokers:
        if key not in printed:
            broker_line(key, "", None)
    unreachable = sum(1 for b in m.brokers.values() if not b.reachable)
    lines.append(f"-- {len(m.brokers)} brokers, {unreachable} unreachable, "
                 f"walked in {m.seconds:.2f} s")
    return "\n".join(lines) + "\n"


def render_dot(m: EstateMap) -> str:
    """Graphviz: one node per broker, one edge per link (dashed and red when down)."""
    out = ["digraph estate {", "  rankdir=TB;", '  node [shape=box, fontname="monospace"];']
    for key, view in m.brokers.items():
        colour = "black" if view.reachable else "red"
        label = f"{key}\n{view.node_type or 'unreachable'}"
        out.append(f"  {json.dumps(key)} [label={json.dumps(label)}, color={colour}];")
    seen: set[tuple] = set()
    for key, view in m.brokers.items():
        for link in view.links:
            peer = link["peer"]
            if peer is None or link["lane"] == "parent":
                continue
            edge = tuple(sorted((key, peer))) if link["lane"] == "mesh" else (key, peer)
            if edge in seen:
                continue
            seen.add(edge)
            style = "solid" if link["state"] == "operational" else "dashed, color=red"
            label = f"{link['state']} d={link['demand']}"
            arrow = ", dir=none" if link["lane"] == "mesh" else ""
            out.append(f"  {json.dumps(key)} -> {json.dumps(peer)} "
                       f"[label={json.dumps(label)}, style=\"{style}\"{arrow}];"
                       .replace('style="dashed, color=red"', 'style=dashed, color=red'))
    out.append("}")
    return "\n".join(out) + "\n"


def render_html(m: EstateMap) -> str:
    """A self-contained page (no script, no external file): the tree as nested lists,
    down links and unreachable brokers in red, the JSON at the bottom."""
    printed: set[str] = set()

    def item(key: str, via: dict | None) -> str:
        view = m.brokers.get(key)
        bad = view is None or not view.reachable
        text = html.escape(key)
        if view is not None and view.reachable:
            text += f" <small>{html.escape(str(view.node_type))} {html.escape(view.uri)}</small>"
        elif view is not None:
            text += f" <b>unreachable</b> <small>{html.escape(view.error or '')}</small>"
        if via is not None:
            down = via["state"] != "operational"
            text = (f"<span class={'down' if down else 'up'}>"
                    f"{html.escape(_link_text(via))}</span> " + text)
        body = ""
        if key not in printed and not bad:
            printed.add(key)
            kids = [item(peer, link) for link, peer in _children(m, key)]
            mesh = [f"<li class=mesh>~ {html.escape(str(l['peer']))} "
                    f"{html.escape(_link_text(l))}</li>"
                    for l in view.links if l["lane"] == "mesh"]
            if kids or mesh:
                body = "<ul>" + "".join(mesh + kids) + "</ul>"
        return f"<li class={'bad' if bad else 'ok'}>{text}{body}</li>"

    roots = [m.root_key] if m.root_key else []
    tree = "".join(item(k, None) for k in roots)
    rest = "".join(item(k, None) for k in m.brokers if k not in printed and k not in roots)
    data = html.escape(json.dumps(m.as_dict(), indent=1))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>treefed estate {html.escape(m.root)}</title>
<style>
body {{ font-family: sans-serif; }} ul {{ list-style: none; padding-left: 1.4em; }}
.bad, .down {{ color: #b00; }} .up {{ color: #070; }} small {{ color: #666; }}
.mesh {{ color: #036; }} pre {{ background: #f4f4f4; padding: 1em; }}
</style></head><body>
<h1>treefed estate from {html.escape(m.root)}</h1>
<p>{len(m.brokers)} brokers, {sum(1 for b in m.brokers.values() if not b.reachable)}
unreachable, walked in {m.seconds:.2f} s</p>
<ul>{tree}{rest}</ul>
<details><summary>JSON</summary><pre>{data}</pre></details>
</body></html>
"""
