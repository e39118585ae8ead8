"""Handshake: local settings + the peer's hello -> a link plan, or the reason it is refused.

Theory of operation
-------------------
When two brokers have exchanged ``Hello`` frames, each side decides on its own whether
the link may come up and what it will do.  That decision is a pure function of

* our side: the connector settings (the dialer's own, or the listener's), our broker
  id, our tree position (``TreeSettings``; None at the root), our ancestry, whether we
  accept tree children, whether a parent link is already up and which tree children
  are linked now;
* the peer's ``Hello``: its role, broker id, connector kind, node type, ancestry, link
  name and -- when it dialed -- its connector options.

``plan_link`` returns a ``LinkPlan`` (what ``Site.link_up`` builds the ``Bridge`` from) or
a ``Refusal`` (the Site answers with an ``Error``, closes and logs ``link.refused``).

Rules (DESIGN §4): the dialing side's settings rule the link, the accepting side
rebuilds them from ``Hello.options`` but keeps its own protective limit when the
dialer's is higher; a tree link needs a broker on the other end with a tree connector,
one root, no cycle, a leaf never accepts children, a site has one parent, and a child
id may be linked only once at a time (a second link claiming it would take over the
first one's subtree).  A mesh link's direction flags follow ActiveMQ: the dialer
forwards messages and takes interest, the acceptor advertises; duplex does both.

``listener_settings`` picks the accepting side's settings from a dialer's hello before
the plan is made (the node has no per-connector listener configuration).

Nothing here has state or does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Collection, Sequence

from treefed.errors import TreefedError
from treefed.federation.settings import KINDS, LinkSettings, TreeSettings
from treefed.federation.sharing import Sharing
from treefed.wire.frames import Hello

__all__ = ["LinkPlan", "Refusal", "plan_link", "check_tree_hello", "listener_settings"]


@dataclass(frozen=True, slots=True)
class LinkPlan:
    """What a link that may come up will do."""

    settings: LinkSettings    # the rules of the link (the dialer's)
    lane: str                 # "mesh" | "parent" | "child" (routing.LANES)
    forwards: bool            # messages flow to the peer (static includes, fallback)
    accepts: bool             # we take its advisories and hold demand for it
    advertises: bool          # we send it our interest
    peer_role: str            # the peer's position: root | branch | leaf | mesh
    tree: TreeSettings | None  # our tree position once the link is up (a dialer without
    #                            TreeSettings takes its connector's node type)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why the link must not come up (``settings``: for the link.refused line)."""

    settings: LinkSettings
    why: str


def check_tree_hello(site_settings: TreeSettings | None, hello: Hello, *, me: str,
                     dialed: bool, ancestry: Sequence[str] = (),
                     accept_children: bool = True) -> str | None:
    """Why a tree link with the sender of ``hello`` must be refused, or None.

    ``dialed``: we opened the link, so the peer is our parent; otherwise it offers
    itself as our child.  ``ancestry``: our own [parent, grandparent, ...].  A site with
    no TreeSettings is the root."""
    if hello.role != "broker" or not hello.broker_id:
        return "peer is not a broker"
    if hello.connector != "tree":
        return f"{hello.broker_id} is a {hello.connector or 'plain'} peer on a tree link"
    ours = site_settings.node_type if site_settings is not None else "root"
    if hello.broker_id == me:
        return "cycle: a broker cannot link to itself"
    if dialed:
        if ours == "root":
            return "a root has no parent"
        if hello.node_type not in ("branch", "root"):
            return f"parent {hello.broker_id} is a {hello.node_type}, not a branch or root"
        if me in hello.ancestry:
            return f"cycle: {me} is an ancestor of {hello.broker_id}"
        return None
    if not accept_children:
        return "this site does not accept tree children"
    if ours == "leaf":
        return "a leaf accepts no children"
    if hello.node_type == "root":
        return f"second root: {hello.broker_id} declares itself root"
    if hello.node_type not in ("leaf", "branch"):
        return f"child node_type must be leaf or branch, not {hello.node_type!r}"
    if hello.broker_id in ancestry:
        return f"cycle: {hello.broker_id} is an ancestor of {me}"
    return None


def listener_settings(hello: Hello, *, accept_mesh: bool = True,
                      sharing: Sharing | None = None) -> LinkSettings | str:
    """The accepting side's settings for a dialer's ``hello``, or why it is refused.
    ``sharing``: equal settings validated once (``Sharing.new_settings``)."""
    kind = hello.connector if hello.connector in KINDS else "mesh"
    if kind == "mesh" and not accept_mesh:
        return "this broker accepts no mesh links"
    new_settings = sharing.new_settings if sharing is not None else LinkSettings
    return new_settings(kind=kind, name=hello.link_name or kind)


def plan_link(local: LinkSettings, remote: Hello, *, me: str, dialed: bool,
              tree: TreeSettings | None, ancestry: Sequence[str] = (),
              accept_children: bool = True, has_parent: bool = False,
              children: Collection[str] = (),
              sharing: Sharing | None = None) -> LinkPlan | Refusal:
    """Decide a broker link (see the module docstring).  ``children``: broker ids linked
    below us now (as our tree children or inside a child's subtree).  ``sharing``: where
    the dialer's options, once validated, are kept for the next link that sends them."""
    settings = local
    if not dialed:
        if local.kind == "tree" and remote.connector != "tree":
            return Refusal(local, "mesh peer on a tree link")
        try:
            link = dict(kind=remote.connector or local.kind,
                        name=remote.link_name or local.name,
                        duplex=remote.duplex, node_type=None)
            rebuild = sharing.link_settings if sharing is not None \
                else LinkSettings.from_options
            settings = rebuild(remote.options, **link) \
                if remote.options else replace(local, **link)
            # a protective limit is ours to set: the dialer may only lower it
            cap = min(settings.max_demand_per_link, local.max_demand_per_link)
            if cap != settings.max_demand_per_link:
                settings = replace(settings, max_demand_per_link=cap)
        except TreefedError as exc:
            return Refusal(local, f"bad connector options: {exc}")
    if remote.role != "broker" or not remote.broker_id:
        return Refusal(settings, "peer is not a broker")
    if settings.kind != "tree":
        forwards = settings.duplex or dialed
        return LinkPlan(settings, "mesh", forwards=forwards,
                        accepts=forwards and not settings.static_bridge,
                        advertises=(settings.duplex or not dialed)
                        and not settings.static_bridge,
                        peer_role="mesh", tree=tree)
    if dialed and tree is None:  # a site without TreeSettings takes the connector's
        tree = TreeSettings(settings.node_type or "leaf", settings.route_unknown_up,
                            bool(settings.summary_budget))
    why = check_tree_hello(tree, remote, me=me, dialed=dialed, ancestry=ancestry,
                           accept_children=accept_children)
    if why is None and dialed and has_parent:
        why = "already linked to a parent"
    if why is None and not dialed and remote.broker_id in children:
        why = f"broker {remote.broker_id} is already linked below {me}"
    if why is not None:
        return Refusal(settings, why)
    return LinkPlan(settings, "parent" if dialed else "child", forwards=True, accepts=True,
                    advertises=True, peer_role=remote.node_type or "leaf", tree=tree)
