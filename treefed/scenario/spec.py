"""Scenario files: TOML -> a validated, frozen ``Scenario`` before anything runs.

Theory of operation
-------------------
A scenario names an estate, the connector modes to compare on it, a workload and a
timeline.  ``parse_scenario`` checks all of it up front and raises
``ConfigError(key, problem)`` with the dotted key at fault (arrays indexed from 0), so a
typo never surfaces an hour into a 4 x 1,000-store run.  It reuses config.py's field
tables, so a mesh option is spelt and checked exactly as in a broker config.  The
timeline is validated against the topology *as it will be at that moment* (after any
earlier ``insert_layer``).  Pure: no I/O except ``load_scenario`` reading the file.

File format::

    name = "retail-small"           # required; [A-Za-z0-9._-]+ (used in run ids)
    description = "..."             # optional
    seed = 7                        # integer >= 0 (default 0): engines seed random.Random

    [topology]                      # every count is per parent (see topology.py)
    regions = 2
    stores_per_region = 5
    layers = [{name = "country", count = 4}]   # optional, between HQ and the regions

    [[mode]]                        # one run per mode; at least one
    connector = "tree"              # tree: route_unknown_up, max_interest_per_child
    [[mode]]
    connector = "mesh"              # mesh: any [[network_connector]] option but name/uri
    network_ttl = 2
    duplex = true
    label = "mesh-ttl2"             # optional; derived: "tree", "mesh-ttl<N>", "mesh-ttlinf"

    [workload]                      # all optional; consumers exist from the start
    store_queue_consumers = true    # consumer on queue://Store.<store id>.Incoming per store
    store_topic_subscribers = false # subscriber on topic://Broadcast.Prices per store
    hq_consumers = ["queue://HQ.Incoming"]               # placeholder: {broker}
    region_consumers = ["queue://Region.{region}.Incoming"]  # {region}, {broker}
    hq_to_stores = 1                # messages HQ -> each store's queue
    stores_to_hq = 1                # messages each store -> queue://HQ.Incoming
    store_to_store = 10             # messages between random (seeded) store pairs
    topic_broadcasts = 1            # messages HQ -> topic://Broadcast.Prices
    persistent = false
    body_bytes = 64

    [[timeline]]                    # in time order; ``at`` in (virtual) seconds
    at = 5.0
    action = "cut_link"
    target = "store-r1-0001"        # a broker id or a glob ("store-r1-*")

Timeline actions and their keys (besides ``at``, ``action``):

    cut_link / restore_link    target             the link between target and its parent
    kill_broker                target             stop abruptly (as kill -9)
    restart_broker             target             start again (a running one: stop first)
    add_consumer               target, dst [, consumer, selector]
    remove_consumer            target, consumer | dst
    insert_layer               name, count [, target]   new layer below target (default hq)
    send                       target, dst [, count, persistent]

``dst`` may use ``{broker}`` (the target) and ``{region}`` (its region).  An added
consumer is named by ``consumer`` (default ``tl<index>``); ``remove_consumer`` names one
added earlier, or a ``dst`` to remove every consumer on it at the target.  The checks:
targets exist, root links cannot be cut, a link is restored only after a cut, a broker is
killed only while it runs, consumers are removed only after they were added.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from treefed.config import (
    _REQUIRED, _bool, _check_table, _identifier, _int, _number, _show, _string, _suggest,
    parse_mesh_options, parse_tree_options, read_toml,
)
from treefed.errors import ConfigError, TreefedError
from treefed.scenario.topology import ROOT_ID, BrokerSpec, LayerSpec, Topology, TopologySpec, build

__all__ = [
    "Scenario",
    "Mode",
    "Workload",
    "TimelineEvent",
    "ACTIONS",
    "STORE_QUEUE",
    "BROADCAST_TOPIC",
    "HQ_QUEUE",
    "MAX_BROKERS",
    "load_scenario",
    "parse_scenario",
    "expand_destination",
]

STORE_QUEUE = "queue://Store.{broker}.Incoming"
BROADCAST_TOPIC = "topic://Broadcast.Prices"
HQ_QUEUE = "queue://HQ.Incoming"
#: A guard against a typo'd size that would take minutes to build and gigabytes to run.
MAX_BROKERS = 200_000


@dataclass(frozen=True, slots=True)
class Mode:
    label: str               # unique within the scenario; names the run
    connector: str           # "tree" | "mesh"
    options: dict[str, Any]  # connector options given in the file (validated); others default


@dataclass(frozen=True, slots=True)
class Workload:
    store_queue_consumers: bool = True
    store_topic_subscribers: bool = False
    hq_consumers: tuple[str, ...] = ()      # destination templates, {broker}
    region_consumers: tuple[str, ...] = ()  # destination templates, {region} {broker}
    hq_to_stores: int = 0                   # messages per store
    stores_to_hq: int = 0                   # messages per store
    store_to_store: int = 0                 # messages in all, random pairs
    topic_broadcasts: int = 0
    persistent: bool = False
    body_bytes: int = 64


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    at: float                    # seconds from the start of the run
    action: str                  # a key of ACTIONS
    target: str | None = None    # broker id or glob; for insert_layer the parent
    dst: str | None = None       # destination template ({broker}, {region})
    consumer: str | None = None  # add_consumer / remove_consumer name
    selector: str | None = None
    count: int = 1               # send: messages per target; insert_layer: new brokers
    name: str | None = None      # insert_layer: the layer name (id prefix)
    persistent: bool = False


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    seed: int
    topology: TopologySpec
    modes: tuple[Mode, ...]
    workload: Workload
    timeline: tuple[TimelineEvent, ...] = ()
    description: str = ""
    source_path: str | None = None

    def build_topology(self) -> Topology:
        """The estate at the start of the run (``insert_layer`` events reshape it later)."""
        return build(self.topology)

    def mode(self, label: str) -> Mode:
        for m in self.modes:
            if m.label == label:
                return m
        raise KeyError(label)


def expand_destination(template: str, broker: BrokerSpec) -> str:
    """``template`` with ``{broker}`` / ``{region}`` filled in for ``broker``."""
    if "{" not in template:
        return template
    return template.format(broker=broker.id, region=broker.region or "")


# --------------------------------------------------------------------------- checkers


def _placeholders(template: str) -> set[str]:
    try:
        return {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    except ValueError:
        return {"{"}  # unbalanced braces: reported as an unknown placeholder


def _dst_template(allowed: tuple[str, ...], *, wildcards: bool):
    def check(value: Any, key: str) -> str:
        from treefed.core.destinations import parse_destination

        text = _string(value, key)
        bad = _placeholders(text) - set(allowed)
        if bad:
            names = ", ".join("{" + a + "}" for a in allowed) or "none"
            raise ConfigError(key, f"unknown placeholder {{{sorted(bad)[0]}}} in {_show(text)};"
                                   f" allowed: {names}")
        sample = text.format(broker="store-r1-0001", region="region-1") if allowed else text
        try:
            parse_destination(sample, allow_wildcards=wildcards)
        except TreefedError as exc:
            why = getattr(exc, "problem", None) or str(exc)
            raise ConfigError(key, f"invalid destination {_show(text)}: {why}") from None
        return text

    return check


def _templates(allowed: tuple[str, ...]):
    item = _dst_template(allowed, wildcards=True)

    def check(value: Any, key: str) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise ConfigError(key, f"must be a list, got {_show(value)}")
        return tuple(item(v, f"{key}[{i}]") for i, v in enumerate(value))

    return check


def _layer_name(value: Any, key: str) -> str:
    if (not isinstance(value, str) or not value.isidentifier() or not value.islower()
            or value in ("hq", "region", "store")):
        raise ConfigError(key, 'must be a lowercase name like "country" (not hq, region or '
                               f"store), got {_show(value)}")
    return value


def _selector(value: Any, key: str) -> str:
    from treefed.core.selector import compile_selector

    text = _string(value, key)
    try:
        compile_selector(text)
    except TreefedError as exc:
        raise ConfigError(key, str(exc)) from None
    return text


def _layers(value: Any, key: str) -> tuple[LayerSpec, ...]:
    if not isinstance(value, list):
        raise ConfigError(key, f"must be a list of {{name, count}} tables, got {_show(value)}")
    out, seen = [], set()
    for i, item in enumerate(value):
        layer = LayerSpec(**_check_table(item, _LAYER, f"{key}[{i}]"))
        if layer.name in seen:
            raise ConfigError(f"{key}[{i}].name", f'duplicate layer name "{layer.name}"')
        seen.add(layer.name)
        out.append(layer)
    return tuple(out)


_LAYER = {"name": (_layer_name, _REQUIRED), "count": (_int(1), _REQUIRED)}

_TOPOLOGY = {
    "regions": (_int(1), _REQUIRED),
    "stores_per_region": (_int(1), _REQUIRED),
    "layers": (_layers, ()),
}

_WORKLOAD = {
    "store_queue_consumers": (_bool, True),
    "store_topic_subscribers": (_bool, False),
    "hq_consumers": (_templates(("broker",)), ()),
    "region_consumers": (_templates(("region", "broker")), ()),
    "hq_to_stores": (_int(0), 0),
    "stores_to_hq": (_int(0), 0),
    "store_to_store": (_int(0), 0),
    "topic_broadcasts": (_int(0), 0),
    "persistent": (_bool, False),
    "body_bytes": (_int(0), 64),
}

_TIMELINE_KEYS = {
    "at": (_number(0.0), _REQUIRED),
    "action": (_string, _REQUIRED),
    "target": (_string, None),
    "dst": (_dst_template(("broker", "region"), wildcards=False), None),
    "consumer": (_identifier, None),
    "selector": (_selector, None),
    "count": (_int(1), 1),
    "name": (_layer_name, None),
    "persistent": (_bool, False),
}
_SUBSCRIBE_DST = _dst_template(("broker", "region"), wildcards=True)

#: action -> (required keys, optional keys), besides ``at`` and ``action``.
ACTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "cut_link": (("target",), ()),
    "restore_link": (("target",), ()),
    "kill_broker": (("target",), ()),
    "restart_broker": (("target",), ()),
    "add_consumer": (("target", "dst"), ("consumer", "selector")),
    "remove_consumer": (("target",), ("consumer", "dst")),
    "insert_layer": (("name", "count"), ("target",)),
    "send": (("target", "dst"), ("count", "persistent")),
}

_TOP = ("name", "description", "seed", "topology", "mode", "workload", "timeline")


# --------------------------------------------------------------------------- parse


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file. Raises ConfigError on any problem."""
    return parse_scenario(read_toml(path), source=str(path))


