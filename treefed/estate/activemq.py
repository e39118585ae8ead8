"""Import ActiveMQ ``activemq.xml`` files as treefed mesh broker configurations.

Theory of operation
-------------------
``parse_activemq(data, source)`` reads one Spring XML file (or a bare ``<broker>``) with
defusedxml's expat parser: a DTD may be present, but any entity declaration (billion
laughs) or external reference is refused, and every refusal or syntax error is an
``ImportError_`` naming the file and line.  Each ``<broker>`` element of the ActiveMQ core
namespace (``http://activemq.apache.org/schema/core``, or no namespace) becomes one
``ImportedBroker``:

* ``brokerName`` -> ``broker.id`` (characters treefed ids do not allow become ``-``);
* ``<transportConnectors>``: ``tcp``/``nio``/``auto`` openwire listeners -> ``listen``;
  the others are listed as not imported, but every address is kept for the topology;
* ``<networkConnectors>/<networkConnector>``: the attributes of ``_CONNECTOR_ATTRS`` map to
  ``[[network_connector]]`` keys; ``static:(…)`` stays static, ``masterslave:(…)`` becomes
  ``failover:(…)`` (one bridge to whichever of the pair is master), ``multicast://`` and
  ``<multicastNetworkConnector>`` / ``<ldapNetworkConnector>`` are reported as not
  importable (discovery has no fixed topology to import);
* the ``dynamicallyIncludedDestinations`` / ``excludedDestinations`` /
  ``staticallyIncludedDestinations`` children -> the three destination lists;
* ``<destinationPolicy>``: each ``policyEntry`` ``queue``/``topic`` pattern (wildcards
  ``*`` ``>`` as in treefed; the ``defaultEntry`` as ``queue://>`` + ``topic://>``, last)
  -> ``[[policy]]`` with ``memoryLimit`` -> ``max_bytes`` (producer flow control blocks,
  as ``block`` does; not with ``producerFlowControl="false"``, where ActiveMQ only pages)
  and a dead-letter strategy's ``processExpired="false"`` -> ``on_expiry = "discard"``;
  ``gcInactiveDestinations`` / ``inactiveTimoutBeforeGC`` on ``>`` ->
  ``broker.idle_destination_seconds``.  Prefetch, paging, advisory, dispatch and cursor
  settings are listed with the reason treefed has no per-destination equivalent.

Every attribute or element not mapped is an ``Unmapped(file, line, broker, what, value,
reason)``: nothing is silently dropped.  The written configs are validated by
``config.parse_config`` (the same checks as ``treefed broker``).  Pure except for
``import_files`` / ``write_import``, which read and write files.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable
from xml.etree.ElementTree import Element, ParseError, TreeBuilder

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import DefusedXMLParser

from treefed.config import BrokerConfig, dump_config, parse_config
from treefed.errors import ConfigError, TreefedError
from treefed.estate.topology import Address, Dial, Link, Unresolved, resolve_links

__all__ = ["AMQ_NS", "ImportError_", "Unmapped", "ImportedBroker", "ImportResult",
           "parse_activemq", "import_files", "write_import"]

AMQ_NS = "http://activemq.apache.org/schema/core"
_MAX_BYTES = 64 * 1024 * 1024     # an activemq.xml is kilobytes; refuse absurd inputs


class ImportError_(TreefedError):  # noqa: N801 - ImportError is a builtin
    """An activemq.xml that cannot be read: names the file and the line."""

    def __init__(self, source: str, line: int | None, problem: str) -> None:
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {problem}", code="bad_xml")
        self.source, self.line, self.problem = source, line, problem


@dataclass(frozen=True, slots=True)
class Unmapped:
    file: str
    line: int | None
    broker: str
    what: str          # e.g. networkConnector[to-region]/@alwaysSyncSend
    value: str
    reason: str


@dataclass(slots=True)
class ImportedBroker:
    id: str
    source: str
    line: int | None
    listen: list[str] = field(default_factory=list)              # treefed listen URIs
    addresses: list[Address] = field(default_factory=list)       # every transport address
    connectors: list[dict[str, Any]] = field(default_factory=list)  # [[network_connector]]
    dials: list[Dial] = field(default_factory=list)
    policies: list[dict[str, Any]] = field(default_factory=list)
    broker_options: dict[str, Any] = field(default_factory=dict)   # more [broker] keys

    def config_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"broker": {"id": self.id, "listen": list(self.listen),
                                           "data_dir": f"data/{self.id}",
                                           "accept_tree_children": False,
                                           **self.broker_options}}
        if self.policies:
            data["policy"] = list(self.policies)
        if self.connectors:
            data["network_connector"] = list(self.connectors)
        return data


@dataclass(slots=True)
class ImportResult:
    brokers: list[ImportedBroker]
    configs: dict[str, BrokerConfig]
    unmapped: list[Unmapped]
    links: list[Link]
    unresolved: list[Unresolved]

    def summary(self) -> dict[str, Any]:
        return {
            "brokers": [{"id": b.id, "file": b.source, "listen": b.listen,
                         "connectors": [c["name"] for c in b.connectors]}
                        for b in self.brokers],
            "links": [asdict(link) for link in self.links],
            "unresolved": [{"broker": u.dial.broker, "connector": u.dial.connector,
                            "address": str(u.dial.address), "reason": u.reason}
                           for u in self.unresolved],
            "unmapped": [asdict(u) for u in self.unmapped],
        }


# --------------------------------------------------------------------------- XML


class _LineBuilder(TreeBuilder):
    """A TreeBuilder that remembers the line each element starts on."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[int, int] = {}
        self.parser: Any = None

    def start(self, tag: str, attrs: dict) -> Element:  # type: ignore[override]
        elem = super().start(tag, attrs)
        if self.parser is not None:
            self.lines[id(elem)] = self.parser.parser.CurrentLineNumber
        return elem


