"""Sharing: the memory-saving tables many Sites may share, owned by whoever runs them.

Theory of operation
-------------------
A mesh estate holds millions of interest instances, and the replay engine hands one
advisory frame object to every link it is offered on.  Four things are therefore worth
sharing between the Sites of one process: path tuples (every sibling store holds the
same few), interest keys ``(consumer, path)``, demand sub ids ``"d:<n>"``, the verdict
"this frame object is well-formed" and the log fields that every receiver of one
fan-out logs alike (``SharedFields``: the event writer renders them once).  Link
settings too: every link of an estate carries the same options, so a peer's options
and a connector's settings are validated once per distinct value (``link_settings``,
``new_settings``; the settings are frozen).

These used to be module-level dictionaries in ``bridge.py``; they now live in one
``Sharing`` object.  The shell that runs Sites owns it: a ``BrokerNode`` makes its own,
the replay engine, the memory engine and ``testing.Estate`` hand one to all of their
Sites.  Nothing here has a meaning of its own -- a table that fills up is cleared, and
an empty one only costs memory -- so a Site behaves the same with a private or a shared
``Sharing``.

Identity-keyed tables (``checked``, ``received``, ``demand``) keep the keyed object in
the value, so its ``id()`` cannot be reused by another object while it is listed.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

from treefed.core.actions import SharedFields
from treefed.federation.settings import LinkSettings, options_key

__all__ = ["Sharing", "SHARED_LIMIT", "IDENTITY_LIMIT", "SETTINGS_LIMIT"]

#: entries before a value table is cleared (sharing is an optimisation, not a meaning)
SHARED_LIMIT = 1 << 20
#: entries before an identity-keyed table is cleared
IDENTITY_LIMIT = 1 << 15
#: entries before a link settings table is cleared (each entry: distinct options)
SETTINGS_LIMIT = 1 << 8

_intern = sys.intern


class Sharing:
    """Tables shared by the Sites of one process (see the module docstring)."""

    __slots__ = ("paths", "keys", "sub_ids", "checked", "received", "demand", "settings",
                 "built")

    def __init__(self) -> None:
        self.paths: dict[tuple, tuple] = {}       # path tuple -> its one shared instance
        self.keys: dict[tuple, tuple] = {}        # (consumer, path) -> shared instance
        self.sub_ids: list[str] = []              # n -> "d:<n>"
        self.checked: dict[int, Any] = {}         # id(frame) -> frame found well-formed
        self.received: dict[int, tuple] = {}      # id(frame) -> (frame, link, peer, fields)
        self.demand: dict[int, tuple] = {}        # id(key) -> (key, ..., fields)
        self.settings: dict[tuple, LinkSettings] = {}   # options_key -> from_options'
        self.built: dict[tuple, LinkSettings] = {}      # options_key -> LinkSettings(...)

    def path(self, path: tuple[str, ...]) -> tuple[str, ...]:
        """The shared instance of ``path`` (equal tuples, one object)."""
        paths = self.paths
        found = paths.get(path)
        if found is None:
            if len(paths) >= SHARED_LIMIT:
                paths.clear()
            found = paths[path] = tuple(map(_intern, path))
        return found

    def key(self, consumer: str, path: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
        """The shared interest key ``(consumer, path)``."""
        keys = self.keys
        key = (consumer, path)
        found = keys.get(key)
        if found is None:
            if len(keys) >= SHARED_LIMIT:
                keys.clear()
            found = keys[key] = (_intern(consumer), self.path(path))
        return found

    def sub_id(self, n: int) -> str:
        """Demand sub id number ``n`` (``"d:<n>"``), one string for every link."""
        ids = self.sub_ids
        if n >= len(ids):
            ids.extend(f"d:{i}" for i in range(len(ids), n + 1 + (n >> 1)))
        return ids[n]

    def link_settings(self, options: Mapping[str, Any], **overrides: Any) -> LinkSettings:
        """``LinkSettings.from_options(options, **overrides)``, validated once per distinct
        arguments (settings are frozen: every link of an estate's sites sends the same
        options, and they share one object).  Raises ConfigError as it does."""
        key = options_key(options, overrides)
        table = self.settings
        found = table.get(key) if key is not None else None
        if found is None:
            found = LinkSettings.from_options(options, **overrides)
            if key is not None:
                if len(table) >= SETTINGS_LIMIT:
                    table.clear()
                table[key] = found
        return found

    def new_settings(self, **kwargs: Any) -> LinkSettings:
        """``LinkSettings(**kwargs)``, validated once per distinct arguments (a connector's
        config builds its settings with it: every site of a shape has the same)."""
        key = options_key(kwargs, {})
        table = self.built
        found = table.get(key) if key is not None else None
        if found is None:
            found = LinkSettings(**kwargs)
            if key is not None:
                if len(table) >= SETTINGS_LIMIT:
                    table.clear()
                table[key] = found
        return found

    def malformed(self, adv: Any, check: Any) -> bool:
        """``check(adv)``, run once per frame object while it is listed."""
        checked = self.checked
        if checked.get(id(adv)) is adv:
            return False
        if check(adv):
            return True
        if len(checked) >= IDENTITY_LIMIT:
            checked.clear()
        checked[id(adv)] = adv
        return False

    def received_fields(self, adv: Any, link: str, peer: str) -> SharedFields:
        """``advisory.received`` fields, one dict for every receiver of ``adv`` over a
        link of the same name from the same peer."""
        table = self.received
        hit = table.get(id(adv))
        if hit is not None and hit[0] is adv and hit[1] == link and hit[2] == peer:
            return hit[3]
        fields = SharedFields(link=link, peer=peer, consumer=adv.consumer, dst=adv.dst,
                              origin=adv.origin, kind=adv.kind, hops=len(adv.path) + 1)
        if len(table) >= IDENTITY_LIMIT:
            table.clear()
        table[id(adv)] = (adv, link, peer, fields)
        return fields

    def demand_fields(self, key: tuple, event: str, link: str, peer: str, consumer: str,
                      dst: str, origin: str, priority: int, conduit: bool) -> SharedFields:
        """``demand.created`` / ``demand.removed`` fields, shared between the sites that
        learn the same interest instance (one key object everywhere) over links of the
        same name and peer."""
        table = self.demand
        hit = table.get(id(key))
        if hit is not None and hit[0] is key and hit[1] == event and hit[2] == link \
                and hit[3] == peer and hit[4] == dst and hit[5] == priority \
                and hit[6] is conduit:
            return hit[7]
        fields = SharedFields(link=link, peer=peer, consumer=consumer, dst=dst,
                              origin=origin, priority=priority, conduit=conduit)
        if len(table) >= IDENTITY_LIMIT:
            table.clear()
        table[id(key)] = (key, event, link, peer, dst, priority, conduit, fields)
        return fields
