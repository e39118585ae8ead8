"""The event-log schema: the contract between brokers, the scenario runner and the Spark job.

One JSON object per line. Every line carries ``ts`` (seconds; virtual time in the replay
engine), ``broker``, ``event`` and — in scenario runs — ``run``.  The fields of each event
are listed in ``EVENTS``; ``analysis/`` builds its explicit Spark schema from
``ALL_FIELDS`` so a log written by a deployed broker and one written by the scenario
runner read the same way.  Bump ``SCHEMA_VERSION`` whenever a field changes meaning.

This module is imported by node/, scenario/ and analysis/ and must stay dependency-free.
"""

from __future__ import annotations

__all__ = [
    "SCHEMA_VERSION",
    "COMMON_FIELDS",
    "EVENTS",
    "ALL_FIELDS",
    "FIELD_TYPES",
    "DROP_REASONS",
    "ROLES",
    "validate_event",
]

SCHEMA_VERSION = 1

#: Present on every line. ``run`` only in scenario runs; ``v`` is SCHEMA_VERSION.
COMMON_FIELDS: tuple[str, ...] = ("ts", "broker", "event", "run", "v")

#: event name -> the fields it carries besides COMMON_FIELDS.
EVENTS: dict[str, tuple[str, ...]] = {
    "advisory.sent": ("link", "peer", "consumer", "dst", "origin", "kind", "hops"),
    "advisory.received": ("link", "peer", "consumer", "dst", "origin", "kind", "hops"),
    "advisory.dropped": ("link", "peer", "consumer", "dst", "origin", "kind", "reason"),
    "demand.created": ("link", "peer", "consumer", "dst", "origin", "priority", "conduit"),
    "demand.removed": ("link", "peer", "consumer", "dst", "origin", "priority", "conduit"),
    "consumer.added": ("consumer", "dst"),
    "consumer.removed": ("consumer", "dst"),
    "message.produced": ("msg", "dst"),
    "message.forwarded": ("msg", "dst", "link", "peer", "hops"),
    "message.delivered": ("msg", "dst", "consumer"),
    "message.dropped": ("msg", "dst", "reason"),
    "message.stranded": ("msg", "dst"),
    # a broker's log: refusals of one (link, peer, reason) in one interval beyond the
    # first (which is logged as advisory.dropped), with that first one's fields
    "advisory.dropped.summary": ("link", "peer", "reason", "count", "interval",
                                 "consumer", "dst", "origin"),
    "link.up": ("link", "peer", "connector", "role"),
    "link.down": ("link", "peer", "connector", "role"),
    # a link refused after the hello exchange (tree validation, bad options)
    "link.refused": ("link", "peer", "connector", "role", "reason"),
    "broker.info": ("role", "node_type", "parent"),
    # a frame refused by permissions or tree scope (security/guard.py); once per
    # (connection, permission, destination)
    "security.denied": ("conn", "user", "permission", "dst", "reason"),
    "run.started": ("scenario", "mode", "params", "brokers", "links", "engine"),
    "run.finished": ("scenario", "mode", "params", "brokers", "links", "engine"),
}

#: Spark-friendly type of every field ("string", "long", "double", "boolean").
#: ``params`` is a JSON-encoded string so the schema stays flat.
FIELD_TYPES: dict[str, str] = {
    "ts": "double",
    "broker": "string",
    "event": "string",
    "run": "string",
    "v": "long",
    "link": "string",
    "peer": "string",
    "consumer": "string",
    "dst": "string",
    "origin": "string",
    "kind": "string",
    "hops": "long",
    "reason": "string",
    "priority": "long",
    "conduit": "boolean",
    "msg": "string",
    "connector": "string",
    "role": "string",
    "node_type": "string",
    "parent": "string",
    "scenario": "string",
    "mode": "string",
    "params": "string",
    "brokers": "long",
    "links": "long",
    "engine": "string",
    "conn": "string",
    "user": "string",
    "permission": "string",
    "count": "long",
    "interval": "double",
}

ALL_FIELDS: tuple[str, ...] = tuple(FIELD_TYPES)

#: Why an advisory was refused (``advisory.dropped.reason``).
DROP_REASONS = ("ttl", "loop", "filter", "tree_rule", "duplicate", "limit", "malformed",
                "forbidden")

#: Broker roles in ``broker.info.role`` / ``link.*.role``: position in the estate.
ROLES = ("root", "branch", "leaf", "mesh")

_PY_TYPES = {"double": (int, float), "long": (int,), "string": (str,), "boolean": (bool,)}


def validate_event(record: dict) -> list[str]:
    """Return the problems with one decoded log line (empty list when it is valid)."""
    problems: list[str] = []
    name = record.get("event")
    if name not in EVENTS:
        return [f"unknown event {name!r}"]
    for field in ("ts", "broker"):
        if field not in record:
            problems.append(f"{name}: missing {field}")
    for field in EVENTS[name]:
        if field not in record:
            problems.append(f"{name}: missing {field}")
    for field, value in record.items():
        kind = FIELD_TYPES.get(field)
        if kind is None:
            continue
        if value is None:
            continue
        ok = _PY_TYPES[kind]
        if kind in ("long", "double") and isinstance(value, bool):
            problems.append(f"{name}: {field} should be {kind}")
        elif not isinstance(value, ok):
            problems.append(f"{name}: {field} should be {kind}, not {type(value).__name__}")
    return problems