def _parse_xml(data: bytes, source: str) -> tuple[Element, dict[int, int]]:
    if len(data) > _MAX_BYTES:
        raise ImportError_(source, None, f"{len(data)} bytes is more than an activemq.xml "
                                         f"may have ({_MAX_BYTES})")
    builder = _LineBuilder()
    parser = DefusedXMLParser(target=builder, forbid_dtd=False, forbid_entities=True,
                              forbid_external=True)
    builder.parser = parser
    try:
        parser.feed(data)
        root = parser.close()
    except ParseError as exc:
        line = exc.position[0] if getattr(exc, "position", None) else None
        problem = str(exc).split(": line")[0]
        raise ImportError_(source, line, f"not well-formed XML: {problem}") from None
    except DefusedXmlException as exc:
        line = parser.parser.CurrentLineNumber
        name = getattr(exc, "name", None) or getattr(exc, "sysid", None) or ""
        kind = type(exc).__name__.replace("Forbidden", "")
        raise ImportError_(source, line, f"refused: the XML declares {kind.lower()} "
                                         f"{name!r}; entity declarations and external "
                                         "references are not allowed (they can exhaust "
                                         "memory or read other files)") from None
    return root, builder.lines


def _local(tag: Any) -> tuple[str, str]:
    if not isinstance(tag, str):
        return "", ""
    if tag.startswith("{"):
        ns, _, name = tag[1:].partition("}")
        return ns, name
    return "", tag


def _is_amq(elem: Element, name: str) -> bool:
    ns, local = _local(elem.tag)
    return local == name and ns in (AMQ_NS, "")


def _children(elem: Element, name: str | None = None) -> list[Element]:
    return [c for c in elem if isinstance(c.tag, str)
            and (name is None or _is_amq(c, name))]


# --------------------------------------------------------------------------- mapping

