"""Temporary destinations on broker links (issue #12, defect 3).

Theory of operation
-------------------
A temporary destination (``temp-queue://`` / ``temp-topic://``) belongs to the one client
connection that created it; its consumer's interest travels the federation like any
other so that replies find their way back.  Nobody else may consume it, so on a link:

* interest in a *wildcard* over temp names is refused everywhere (both connectors): it
  could only be an attempt to read other connections' replies;
* interest in a temp name that a client of *this* broker owns is refused (the core also
  refuses such demand): the rightful consumer is here, not behind the peer;
* interest in a temp name for a consumer of another connection than the one whose
  interest already holds it (consumer ids ``<origin>/<conn>/<sub>``: ``Site.temp_owners``)
  is refused, on both connectors -- mesh routes may bring the owner's interest several
  times, never another connection's;
* on a tree link, the first route a temp name's interest arrived by owns it: a child may
  advertise a temp name only while no other connection here -- a local client, the
  parent link or another child link -- holds interest in it.  A child therefore can
  advertise only temp destinations created in its own subtree (their interest reaches
  each ancestor from below before anything else can name them: the names are
  unguessable, and a name learned from a ``reply_to`` header or from interest flowing
  down is already held by its rightful route).  Mesh links may legitimately learn one
  temp consumer over several routes (a triangle), so that rule is the tree's.

Refusals are ``forbidden`` (an ``advisory.dropped`` reason).  Pure: reads the Site and
its core broker, changes nothing.
"""

from __future__ import annotations

from typing import Any

from treefed.core.destinations import is_wildcard
from treefed.wire.frames import Error

__all__ = ["temp_refusal", "refused_error"]


def refused_error(adv: Any) -> Error:
    """The Error frame telling the peer which advisory was refused (ref = consumer)."""
    return Error("not_authorized", f"interest in temporary destination {adv.dst} refused: "
                                   "it belongs to a connection elsewhere (or is a "
                                   "wildcard over temporary names)", adv.consumer)


def temp_refusal(bridge: Any, dst: str, *, tree: bool, consumer: str = "") -> str | None:
    """Why ``bridge``'s peer may not hold interest in the temp destination ``dst``
    (canonical, ``temp-`` prefixed) for ``consumer``, or None."""
    if is_wildcard(dst):
        return "forbidden"
    site = bridge.site
    broker = site.broker
    if broker.temp_owner(dst) is not None:
        return "forbidden"
    held = site.temp_owners.get(dst)
    if held is not None and consumer and held[0] != consumer.rpartition("/")[0]:
        return "forbidden"   # interest of another connection holds the name already
    if tree:
        # by peer id, not conn: a child that reconnected before its old link was found
        # dead re-advertises over the new conn while the old one still holds the demand
        peer = bridge.peer
        for info in broker.consumers_for(dst):
            if info.peer != peer:
                return "forbidden"
    return None