def parse_scenario(data: dict, *, source: str = "<string>") -> Scenario:
    """Validate a decoded scenario document (see the module docstring for the format)."""
    try:
        return _parse(data, source)
    except ConfigError as exc:
        exc.add_note(f"in {source}")
        raise


def _parse(data: dict, source: str) -> Scenario:
    for key in data:
        if key not in _TOP:
            raise ConfigError(key, "unknown key" + _suggest(key, _TOP))
    if "name" not in data:
        raise ConfigError("name", "required key is missing")
    name = _identifier(data["name"], "name")
    description = _string(data.get("description", ""), "description")
    seed = _int(0)(data.get("seed", 0), "seed")
    if "topology" not in data:
        raise ConfigError("topology", "required section is missing")
    topo_spec = TopologySpec(**_check_table(data["topology"], _TOPOLOGY, "topology"))
    size = _size(topo_spec)
    if size > MAX_BROKERS:
        raise ConfigError("topology", f"{size} brokers is more than the {MAX_BROKERS} a "
                                      "scenario may have")
    topology = build(topo_spec)
    modes = _modes(data.get("mode"))
    workload = Workload(**_check_table(data.get("workload", {}), _WORKLOAD, "workload"))
    if workload.store_to_store and len(topology.of_kind("store")) < 2:
        raise ConfigError("workload.store_to_store", "needs at least two stores")
    timeline = _timeline(data.get("timeline", []), topology)
    return Scenario(name, seed, topo_spec, modes, workload, timeline, description,
                    None if source.startswith("<") else source)