_BOOL = "bool"
_INT = "int"
#: networkConnector attribute -> (treefed key, kind)
_CONNECTOR_ATTRS: dict[str, tuple[str, str]] = {
    "networkTTL": ("network_ttl", _INT),
    "consumerTTL": ("consumer_ttl", _INT),
    "messageTTL": ("message_ttl", _INT),
    "duplex": ("duplex", _BOOL),
    "conduitSubscriptions": ("conduit_subscriptions", _BOOL),
    "decreaseNetworkConsumerPriority": ("decrease_network_consumer_priority", _BOOL),
    "suppressDuplicateQueueSubscriptions": ("suppress_duplicate_queue_subscriptions", _BOOL),
    "suppressDuplicateTopicSubscriptions": ("suppress_duplicate_topic_subscriptions", _BOOL),
    "bridgeTempDestinations": ("bridge_temp_destinations", _BOOL),
    "staticBridge": ("static_bridge", _BOOL),
    "prefetchSize": ("prefetch", _INT),
    "userName": ("username", "str"),
    "password": ("password", "str"),
}
#: attributes with no treefed counterpart whose ActiveMQ default means what treefed does
_SAME_AS_DEFAULT = {
    "dynamicOnly": ("false", "treefed has no durable subscriptions to re-activate; "
                             "dynamicOnly=false (the default) is what treefed does"),
}
_DESTINATION_LISTS = {
    "dynamicallyIncludedDestinations": "dynamically_included",
    "excludedDestinations": "excluded",
    "staticallyIncludedDestinations": "statically_included",
}
_LISTEN_SCHEMES = {"tcp": "tcp", "nio": "tcp", "auto": "tcp", "auto+nio": "tcp"}
_TLS_SCHEMES = {"ssl", "nio+ssl", "auto+ssl", "auto+nio+ssl"}
_ID_BAD = re.compile(r"[^A-Za-z0-9._-]+")
_URI_ADDR = re.compile(r"^([a-z0-9+]+)://(\[[^\]]+\]|[^:/?]*)(?::(\d+))?", re.I)


class _Ctx:
    def __init__(self, source: str, lines: dict[int, int]) -> None:
        self.source = source
        self.lines = lines
        self.unmapped: list[Unmapped] = []
        self.broker = ""

    def line(self, elem: Element) -> int | None:
        return self.lines.get(id(elem))

    def skip(self, elem: Element, what: str, value: str, reason: str) -> None:
        self.unmapped.append(Unmapped(self.source, self.line(elem), self.broker, what,
                                      value, reason))


def _placeholder(value: str) -> bool:
    return "${" in value


