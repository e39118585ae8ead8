"""Runtime changes to a running BrokerNode: mesh links added and removed, the config
file re-read (``treefed link``, ``treefed reload``, SIGHUP) — qpid-route's add/del.

Theory of operation
-------------------
Every function here runs in the node's site task (an ``Admin`` frame is handled there,
SIGHUP is handed over to it), so a change never races a batch.  Each one *checks
everything first and then applies*: a request that cannot be honoured raises
``LocalError`` with the reason and changes nothing.

* ``link_add``: the arguments are a ``[[network_connector]]`` table, validated by the
  config parser itself; the new dialers start at once.
* ``link_del``: the named connector stops dialing; its live link is closed with a
  ``Bye`` and the Site takes it down as for any lost link — messages forwarded and not yet
  acked go back on their queues (store-and-forward: nothing is lost, a copy that did
  arrive is dropped as a duplicate later).
* ``reload``: re-read the config file.  What can change live is applied — network
  connectors (by name: removed, added, changed = removed then added), policies, users and
  permissions, log level and per-message events; anything else that differs (broker id,
  data_dir, listeners, heartbeats, the tree connector, TLS, the monitor...) refuses the
  whole reload, naming every key, so a half-applied config never exists.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from treefed.config import BrokerConfig, load_config, parse_config
from treefed.errors import ConfigError, LocalError

__all__ = ["link_add", "link_del", "link_list", "reload", "LIVE"]

#: What ``reload`` applies live; every other difference refuses the reload.
LIVE = ("network_connectors", "policies", "security.users", "security.permissions",
        "security.failure_delay", "security.max_failure_delay",
        "security.temp_destinations", "logging.level", "logging.message_events")


def link_list(node: Any) -> dict:
    return {"links": [d.status() for d in node.dialers]}


def _connector_from(node: Any, table: dict) -> Any:
    """A ``[[network_connector]]`` table -> NetworkConnectorConfig (the parser's checks)."""
    if not isinstance(table, dict):
        raise LocalError("link.add wants a table of connector options", code="bad_request")
    doc = {"broker": {"id": node.broker_id}, "network_connector": [table]}
    try:
        return parse_config(doc).network_connectors[0]
    except ConfigError as exc:
        raise LocalError(f"bad link: {exc.message}", code="bad_request") from None


def link_add(node: Any, table: dict) -> dict:
    nc = _connector_from(node, table)
    if any(d.settings.name == nc.name for d in node.dialers):
        raise LocalError(f"a link named {nc.name!r} exists already: delete it first",
                         code="bad_request")
    added = node.add_connector(nc)
    node.log.info("admin.link_added", link=nc.name, uri=nc.uri)
    return {"added": [d.status() for d in added]}


def link_del(node: Any, name: str, now: float, actions: list) -> dict:
    if not isinstance(name, str) or not any(d.settings.name == name and
                                            d.settings.kind == "mesh"
                                            for d in node.dialers):
        known = sorted({d.settings.name for d in node.dialers if d.settings.kind == "mesh"})
        raise LocalError(f"no network connector named {name!r} (have: "
                         f"{', '.join(known) or 'none'})", code="bad_request")
    removed = node.remove_connector(name, now, actions)
    node.log.info("admin.link_removed", link=name)
    return {"removed": removed}


def _differences(old: Any, new: Any, prefix: str) -> list[str]:
    return [f"{prefix}{f.name}" for f in dataclasses.fields(old)
            if getattr(old, f.name) != getattr(new, f.name)]


def _refusals(old: BrokerConfig, new: BrokerConfig) -> list[str]:
    keys = _differences(old.broker, new.broker, "broker.")
    keys += [k for k in _differences(old.logging, new.logging, "logging.") if k not in LIVE]
    keys += [k for k in _differences(old.security, new.security, "security.")
             if k not in LIVE]
    if old.tree_connector != new.tree_connector:
        keys.append("tree_connector")
    if old.monitor != new.monitor:
        keys.append("monitor")
    return keys


def reload(node: Any, now: float, actions: list, path: str | None = None) -> dict:
    """Re-read ``path`` (default: the file the broker started from) and apply it."""
    path = path or node.config.source_path
    if not path:
        raise LocalError("this broker was not started from a config file: nothing to "
                         "re-read", code="bad_request")
    try:
        new = load_config(path)
    except ConfigError as exc:
        notes = "".join(f" ({n})" for n in getattr(exc, "__notes__", ()))
        raise LocalError(f"reload refused, nothing changed: {exc.message}{notes}",
                         code="reload_refused") from None
    old = node.config
    refused = _refusals(old, new)
    if refused:
        raise LocalError("reload refused, nothing changed: these cannot change while the "
                         f"broker runs (restart it): {', '.join(refused)}",
                         code="reload_refused")
    changed: list[str] = []
    before = {nc.name: nc for nc in old.network_connectors}
    after = {nc.name: nc for nc in new.network_connectors}
    for name, nc in before.items():
        if after.get(name) != nc:
            node.remove_connector(name, now, actions)
            changed.append(f"network_connector {name} removed")
    for name, nc in after.items():
        if before.get(name) != nc:
            node.add_connector(nc)
            changed.append(f"network_connector {name} added")
    if old.policies != new.policies:
        node.site.broker.set_policies(new.policy_set())
        changed.append("policies")
    if old.security != new.security:
        node.set_security(new.security)
        changed.append("security")
    if old.logging != new.logging:
        node.set_logging(new.logging)
        changed.append("logging")
    node.config = dataclasses.replace(new, network_connectors=tuple(
        nc for nc in node.config.network_connectors))
    node.log.info("admin.reloaded", path=path, changed=changed)
    return {"reloaded": path, "changed": changed}