def _size(spec: TopologySpec) -> int:
    total, level = 1, 1
    for layer in spec.layers:
        level *= layer.count
        total += level
    regions = level * spec.regions
    return total + regions + regions * spec.stores_per_region


def _modes(raw: Any) -> tuple[Mode, ...]:
    if raw is None:
        raise ConfigError("mode", "at least one [[mode]] is required")
    if not isinstance(raw, list) or not raw or not all(isinstance(m, dict) for m in raw):
        raise ConfigError("mode", "must be an array of tables ([[mode]]), at least one")
    modes: list[Mode] = []
    labels: dict[str, int] = {}
    for i, table in enumerate(raw):
        key = f"mode[{i}]"
        connector = table.get("connector")
        if connector not in ("tree", "mesh"):
            problem = ("required key is missing" if connector is None
                       else f"must be one of \"tree\", \"mesh\", got {_show(connector)}")
            raise ConfigError(f"{key}.connector", problem)
        rest = {k: v for k, v in table.items() if k not in ("connector", "label")}
        parse = parse_tree_options if connector == "tree" else parse_mesh_options
        options = parse(rest, key)
        if "label" in table:
            label = _identifier(table["label"], f"{key}.label")
        else:
            label = _derive_label(connector, options)
        if label in labels:
            raise ConfigError(f"{key}.label", f'duplicate mode label "{label}" (also '
                                              f"mode[{labels[label]}]); set label = "
                                              '"..." on one of them')
        labels[label] = i
        modes.append(Mode(label, connector, options))
    return tuple(modes)


def _derive_label(connector: str, options: dict) -> str:
    if connector == "tree":
        return "tree"
    ttl = options.get("network_ttl", 1)
    return "mesh-ttlinf" if ttl == -1 else f"mesh-ttl{ttl}"