def _size(text: str) -> int | None:
    """ActiveMQ sizes: ``64 mb``, ``1gb``, ``512kb``, ``1048576``."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmg]?b?)\s*", text, re.I)
    if not m:
        return None
    unit = m.group(2).lower().rstrip("b")
    return int(m.group(1)) * {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}[unit]


def _address(uri: str) -> tuple[str, Address | None]:
    m = _URI_ADDR.match(uri.strip())
    if not m or not m.group(3):
        return (m.group(1).lower() if m else ""), None
    host = m.group(2).strip("[]")
    return m.group(1).lower(), Address(host, int(m.group(3)))


def parse_activemq(data: bytes, source: str) -> tuple[list[ImportedBroker], list[Unmapped]]:
    """The brokers of one activemq.xml (see the module docstring)."""
    root, lines = _parse_xml(data, source)
    ctx = _Ctx(source, lines)
    brokers = [e for e in root.iter() if _is_amq(e, "broker")]
    if not brokers:
        raise ImportError_(source, ctx.line(root), f"no <broker> element of the ActiveMQ "
                                                   f"namespace ({AMQ_NS}) in this file")
    return [_broker(e, ctx) for e in brokers], ctx.unmapped


def _broker(elem: Element, ctx: _Ctx) -> ImportedBroker:
    raw = elem.get("brokerName") or Path(ctx.source).stem
    ctx.broker = raw
    bid = _ID_BAD.sub("-", raw).strip("-") or "broker"
    if bid != raw:
        ctx.skip(elem, "broker/@brokerName", raw, f"not a valid treefed id; imported as {bid!r}")
    ctx.broker = bid
    b = ImportedBroker(bid, ctx.source, ctx.line(elem))
    for name, value in sorted(elem.attrib.items()):
        if name in ("brokerName",) or _local(name)[0]:
            continue
        reason = {"brokerId": "treefed identifies a broker by its id (brokerName)",
                  "dataDirectory": "treefed keeps its own message store in data/<id> next to "
                                   "the config",
                  "persistent": "treefed persists per message (the producer's persistent "
                                "flag), not per broker",
                  }.get(name, "no treefed equivalent")
        ctx.skip(elem, f"broker/@{name}", value, reason)
    for child in _children(elem):
        _, local = _local(child.tag)
        if local == "transportConnectors":
            _transports(child, b, ctx)
        elif local == "networkConnectors":
            for nc in _children(child):
                _, kind = _local(nc.tag)
                if kind == "networkConnector":
                    _connector(nc, b, ctx)
                else:
                    ctx.skip(nc, kind, nc.get("uri", nc.get("name", "")),
                             "not importable: discovery connectors have no fixed topology; "
                             "list the peers in a static:(...) networkConnector")
        elif local == "destinationPolicy":
            _policies(child, b, ctx)
        else:
            ctx.skip(child, local, "", "broker element with no treefed equivalent "
                                       "(not imported)")
    return b


def _transports(elem: Element, b: ImportedBroker, ctx: _Ctx) -> None:
    for tc in _children(elem):
        uri = tc.get("uri", "")
        name = tc.get("name", "")
        what = f"transportConnector[{name}]/@uri"
        if _placeholder(uri):
            ctx.skip(tc, what, uri, "Spring property placeholder: not resolved; write the "
                                    "address out")
            continue
        scheme, addr = _address(uri)
        if addr is None:
            ctx.skip(tc, what, uri, "no host:port in the transport URI")
            continue
        b.addresses.append(addr)
        host = f"[{addr.host}]" if ":" in addr.host else addr.host
        if scheme in _LISTEN_SCHEMES:
            problem = _uri_problem(f"tcp://{host}:{addr.port}", listen=True)
            if problem:
                ctx.skip(tc, what, uri, f"not a valid listen address: {problem}")
                continue
            b.listen.append(f"tcp://{host}:{addr.port}")
            if "?" in uri:
                ctx.skip(tc, what, uri.partition("?")[2],
                         "transport options have no treefed equivalent (listener kept)")
        elif scheme in _TLS_SCHEMES:
            ctx.skip(tc, what, uri, "ssl listener not imported: treefed needs [security.tls]"
                                    " cert and key; add them and listen on "
                                    f"ssl://{host}:{addr.port}")
        else:
            ctx.skip(tc, what, uri, f"protocol {scheme!r} is not served by treefed "
                                    "brokers (openwire links only)")


def _convert_uri(uri: str, nc: Element, what: str, ctx: _Ctx) -> str | None:
    text = uri.strip()
    scheme = text.partition(":")[0].lower()
    if scheme == "multicast":
        ctx.skip(nc, what, uri, "not importable: multicast discovery has no fixed peers; "
                                "list them in static:(...)")
        return None
    if scheme not in ("static", "masterslave"):
        ctx.skip(nc, what, uri, f"not importable: {scheme!r} discovery (use static:(...))")
        return None
    rest = text.partition(":")[2]
    if rest.startswith("//"):
        rest = rest[2:]
    inner, _, query = rest.lstrip("(").partition(")")
    parts = [p.strip() for p in inner.split(",") if p.strip()]
    endpoints = []
    for p in parts:
        s, addr = _address(p)
        if addr is None or s not in _LISTEN_SCHEMES and s not in _TLS_SCHEMES:
            ctx.skip(nc, what, p, "not importable endpoint (want tcp://host:port)")
            continue
        if "?" in p:
            ctx.skip(nc, what, p.partition("?")[2], "endpoint transport options have no "
                                                    "treefed equivalent")
        host = f"[{addr.host}]" if ":" in addr.host else addr.host
        endpoints.append(f"{'ssl' if s in _TLS_SCHEMES else 'tcp'}://{host}:{addr.port}")
    if not endpoints:
        return None
    options = []
    for pair in query.lstrip("?").split("&") if query.lstrip("?") else []:
        name = pair.partition("=")[0]
        if name in ("initialReconnectDelay", "maxReconnectDelay", "useExponentialBackOff",
                    "backOffMultiplier", "maxReconnectAttempts") and scheme == "static":
            options.append(pair)
        else:
            ctx.skip(nc, what, pair, "discovery option with no treefed equivalent")
    if scheme == "masterslave":
        converted = f"failover:({','.join(endpoints)})?randomize=false"
    else:
        converted = (f"static:({','.join(endpoints)})"
                     + (f"?{'&'.join(options)}" if options else ""))
    problem = _uri_problem(converted)
    if problem:
        ctx.skip(nc, what, uri, f"not importable: {problem}")
        return None
    return converted


def _uri_problem(uri: str, *, listen: bool = False) -> str | None:
    """What treefed's URI parser says is wrong with ``uri`` (None: nothing)."""
    from treefed.transport.uri import parse_uri

    try:
        parse_uri(uri, listen=listen)
    except ConfigError as exc:
        return exc.problem
    return None


def _connector(nc: Element, b: ImportedBroker, ctx: _Ctx) -> None:
    name = nc.get("name") or "bridge"
    tag = f"networkConnector[{name}]"
    uri = nc.get("uri")
    if uri is None:
        ctx.skip(nc, f"{tag}/@uri", "", "no uri: a connector without peers is not imported")
        return
    if _placeholder(uri):
        ctx.skip(nc, f"{tag}/@uri", uri, "Spring property placeholder: not resolved")
        return
    converted = _convert_uri(uri, nc, f"{tag}/@uri", ctx)
    if converted is None:
        return
    cname = _ID_BAD.sub("-", name).strip("-") or "bridge"
    taken = {c["name"] for c in b.connectors}
    if cname in taken:
        n = 2
        while f"{cname}-{n}" in taken:
            n += 1
        ctx.skip(nc, f"{tag}/@name", name, f"duplicate name; imported as {cname}-{n}")
        cname = f"{cname}-{n}"
    table: dict[str, Any] = {"name": cname, "uri": converted}
    for attr, value in sorted(nc.attrib.items()):
        if attr in ("name", "uri") or _local(attr)[0]:
            continue
        if attr in _CONNECTOR_ATTRS:
            key, kind = _CONNECTOR_ATTRS[attr]
            parsed = _value(value, kind)
            if parsed is None:
                ctx.skip(nc, f"{tag}/@{attr}", value, f"not a valid {kind} ({key} left at "
                                                      "its default)")
            else:
                table[key] = parsed
        elif attr in _SAME_AS_DEFAULT and value.strip().lower() == _SAME_AS_DEFAULT[attr][0]:
            ctx.skip(nc, f"{tag}/@{attr}", value, _SAME_AS_DEFAULT[attr][1])
        else:
            ctx.skip(nc, f"{tag}/@{attr}", value, "no treefed equivalent")
    for child in _children(nc):
        _, local = _local(child.tag)
        if local in _DESTINATION_LISTS:
            key = _DESTINATION_LISTS[local]
            values = _destinations(child, f"{tag}/{local}", ctx,
                                   wildcards=key != "statically_included")
            if values:
                table[key] = values
        else:
            ctx.skip(child, f"{tag}/{local}", "", "no treefed equivalent (not imported)")
    for scheme_addr in _dial_addresses(converted):
        b.dials.append(Dial(b.id, cname, "mesh", scheme_addr))
    b.connectors.append(table)


def _dial_addresses(uri: str) -> list[Address]:
    inner = uri.partition("(")[2].partition(")")[0]
    return [a for _, a in (_address(p) for p in inner.split(",")) if a is not None]


def _value(text: str, kind: str) -> Any:
    text = text.strip()
    if kind == _BOOL:
        return {"true": True, "false": False}.get(text.lower())
    if kind == _INT:
        try:
            return int(text)
        except ValueError:
            return None
    return text


def _destinations(elem: Element, what: str, ctx: _Ctx, *, wildcards: bool) -> list[str]:
    out = []
    for d in _children(elem):
        _, local = _local(d.tag)
        name = d.get("physicalName", "")
        if local not in ("queue", "topic"):
            ctx.skip(d, f"{what}/{local}", name, "only <queue> and <topic> are imported")
            continue
        for part in (p.strip() for p in name.split(",")):
            if not part:
                continue
            if not wildcards and any(c in part for c in "*>"):
                ctx.skip(d, f"{what}/{local}", part, "statically included destinations "
                                                     "cannot use wildcards (as in ActiveMQ)")
                continue
            problem = _destination_problem(f"{local}://{part}", wildcards)
            if problem:
                ctx.skip(d, f"{what}/{local}", part, f"not a valid destination: {problem}")
                continue
            out.append(f"{local}://{part}")
    return out


def _destination_problem(name: str, wildcards: bool) -> str | None:
    from treefed.core.destinations import parse_destination

    try:
        parse_destination(name, allow_wildcards=wildcards)
    except TreefedError as exc:
        return exc.message
    return None