def _timeline(raw: Any, topology: Topology) -> tuple[TimelineEvent, ...]:
    if not isinstance(raw, list) or not all(isinstance(e, dict) for e in raw):
        raise ConfigError("timeline", "must be an array of tables ([[timeline]])")
    events: list[TimelineEvent] = []
    cut: set[str] = set()        # children whose parent link is down
    killed: set[str] = set()
    consumers: set[tuple[str, str]] = set()  # (broker, consumer name) added and not removed
    last = 0.0
    for i, table in enumerate(raw):
        key = f"timeline[{i}]"
        action = table.get("action")
        if action not in ACTIONS:
            problem = ("required key is missing" if action is None else
                       f"unknown action {_show(action)}"
                       + _suggest(str(action), ACTIONS, what="actions"))
            raise ConfigError(f"{key}.action", problem)
        required, optional = ACTIONS[action]
        allowed = ("at", "action", *required, *optional)
        for k in table:
            if k not in allowed:
                raise ConfigError(f"{key}.{k}", f"not a key of {action}" + _suggest(k, allowed))
        for k in required:
            if k not in table:
                raise ConfigError(f"{key}.{k}", f"required key of {action} is missing")
        checks = {k: _TIMELINE_KEYS[k] for k in allowed}
        if action in ("add_consumer", "remove_consumer"):
            checks["dst"] = (_SUBSCRIBE_DST, None)  # a subscription may use wildcards
        ev = TimelineEvent(**_check_table(table, checks, key))
        if action == "add_consumer" and ev.consumer is None:
            ev = TimelineEvent(ev.at, action, ev.target, ev.dst, f"tl{i}", ev.selector)
        if ev.at < last:
            raise ConfigError(f"{key}.at", f"events must be in time order: {ev.at:g} is "
                                           f"before the previous event's {last:g}")
        last = ev.at

        if action == "insert_layer":
            parent = ev.target or ROOT_ID
            if parent not in topology:
                raise ConfigError(f"{key}.target", f"no broker {_show(parent)}")
            below = len(topology.children(parent))
            if ev.count > below:
                raise ConfigError(f"{key}.count", f"must be between 1 and {below} (the "
                                                  f"children of {parent}), got {ev.count}")
            try:
                topology = topology.insert_layer(ev.name, ev.count, parent=parent)
            except ValueError as exc:
                raise ConfigError(f"{key}.name", str(exc)) from None
            events.append(TimelineEvent(ev.at, action, parent, count=ev.count, name=ev.name))
            continue

        targets = topology.match(ev.target)
        if not targets:
            raise ConfigError(f"{key}.target", f"no broker matches {_show(ev.target)}")
        if ev.dst is not None and "{region}" in ev.dst:
            for t in targets:
                if topology.broker(t).region is None:
                    raise ConfigError(f"{key}.dst", f"{{region}} used but {t} is not in a "
                                                    "region")
        _apply(action, ev, key, targets, cut, killed, consumers)
        events.append(ev)
    return tuple(events)


def _apply(action: str, ev: TimelineEvent, key: str, targets: list[str],
           cut: set[str], killed: set[str], consumers: set[tuple[str, str]]) -> None:
    """Track link, broker and consumer state so impossible sequences are refused."""
    if action in ("cut_link", "restore_link"):
        if ROOT_ID in targets:
            raise ConfigError(f"{key}.target", f"{ROOT_ID} is the root: it has no parent link")
        for t in targets:
            if action == "cut_link":
                if t in cut:
                    raise ConfigError(f"{key}.target", f"the link of {t} is already cut")
                cut.add(t)
            elif t not in cut:
                raise ConfigError(f"{key}.target", f"the link of {t} was not cut")
            else:
                cut.discard(t)
    elif action == "kill_broker":
        for t in targets:
            if t in killed:
                raise ConfigError(f"{key}.target", f"{t} is already killed")
            killed.add(t)
    elif action == "restart_broker":
        killed.difference_update(targets)
    elif action == "add_consumer":
        for t in targets:
            if (t, ev.consumer) in consumers:
                raise ConfigError(f"{key}.consumer", f'{t} already has consumer "{ev.consumer}"')
            consumers.add((t, ev.consumer))
    elif action == "remove_consumer":
        if (ev.consumer is None) == (ev.dst is None):
            raise ConfigError(f"{key}.consumer", "give exactly one of consumer or dst")
        if ev.consumer is not None:
            for t in targets:
                if (t, ev.consumer) not in consumers:
                    raise ConfigError(f"{key}.consumer", f'{t} has no consumer "{ev.consumer}"'
                                                         " added earlier in the timeline")
                consumers.discard((t, ev.consumer))