#: policyEntry attributes treefed has no per-destination equivalent for, with the reason
_POLICY_REASONS: dict[str, str] = {
    **dict.fromkeys(("queuePrefetch", "topicPrefetch", "durableTopicPrefetch",
                     "queueBrowserPrefetch"),
                    "treefed consumers choose their prefetch when they subscribe (default "
                    "1000; bridges use the network connector's prefetch): there is no "
                    "per-destination default to set"),
    **dict.fromkeys(("maxPageSize", "maxBrowsePageSize", "maxExpirePageSize", "useCache",
                     "lazyDispatch", "cursorMemoryHighWaterMark",
                     "storeUsageHighWaterMark", "expireMessagesPeriod"),
                    "store paging: treefed holds a destination's pending messages in memory "
                    "(bounded by max_bytes / broker.max_memory_bytes) and checks expiry at "
                    "dispatch; there are no pages to size or scan"),
    **dict.fromkeys(("advisoryForConsumed", "advisoryForDelivery", "advisoryForDiscardingMessages",
                     "advisoryForFastProducers", "advisoryForSlowConsumers",
                     "advisoryWhenFull", "sendAdvisoryIfNoConsumers"),
                    "ActiveMQ advisory topics: treefed logs events (message.*, consumer.*) "
                    "instead of publishing advisory messages"),
    "prioritizedMessages": "treefed dispatches in arrival order (consumer priority only)",
    "optimizedDispatch": "dispatch threading: no treefed equivalent (one event loop)",
}
_POLICY_CHILD_REASONS: dict[str, str] = {
    **dict.fromkeys(("pendingMessageLimitStrategy", "messageEvictionStrategy"),
                    "treefed bounds a slow topic subscriber's backlog at prefetch x 10 "
                    "messages, oldest dropped first; not configurable per destination"),
    "dispatchPolicy": "treefed dispatches queue messages by consumer credit and priority "
                      "(round robin among equals); no other policy to choose",
    "subscriptionRecoveryPolicy": "treefed topics keep no retained / last-image messages "
                                  "for new subscribers",
    **dict.fromkeys(("pendingQueuePolicy", "pendingSubscriberPolicy",
                     "pendingDurableSubscriberPolicy"),
                    "message cursors: treefed has one (memory + store), nothing to choose"),
}
#: ActiveMQ's default inactiveTimoutBeforeGC (ms); its spelling, and the corrected one
_GC_DEFAULT_MS = 60_000
_GC_TIMEOUT = ("inactiveTimoutBeforeGC", "inactiveTimeoutBeforeGC")


def _policy_entries(elem: Element) -> list[tuple[Element, bool]]:
    """(policyEntry, is the policyMap's defaultEntry) in document order."""
    out = []
    for e in elem.iter():
        if _is_amq(e, "defaultEntry"):
            out += [(pe, True) for pe in _children(e, "policyEntry")]
        elif _is_amq(e, "policyEntries"):
            out += [(pe, False) for pe in _children(e, "policyEntry")]
    return out


def _policies(elem: Element, b: ImportedBroker, ctx: _Ctx) -> None:
    """``<destinationPolicy>``: what treefed can honour per destination pattern --
    ``memoryLimit`` (``max_bytes``, blocking like producer flow control),
    ``deadLetterStrategy processExpired="false"`` (``on_expiry = "discard"``) -- and per
    broker from an entry on every queue or topic (``>``): ``gcInactiveDestinations`` /
    ``inactiveTimoutBeforeGC`` -> ``broker.idle_destination_seconds``.  The
    ``defaultEntry`` applies to ``queue://>`` and ``topic://>`` after every other entry
    (treefed's first match wins).  Everything else is listed with its reason."""
    entries = _policy_entries(elem)
    entries.sort(key=lambda pair: pair[1])   # the default entry last (stable otherwise)
    for pe, default in entries:
        dests = ["queue://>", "topic://>"] if default else \
            [f"{k}://{pe.get(k)}" for k in ("queue", "topic") if pe.get(k)]
        tag = "defaultEntry/policyEntry" if default else \
            f"policyEntry[{','.join(dests) or '?'}]"
        bad = [d for d in dests if _destination_problem(d, True)]
        for d in bad:
            ctx.skip(pe, tag, d, f"not a valid destination pattern: "
                                 f"{_destination_problem(d, True)}")
        dests = [d for d in dests if d not in bad]
        if not dests:
            ctx.skip(pe, tag, "", "no valid queue or topic pattern: entry not imported" if bad
                     else "policy entry for temp destinations or no destination: "
                          "not imported")
            continue
        everything = all(d.endswith("://>") for d in dests)
        flow_control = pe.get("producerFlowControl", "true").strip().lower() != "false"
        values: dict[str, Any] = {}
        gc = None
        for attr, value in sorted(pe.attrib.items()):
            where = f"{tag}/@{attr}"
            if attr in ("queue", "topic"):
                continue
            if attr == "memoryLimit" and _size(value) is not None:
                if flow_control:
                    values["max_bytes"] = _size(value)
                else:
                    ctx.skip(pe, where, value, "with producerFlowControl=\"false\" ActiveMQ "
                             "only pages past memoryLimit and never blocks; treefed does "
                             "not page, so the destination is left uncapped (the broker's "
                             "max_memory_bytes still applies)")
            elif attr == "producerFlowControl":
                ctx.skip(pe, where, value, "the default: treefed blocks the producer at a "
                                           "limit (block)" if flow_control else
                         "treefed does not spool past a limit to disk: no max_bytes is set "
                         "for these destinations (broker.max_memory_bytes still refuses "
                         "sends when the broker's memory is full)")
            elif attr == "gcInactiveDestinations":
                gc = value.strip().lower() == "true"
            elif attr in _GC_TIMEOUT:
                if pe.get("gcInactiveDestinations", "").strip().lower() != "true":
                    ctx.skip(pe, where, value, "only used with gcInactiveDestinations=\"true\"")
            else:
                ctx.skip(pe, where, value, _POLICY_REASONS.get(attr, "no treefed equivalent"))
        if gc is not None:
            _gc_policy(pe, tag, gc, everything, b, ctx)
        for child in _children(pe):
            local = _local(child.tag)[1]
            if local == "deadLetterStrategy":
                values.update(_dead_letter(child, tag, ctx))
            else:
                ctx.skip(child, f"{tag}/{local}", "",
                         _POLICY_CHILD_REASONS.get(local, "no treefed equivalent"))
        if values:
            for dst in dests:
                b.policies.append({"pattern": dst, **values})


def _gc_policy(pe: Element, tag: str, gc: bool, everything: bool, b: ImportedBroker,
               ctx: _Ctx) -> None:
    """gcInactiveDestinations on every queue/topic -> broker.idle_destination_seconds."""
    raw = next((pe.get(a) for a in _GC_TIMEOUT if pe.get(a) is not None), None)
    where = f"{tag}/@gcInactiveDestinations"
    if not everything:
        ctx.skip(pe, where, str(gc).lower(), "treefed forgets idle destinations broker-wide "
                 "(broker.idle_destination_seconds), not per pattern: only an entry for "
                 "every queue or topic (>) maps")
        return
    if gc:
        ms = _GC_DEFAULT_MS if raw is None else (int(raw) if raw.strip().isdigit() else None)
        if ms is None:
            ctx.skip(pe, f"{tag}/@inactiveTimoutBeforeGC", raw, "not a number of milliseconds")
            return
        seconds = ms / 1000
    else:
        seconds = 0.0   # ActiveMQ keeps them: treefed's 0 = never forget
    have = b.broker_options.get("idle_destination_seconds")
    if have is not None and have != seconds:
        ctx.skip(pe, where, str(gc).lower(), f"conflicts with an earlier entry's "
                 f"{have:g} s: treefed has one idle_destination_seconds per broker")
        return
    b.broker_options["idle_destination_seconds"] = seconds


def _dead_letter(elem: Element, tag: str, ctx: _Ctx) -> dict[str, Any]:
    """``<deadLetterStrategy><…DeadLetterStrategy processExpired=…/>``: expired messages
    discarded or dead-lettered maps (``on_expiry``); the DLQ's naming does not (treefed
    has one DLQ per broker, ``broker.dlq``)."""
    out: dict[str, Any] = {}
    for strategy in _children(elem):
        kind = _local(strategy.tag)[1]
        where = f"{tag}/deadLetterStrategy/{kind}"
        if kind == "discardingDeadLetterStrategy":
            out["on_expiry"] = "discard"
            ctx.skip(strategy, where, "", "expired messages are discarded (on_expiry = "
                     "\"discard\"); messages past max_redeliveries still go to treefed's "
                     "broker.dlq, which ActiveMQ would discard")
            continue
        if kind not in ("individualDeadLetterStrategy", "sharedDeadLetterStrategy"):
            ctx.skip(strategy, where, "", "no treefed equivalent")
            continue
        if kind == "individualDeadLetterStrategy":
            ctx.skip(strategy, where, "", "one DLQ per destination: treefed has one per "
                                          "broker (broker.dlq)")
        for attr, value in sorted(strategy.attrib.items()):
            if attr == "processExpired":
                out["on_expiry"] = "discard" if value.strip().lower() == "false" else "dlq"
            else:
                ctx.skip(strategy, f"{where}/@{attr}", value, "DLQ naming and filtering: "
                                                              "treefed has one DLQ per broker "
                                                              "(broker.dlq)")
        for child in _children(strategy):
            ctx.skip(child, f"{where}/{_local(child.tag)[1]}", "",
                     "DLQ naming: treefed has one DLQ per broker (broker.dlq)")
    return out


# --------------------------------------------------------------------------- files


def import_files(paths: Iterable[str | Path]) -> ImportResult:
    """Read, map and validate every file; derive the topology."""
    brokers: list[ImportedBroker] = []
    unmapped: list[Unmapped] = []
    seen: dict[str, str] = {}
    for path in paths:
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ImportError_(str(path), None, f"cannot read: {exc.strerror or exc}") from None
        found, skipped = parse_activemq(data, str(path))
        for b in found:
            if b.id in seen:
                raise ImportError_(str(path), b.line, f"broker {b.id!r} is also defined in "
                                                      f"{seen[b.id]}")
            seen[b.id] = str(path)
        brokers += found
        unmapped += skipped
    configs: dict[str, BrokerConfig] = {}
    for b in brokers:
        try:
            configs[b.id] = parse_config(b.config_dict())
        except ConfigError as exc:
            raise ImportError_(b.source, b.line, f"broker {b.id!r} maps to an invalid "
                                                 f"treefed config: {exc.message}") from None
    links, unresolved = resolve_links({b.id: b.addresses for b in brokers},
                                      [d for b in brokers for d in b.dials])
    return ImportResult(brokers, configs, unmapped, links, unresolved)


def write_import(result: ImportResult, out: str | Path) -> list[Path]:
    """Write ``<id>.toml`` per broker plus ``import.json`` and ``import.md``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for bid, config in result.configs.items():
        b = next(x for x in result.brokers if x.id == bid)
        path = out / f"{bid}.toml"
        path.write_text(f"# imported from {b.source} by treefed import activemq\n"
                        + dump_config(config), encoding="utf-8")
        written.append(path)
    summary = result.summary()
    (out / "import.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n",
                                     encoding="utf-8")
    (out / "import.md").write_text(_markdown(result), encoding="utf-8")
    return written + [out / "import.json", out / "import.md"]


def _markdown(result: ImportResult) -> str:
    lines = ["# ActiveMQ import", "",
             f"{len(result.brokers)} brokers, {len(result.links)} links, "
             f"{len(result.unresolved)} unresolved connector addresses, "
             f"{len(result.unmapped)} attributes or elements not mapped.", "",
             "## Topology (dialer -> acceptor)", "", "| dialer | acceptor | connector |",
             "|---|---|---|"]
    lines += [f"| {link.dialer} | {link.acceptor} | {link.connector} |"
              for link in result.links]
    if result.unresolved:
        lines += ["", "## Unresolved connector addresses", "",
                  "| broker | connector | address | reason |", "|---|---|---|---|"]
        lines += [f"| {u.dial.broker} | {u.dial.connector} | {u.dial.address} | {u.reason} |"
                  for u in result.unresolved]
    # the same attribute left out of a thousand store files is one row, with a count
    # and the first place it occurs; import.json lists every occurrence
    groups: dict[tuple[str, str, str], list[Unmapped]] = {}
    for u in result.unmapped:
        what = re.sub(r"^networkConnector\[[^\]]*\]", "networkConnector[*]", u.what)
        groups.setdefault((what, u.value, u.reason), []).append(u)
    lines += ["", "## Not mapped", "",
              "| what | value | reason | brokers | first at |", "|---|---|---|---|---|"]
    for (what, value, reason), items in groups.items():
        first = items[0]
        value = value.replace("|", "\\|")
        lines.append(f"| {what} | {value} | {reason} | {len(items)} | "
                     f"{first.file}:{first.line or '?'} ({first.broker}) |")
    return "\n".join(lines) + "\n"
