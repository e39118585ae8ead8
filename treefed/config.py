"""Broker configuration: one site's TOML file -> frozen, validated dataclasses.

Theory of operation
-------------------
``load_config(path)`` reads TOML with ``tomllib`` and hands the dict to
``parse_config``, which checks every section against a *table* of fields
(``_BROKER``, ``_LOGGING``, ``_POLICY``, ``_TREE``, ``_MESH``, ``_SECURITY`` and its
sub-tables): for each known key a
checker and a default.  The first problem found raises ``ConfigError(key, problem)`` with
the dotted key at fault (``network_connector[1].network_ttl``, arrays indexed from 0) and
a problem a person can act on; an unknown key is a problem too, with the closest known
key suggested, because a typo that silently falls back to a default is the worst kind of
misconfiguration.

Invariants of a returned ``BrokerConfig``: every value has its documented type and range;
destination patterns and URIs parse (``core.destinations`` / ``transport.uri``, imported
lazily so this module has no import-time dependency on them) and destinations are kept in
canonical form (a bare name is a queue); network connector names are
unique; relative paths (``broker.data_dir``, ``logging.file``, ``security.tls`` files) are
resolved against the folder of the config file.  Security: password hashes parse,
permission patterns compile, every permission principal names a configured user or a
group some user is in (a typo would silently grant nothing), and an ``ssl://`` listener
has a certificate.  Lists are tuples so the whole config is immutable and
hashable.

This module never opens a socket or creates a directory: validating a config has no side
effects, so ``treefed broker --config`` can refuse a bad file before it touches anything
(TLS files are read only when ``TlsConfig.server_context()`` builds a context).
``dump_config`` writes the same format back (the scenario runner uses it to give each
site process its own file); ``parse_config(tomllib.loads(dump_config(c)))`` equals ``c``
apart from ``source_path``.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

from treefed.errors import ConfigError, TreefedError

__all__ = [
    "BrokerConfig",
    "read_toml",
    "BrokerSection",
    "LoggingSection",
    "StoreSection",
    "PolicyConfig",
    "TreeConnectorConfig",
    "NetworkConnectorConfig",
    "SecurityConfig",
    "UserConfig",
    "PermissionConfig",
    "TlsConfig",
    "TreeScopeConfig",
    "MonitorSection",
    "LOG_LEVELS",
    "load_config",
    "parse_config",
    "dump_config",
    "parse_mesh_options",
    "parse_tree_options",
]

LOG_LEVELS = ("debug", "info", "warning", "error")

# --------------------------------------------------------------------------- dataclasses


@dataclass(frozen=True, slots=True)
class BrokerSection:
    id: str                          # unique across the estate; appears in paths and logs
    name: str                        # human label; defaults to id
    data_dir: str                    # message store folder, resolved against the config
    listen: tuple[str, ...] = ()     # tcp:// / ssl:// URIs for clients and broker links
    max_frame_bytes: int = 4 * 1024 * 1024  # checked before a frame is allocated
    max_redeliveries: int = 6        # nacks/lost deliveries before the DLQ
    dlq: str = "queue://DLQ"
    heartbeat_interval: float = 10.0  # seconds between pings on idle links; 0 = off
    hello_timeout: float = 30.0      # seconds a new connection (either way) has to say hello
    accept_tree_children: bool = True  # refuse tree hellos when false
    accept_mesh: bool = True         # refuse mesh hellos when false
    max_store_bytes: int = 0         # message store size cap (0 = the disk): when reached,
    #                                  persistent sends are refused with "store_full"
    # one client connection's share (issue #12, defect 7; 0 = unlimited)
    max_subscriptions_per_connection: int = 10_000
    max_inflight_per_connection: int = 1_000_000   # sum of its consumers' prefetch
    max_pending_bytes_per_connection: int = 64 * 1024 * 1024  # queued to it, unsent
    # memory (issue #12, defect 8)
    max_memory_bytes: int = 512 * 1024 * 1024  # message bytes held in memory (queues,
    #                                  topic backlogs); past it sends are refused
    #                                  "memory_full"; 0 = no cap
    max_queue_memory_bytes: int = 1024 * 1024  # a local producer's non-persistent send to
    #                                  a queue with more message bytes waiting in memory
    #                                  for a consumer waits (its connection paused) until
    #                                  consumers take some; 0 = never (producer flow control)
    max_page_messages: int = 200     # waiting persistent messages a queue holds in memory;
    #                                  the rest stay in the store only, paged back in as
    #                                  consumers take them (ActiveMQ's maxPageSize); 0 = all
    idle_destination_seconds: float = 300.0  # an empty destination without consumers of
    #                                  its own is forgotten after this long; 0 = never
    idle_poll_us: int = 0            # poll up to this long after a read instead of sleeping
    #                                  (transport/idlepoll.py: CPU for latency); 0 = off


@dataclass(frozen=True, slots=True)
class LoggingSection:
    level: str = "info"              # one of LOG_LEVELS
    file: str = ""                   # "" = stderr
    message_events: bool = False     # per-message events: debug volume, off in production
    advisory_events: bool = False    # every advisory.sent/received/dropped at info (runs
    #                                  whose logs are the event log); else debug + digest


@dataclass(frozen=True, slots=True)
class MonitorSection:
    """``[monitor]``: the HTTP monitoring endpoints (``treefed.monitor``); off when
    ``listen`` is empty."""

    listen: str = ""                 # "host:port", "http://host:port" or "https://host:port"
    #                                  (https: the [security.tls] certificate)
    basic_auth: bool = False         # HTTP basic auth against [[security.user]]; only
    #                                  users with admin on ">" pass (/healthz stays open)


@dataclass(frozen=True, slots=True)
class StoreSection:
    """``[store]``: how the SQLite message store commits (persistence/sqlite.py)."""

    ack_sync: str = "normal"         # "normal": a commit that only acks (deletes) is not
    #                                  fsynced, durable at the next storing commit or
    #                                  within 0.1 s; "full": fsynced like a send (issue #14)


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    pattern: str                     # destination pattern, * and > allowed
    max_messages: int = 0            # 0 = unlimited
    max_bytes: int = 0
    limit_behaviour: str = "block"   # block | reject_newest | drop_oldest
    max_message_bytes: int = 0
    local_only: bool = False         # never forwarded over any link
    on_expiry: str = "dlq"           # dlq | discard

    def destination_policy(self) -> Any:
        """This policy as a ``core.policy.DestinationPolicy``."""
        from treefed.core.policy import DestinationPolicy

        return DestinationPolicy(
            max_messages=self.max_messages, max_bytes=self.max_bytes,
            limit_behaviour=self.limit_behaviour, max_message_bytes=self.max_message_bytes,
            local_only=self.local_only, on_expiry=self.on_expiry)


@dataclass(frozen=True, slots=True)
class TreeConnectorConfig:
    uri: str                         # the parent: tcp://h:p, ssl://h:p or failover:(...)
    node_type: str = "leaf"          # leaf | branch (the root has no tree connector)
    route_unknown_up: bool = True    # send messages nobody below wants to the parent
    max_interest_per_child: int = 100_000  # cap on interest one child may register
    username: str = ""               # credentials sent in our hello ("" = none; a
    password: str = ""               #   client certificate may authenticate instead)
    replay_delay: float = 10.0       # seconds a message that came down and lost its
    #                                  consumer waits here before it goes back up
    advertise_down: tuple[str, ...] | None = None  # kinds ("queue", "topic") whose
    #   interest from above we want to hear; None: topics only with route_unknown_up
    #   (a queue message climbs to its consumer anyway), both without
    resync_grace: float = 0.0        # seconds both ends hold the link's interest after
    #                                  it drops: a quick reconnect sends only the change
    summary_budget: int = 0          # most interest entries sent up before covering
    #                                  entries replace them (0 = off; issue 18 part 2)
    summary_owned: tuple[str, ...] = ()   # "queue://Store.{broker}.>": queues owned by
    #                                  the broker a segment names (routed by subtree)

    def link_settings(self, build: Any = None) -> Any:
        """Settings for the federation Bridge of this link (``kind="tree"``); ``build``:
        in place of ``LinkSettings`` (``Sharing.new_settings``: validated once)."""
        from treefed.federation.settings import LinkSettings

        new_settings = build or LinkSettings
        return new_settings(kind="tree", name="tree", node_type=self.node_type,
                            route_unknown_up=self.route_unknown_up,
                            max_demand_per_link=self.max_interest_per_child,
                            advertise_down=self.advertise_down,
                            resync_grace=self.resync_grace,
                            summary_budget=self.summary_budget,
                            summary_owned=self.summary_owned)

    def tree_settings(self) -> Any:
        """This site's own place in the tree (``federation.settings.TreeSettings``)."""
        from treefed.federation.settings import TreeSettings

        return TreeSettings(node_type=self.node_type, route_unknown_up=self.route_unknown_up,
                            summarises=self.summary_budget > 0)


@dataclass(frozen=True, slots=True)
class NetworkConnectorConfig:
    """A classic (mesh) network connector; the option names follow ActiveMQ's, snake_cased."""

    name: str
    uri: str
    network_ttl: int = 1
    consumer_ttl: int = 1            # defaults to network_ttl
    message_ttl: int = 1             # defaults to network_ttl
    duplex: bool = False
    conduit_subscriptions: bool = True
    dynamically_included: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    statically_included: tuple[str, ...] = ()   # no wildcards: forwarded without demand
    decrease_network_consumer_priority: bool = False
    suppress_duplicate_queue_subscriptions: bool = False
    suppress_duplicate_topic_subscriptions: bool = True
    bridge_temp_destinations: bool = True
    prefetch: int = 1000
    static_bridge: bool = False      # no advisories at all, static includes only
    max_demand_per_link: int = 100_000
    username: str = ""               # credentials sent in our hello ("" = none)
    password: str = ""

    def link_settings(self, build: Any = None) -> Any:
        """Settings for the federation Bridge of this link (``kind="mesh"``); the uri and
        credentials are the transport's business, not the bridge's.  ``build``: in place
        of ``LinkSettings`` (``Sharing.new_settings``: validated once)."""
        from treefed.federation.settings import LinkSettings

        values = {f.name: getattr(self, f.name) for f in fields(self)
                  if f.name not in _NOT_LINK_SETTINGS}
        return (build or LinkSettings)(kind="mesh", **values)


_NOT_LINK_SETTINGS = ("uri", "username", "password")


@dataclass(frozen=True, slots=True)
class UserConfig:
    """``[[security.user]]``: who may log in, with what, as which groups."""

    name: str
    password_hash: str = ""          # scrypt$n$r$p$salt$hash; "" = certificate only
    groups: tuple[str, ...] = ()
    brokers: tuple[str, ...] = ()    # broker ids this user may claim besides its name


@dataclass(frozen=True, slots=True)
class PermissionConfig:
    """``[[security.permission]]``: grants to one principal (user, group:<g> or *)."""

    principal: str
    read: tuple[str, ...] = ()       # subscribe / advertise interest
    write: tuple[str, ...] = ()      # send / forward
    admin: tuple[str, ...] = ()      # stat and admin frames (">" = whole broker)


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """``[security.tls]``: the certificate this broker shows (listeners, and as client
    certificate on ssl:// connectors) and the CA it trusts."""

    cert: str = ""                   # PEM chain, resolved against the config folder
    key: str = ""                    # PEM key ("" = inside cert)
    ca: str = ""                     # trusted CA bundle ("" = system store for dialing)
    verify_peer: bool = False        # listeners require a client certificate (mTLS)
    min_version: str = "1.2"         # 1.2 | 1.3
    check_hostname: bool = True      # connectors check the parent's certificate name
    handshake_timeout: float = 10.0  # seconds before a silent TLS peer is dropped

    def server_context(self) -> Any:
        """The listeners' ``ssl.SSLContext`` (reads the files; ConfigError names the key)."""
        from treefed.transport.tls import server_context

        return server_context(self.cert, self.key or None, ca=self.ca or None,
                              verify_peer=self.verify_peer, min_version=self.min_version)

    def client_context(self) -> Any:
        """The ``ssl.SSLContext`` for ssl:// connectors and clients (our cert, if any,
        is offered for mutual TLS)."""
        from treefed.transport.tls import client_context

        return client_context(ca=self.ca or None, cert=self.cert or None,
                              key=self.key or None, check_hostname=self.check_hostname,
                              min_version=self.min_version)


@dataclass(frozen=True, slots=True)
class TreeScopeConfig:
    """``[security.tree]``: confine tree children to their own subtree's destinations."""

    confine_children: bool = False
    child_patterns: tuple[str, ...] = ()   # {child} / {subtree} placeholders
    broadcast: tuple[str, ...] = ()        # any child may advertise and send
    upward: tuple[str, ...] = ()           # any child may send (not advertise)
    child_groups: tuple[str, ...] = ("brokers",)  # with authentication: only users in
    #                                        one of these groups may attach as tree
    #                                        children (the broker role); [] = any user

    def tree_scope(self, *, temp_destinations: bool = True) -> Any:
        """A ``security.TreeScope``, or None when children are not confined."""
        if not self.confine_children:
            return None
        from treefed.security.tree_scope import TreeScope

        return TreeScope(self.child_patterns, self.broadcast, self.upward,
                         temp_destinations=temp_destinations)


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """``[security]``: authentication, permissions, TLS, tree confinement."""

    authentication: bool = False     # hellos must carry valid credentials
    failure_delay: float = 1.0       # seconds before refusing a failed login, doubling
    max_failure_delay: float = 30.0  #   per recent failure up to this
    failure_window: float = 300.0    # failures older than this are forgotten
    lockout_failures: int = 10       # failures (per source / per user) that lock it out
    #                                  for failure_window; 0 = never (issue #12 defect 10)
    temp_destinations: bool = True   # temp (reply) queues open to users and tree children
    users: tuple[UserConfig, ...] = ()
    permissions: tuple[PermissionConfig, ...] = ()
    tls: TlsConfig = TlsConfig()
    tree: TreeScopeConfig = TreeScopeConfig()

    def authenticator(self) -> Any:
        """A ``security.Authenticator`` for this broker's hellos."""
        from treefed.security.auth import Authenticator, User

        return Authenticator([User(u.name, u.password_hash, u.groups, u.brokers)
                              for u in self.users], required=self.authentication,
                             failure_delay=self.failure_delay,
                             max_failure_delay=self.max_failure_delay,
                             failure_window=self.failure_window,
                             lockout_failures=self.lockout_failures)

    def authorizer(self) -> Any:
        """A ``security.Authorizer``; None when authentication is off (nobody to check)."""
        if not self.authentication:
            return None
        from treefed.security.authz import Authorizer, Rule

        rules = [Rule(p.principal, perm, pattern) for p in self.permissions
                 for perm in ("read", "write", "admin") for pattern in getattr(p, perm)]
        return Authorizer(rules, {u.name: u.groups for u in self.users},
                          temp_destinations=self.temp_destinations)


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    broker: BrokerSection
    logging: LoggingSection
    policies: tuple[PolicyConfig, ...]
    tree_connector: TreeConnectorConfig | None
    network_connectors: tuple[NetworkConnectorConfig, ...]
    source_path: str | None = None   # the file it came from; None when parsed from a dict
    security: SecurityConfig = SecurityConfig()
    monitor: MonitorSection = MonitorSection()
    store: StoreSection = StoreSection()

    def policy_set(self) -> Any:
        """The ``[[policy]]`` list as a ``core.policy.PolicySet`` (first match wins)."""
        from treefed.core.policy import PolicySet

        return PolicySet([(p.pattern, p.destination_policy()) for p in self.policies])


# --------------------------------------------------------------------------- checkers
# A checker takes (value, dotted key) and returns the normalised value or raises
# ConfigError.  Tables of checkers describe sections; _check_table applies them.

Checker = Callable[[Any, str], Any]
_REQUIRED = object()
_ID_RE = re.compile(r"[A-Za-z0-9._-]+")


def _show(value: Any) -> str:
    """A value as the user wrote it (TOML-ish), for error messages."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except ValueError:  # nan / circular
        return repr(value)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _suggest(word: str, known: Any, what: str = "keys") -> str:
    import difflib   # only for a misspelt key (idle broker RSS, issue #14)

    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    if close:
        return f'; did you mean "{close[0]}"?'
    return f"; known {what}: " + ", ".join(sorted(known))


def _int(low: int, high: int | None = None) -> Checker:
    want = f"an integer >= {low}" if high is None else f"an integer {low}..{high}"

    def check(value: Any, key: str) -> int:
        if (isinstance(value, bool) or not isinstance(value, int) or value < low
                or (high is not None and value > high)):
            raise ConfigError(key, f"must be {want}, got {_show(value)}")
        return value

    return check


def _number(low: float) -> Checker:
    def check(value: Any, key: str) -> float:
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value < low):
            raise ConfigError(key, f"must be a number >= {low:g}, got {_show(value)}")
        return float(value)

    return check


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, f"must be true or false, got {_show(value)}")
    return value


def _choice(*options: str) -> Checker:
    def check(value: Any, key: str) -> str:
        if value not in options:
            listed = ", ".join(f'"{o}"' for o in options)
            raise ConfigError(key, f"must be one of {listed}, got {_show(value)}")
        return value

    return check


def _string(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(key, f"must be a string, got {_show(value)}")
    return value


def _identifier(value: Any, key: str) -> str:
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise ConfigError(key, f"must be a non-empty string of letters, digits, '.', '_' "
                               f"or '-', got {_show(value)}")
    return value


def _destination(*, wildcards: bool, queue_only: bool = False) -> Checker:
    def check(value: Any, key: str) -> str:
        from treefed.core.destinations import parse_destination

        text = _string(value, key)
        if not wildcards and any(seg in ("*", ">") for seg in text.split("://")[-1].split(".")):
            raise ConfigError(key, f"wildcards are not allowed here, got {_show(text)}")
        try:
            canonical = parse_destination(text, allow_wildcards=wildcards)
        except TreefedError as exc:
            raise ConfigError(key, f"invalid destination {_show(text)}: {_reason(exc)}") from None
        if queue_only and not canonical.startswith("queue://"):
            raise ConfigError(key, f"must be a queue, got {_show(text)}")
        return canonical

    return check


def _uri(*schemes: str, listen: bool = False) -> Checker:
    def check(value: Any, key: str) -> str:
        from treefed.transport.uri import parse_uri

        text = _string(value, key)
        if not text.lower().startswith(schemes):
            listed = ", ".join(schemes)
            raise ConfigError(key, f"must be a URI starting with {listed}, got {_show(text)}")
        parse_uri(text, key=key, listen=listen)  # its ConfigError already names key
        return text

    return check


def _reason(exc: Exception) -> str:
    return getattr(exc, "problem", None) or str(exc)


def _owned_pattern(value: Any, key: str) -> str:
    from treefed.federation.summary import Pattern   # issue 18 part 2

    try:
        return Pattern.parse(value).text
    except ConfigError as exc:
        raise ConfigError(key, _reason(exc)) from None


def _list_of(item: Checker) -> Checker:
    def check(value: Any, key: str) -> tuple:
        # a tuple: options already checked once (a scenario mode's, handed to a config)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"must be a list, got {_show(value)}")
        return tuple(item(v, f"{key}[{i}]") for i, v in enumerate(value))

    return check


def _check_table(value: Any, table: dict[str, tuple[Checker, Any]], key: str) -> dict:
    """Apply a field table to one TOML table: unknown keys, missing keys, each checker."""
    if not isinstance(value, dict):
        raise ConfigError(key, f"must be a table, got {_show(value)}")
    for name in value:
        if name not in table:
            raise ConfigError(_join(key, name), "unknown key" + _suggest(name, table))
    out = {}
    for name, (check, default) in table.items():
        if name in value:
            out[name] = check(value[name], _join(key, name))
        elif default is _REQUIRED:
            raise ConfigError(_join(key, name), "required key is missing")
        else:
            out[name] = default
    return out


def _array_of_tables(value: Any, key: str) -> list:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigError(key, f"must be an array of tables ([[{key}]])")
    return value


# --------------------------------------------------------------------------- section tables

_BROKER: dict[str, tuple[Checker, Any]] = {
    "id": (_identifier, _REQUIRED),
    "name": (_string, None),
    "data_dir": (_string, None),
    "listen": (_list_of(_uri("tcp://", "ssl://", "stomp://", "stomp+ssl://", listen=True)), ()),
    "max_frame_bytes": (_int(1024, 2**32 - 1), 4 * 1024 * 1024),
    "max_redeliveries": (_int(0), 6),
    "dlq": (_destination(wildcards=False, queue_only=True), "queue://DLQ"),
    "heartbeat_interval": (_number(0.0), 10.0),
    "hello_timeout": (_number(0.1), 30.0),
    "accept_tree_children": (_bool, True),
    "accept_mesh": (_bool, True),
    "max_store_bytes": (_int(0), 0),
    "max_subscriptions_per_connection": (_int(0), 10_000),
    "max_inflight_per_connection": (_int(0), 1_000_000),
    "max_pending_bytes_per_connection": (_int(0), 64 * 1024 * 1024),
    "max_memory_bytes": (_int(0), 512 * 1024 * 1024),
    "max_page_messages": (_int(0), 200),
    "max_queue_memory_bytes": (_int(0), 1024 * 1024),
    "idle_destination_seconds": (_number(0.0), 300.0),
    "idle_poll_us": (_int(0, 10_000), 0),   # transport/idlepoll.py MAX_US
}

def _log_level(value: Any, key: str) -> str:
    return _choice(*LOG_LEVELS)(value.lower() if isinstance(value, str) else value, key)


_LOGGING: dict[str, tuple[Checker, Any]] = {
    "level": (_log_level, "info"),
    "file": (_string, ""),
    "message_events": (_bool, False),
    "advisory_events": (_bool, False),
}

_POLICY: dict[str, tuple[Checker, Any]] = {
    "pattern": (_destination(wildcards=True), _REQUIRED),
    "max_messages": (_int(0), 0),
    "max_bytes": (_int(0), 0),
    "limit_behaviour": (_choice("block", "reject_newest", "drop_oldest"), "block"),
    "max_message_bytes": (_int(0), 0),
    "local_only": (_bool, False),
    "on_expiry": (_choice("dlq", "discard"), "dlq"),
}

#: Tree connector options a scenario mode may set (everything but the uri).
_TREE_OPTIONS: dict[str, tuple[Checker, Any]] = {
    "route_unknown_up": (_bool, True),
    "max_interest_per_child": (_int(1), 100_000),
    "advertise_down": (_list_of(_choice("queue", "topic")), None),
    "resync_grace": (_number(0.0), 0.0),
    "summary_budget": (_int(0), 0),
    "summary_owned": (_list_of(_owned_pattern), ()),
}
_TREE: dict[str, tuple[Checker, Any]] = {
    "node_type": (_choice("leaf", "branch"), "leaf"),
    "uri": (_uri("tcp://", "ssl://", "failover:"), _REQUIRED),
    **_TREE_OPTIONS,
    "username": (_string, ""),
    "password": (_string, ""),
    "replay_delay": (_number(0.0), 10.0),
}

_TTL = _int(-1)
#: Mesh connector options a scenario mode may set (everything but name and uri).
#: consumer_ttl / message_ttl default to None here and to network_ttl once resolved.
_MESH_OPTIONS: dict[str, tuple[Checker, Any]] = {
    "network_ttl": (_TTL, 1),
    "consumer_ttl": (_TTL, None),
    "message_ttl": (_TTL, None),
    "duplex": (_bool, False),
    "conduit_subscriptions": (_bool, True),
    "dynamically_included": (_list_of(_destination(wildcards=True)), ()),
    "excluded": (_list_of(_destination(wildcards=True)), ()),
    "statically_included": (_list_of(_destination(wildcards=False)), ()),
    "decrease_network_consumer_priority": (_bool, False),
    "suppress_duplicate_queue_subscriptions": (_bool, False),
    "suppress_duplicate_topic_subscriptions": (_bool, True),
    "bridge_temp_destinations": (_bool, True),
    "prefetch": (_int(1), 1000),
    "static_bridge": (_bool, False),
    "max_demand_per_link": (_int(1), 100_000),
}
_MESH: dict[str, tuple[Checker, Any]] = {
    "name": (_identifier, "bridge"),
    "uri": (_uri("static:", "tcp://", "ssl://", "failover:"), _REQUIRED),
    **_MESH_OPTIONS,
    "username": (_string, ""),
    "password": (_string, ""),
}


def _principal_name(value: Any, key: str) -> str:
    """A user name: free-form (certificate names may hold '@', ':' or '/'), but never
    blank, padded, unprintable or spelled like a group or the everyone principal."""
    text = _string(value, key)
    if (not text or text != text.strip() or not text.isprintable() or text == "*"
            or text.startswith("group:") or len(text) > 256):
        raise ConfigError(key, f"must be a printable name, not '*' or 'group:...', "
                               f"got {_show(value)}")
    return text


def _password_hash(value: Any, key: str) -> str:
    from treefed.security.passwords import parse_password_hash

    text = _string(value, key)
    if text:
        try:
            parse_password_hash(text)
        except ValueError as exc:
            raise ConfigError(key, f"invalid password hash: {exc}") from None
    return text


def _permission_pattern(*placeholders: str) -> Checker:
    def check(value: Any, key: str) -> str:
        from treefed.security.patterns import compile_pattern

        text = _string(value, key)
        try:
            return compile_pattern(text, placeholders).text
        except TreefedError as exc:
            raise ConfigError(key, f"invalid pattern {_show(text)}: {_reason(exc)}") from None

    return check


_SECURITY: dict[str, tuple[Checker, Any]] = {
    "authentication": (_bool, False),
    "failure_delay": (_number(0.0), 1.0),
    "max_failure_delay": (_number(0.0), 30.0),
    "failure_window": (_number(1.0), 300.0),
    "lockout_failures": (_int(0), 10),
    "temp_destinations": (_bool, True),
}
_USER: dict[str, tuple[Checker, Any]] = {
    "name": (_principal_name, _REQUIRED),
    "password_hash": (_password_hash, ""),
    "groups": (_list_of(_identifier), ()),
    "brokers": (_list_of(_identifier), ()),
}
_PERMISSION: dict[str, tuple[Checker, Any]] = {
    "principal": (_string, _REQUIRED),
    "read": (_list_of(_permission_pattern("user")), ()),
    "write": (_list_of(_permission_pattern("user")), ()),
    "admin": (_list_of(_permission_pattern("user")), ()),
}
_TLS: dict[str, tuple[Checker, Any]] = {
    "cert": (_string, ""),
    "key": (_string, ""),
    "ca": (_string, ""),
    "verify_peer": (_bool, False),
    "min_version": (_choice("1.2", "1.3"), "1.2"),
    "check_hostname": (_bool, True),
    "handshake_timeout": (_number(0.001), 10.0),
}
_TREE_SCOPE: dict[str, tuple[Checker, Any]] = {
    "confine_children": (_bool, False),
    "child_patterns": (_list_of(_permission_pattern("child", "subtree")), ()),
    "broadcast": (_list_of(_permission_pattern()), ()),
    "upward": (_list_of(_permission_pattern()), ()),
    "child_groups": (_list_of(_identifier), ("brokers",)),
}
_SECURITY_TABLES = ("user", "permission", "tls", "tree")

_SECTIONS = ("broker", "logging", "policy", "tree_connector", "network_connector",
             "security", "monitor", "store")

_STORE: dict[str, tuple[Checker, Any]] = {
    "ack_sync": (_choice("normal", "full"), "normal"),
}


def _monitor_listen(value: Any, key: str) -> str:
    """``host:port`` (plain HTTP), ``http://host:port`` or ``https://host:port``."""
    text = _string(value, key)
    if not text:
        return text
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "http", text
    if scheme.lower() not in ("http", "https"):
        raise ConfigError(key, f"must be host:port, http://host:port or https://host:port, "
                               f"got {_show(text)}")
    from treefed.transport.uri import parse_uri

    parse_uri(f"tcp://{rest}", key=key, listen=True)
    return text


_MONITOR: dict[str, tuple[Checker, Any]] = {
    "listen": (_monitor_listen, ""),
    "basic_auth": (_bool, False),
}


def _resolve_ttls(values: dict) -> dict:
    for name in ("consumer_ttl", "message_ttl"):
        if values.get(name) is None:
            values[name] = values["network_ttl"]
    return values


def parse_mesh_options(table: dict, key: str = "") -> dict:
    """Validate mesh connector options (no name/uri); returns only the keys given.

    Used by scenario modes so a typo in ``[[mode]]`` is caught with the same message as
    in a broker config.
    """
    values = _check_table(table, _MESH_OPTIONS, key)
    return {k: v for k, v in values.items() if k in table}


def parse_tree_options(table: dict, key: str = "") -> dict:
    """Validate tree connector options (no uri/node_type); returns only the keys given."""
    values = _check_table(table, _TREE_OPTIONS, key)
    return {k: v for k, v in values.items() if k in table}


# --------------------------------------------------------------------------- load / parse


def read_toml(path: str | Path) -> dict:
    """Decode a TOML file; an unreadable or malformed file is a ConfigError naming it."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError("", f"{path}: cannot read: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError("", f"{path}: invalid TOML: {exc}") from None


def load_config(path: str | Path) -> BrokerConfig:
    """Read and validate one broker config file. Raises ConfigError on any problem."""
    return parse_config(read_toml(path), source=str(path))


def parse_config(data: dict, *, source: str = "<string>") -> BrokerConfig:
    """Validate a decoded TOML document. Relative paths resolve against ``source``'s
    folder when ``source`` names a file, else stay relative to the working directory."""
    try:
        return _parse(data, source)
    except ConfigError as exc:
        exc.add_note(f"in {source}")
        raise


def _parse(data: dict, source: str) -> BrokerConfig:
    for name in data:
        if name not in _SECTIONS:
            raise ConfigError(name, "unknown section" + _suggest(name, _SECTIONS))
    if "broker" not in data:
        raise ConfigError("broker", "required section is missing")
    base = None if source.startswith("<") else Path(source).parent

    def resolve(p: str) -> str:
        return str(base / p) if base is not None and p and not Path(p).is_absolute() else p

    b = _check_table(data["broker"], _BROKER, "broker")
    b["name"] = b["name"] or b["id"]
    b["data_dir"] = resolve(b["data_dir"] or f"data/{b['id']}")
    broker = BrokerSection(**b)

    lg = _check_table(data.get("logging", {}), _LOGGING, "logging")
    lg["file"] = resolve(lg["file"])
    logging = LoggingSection(**lg)

    policies = tuple(
        PolicyConfig(**_check_table(p, _POLICY, f"policy[{i}]"))
        for i, p in enumerate(_array_of_tables(data.get("policy", []), "policy")))

    tree = None
    if "tree_connector" in data:
        if isinstance(data["tree_connector"], list):
            raise ConfigError("tree_connector", "at most one tree connector: use "
                                                "[tree_connector], not [[tree_connector]]")
        tree = TreeConnectorConfig(**_check_table(data["tree_connector"], _TREE,
                                                  "tree_connector"))

    mesh: list[NetworkConnectorConfig] = []
    seen: dict[str, int] = {}
    raw = _array_of_tables(data.get("network_connector", []), "network_connector")
    for i, table in enumerate(raw):
        key = f"network_connector[{i}]"
        values = _resolve_ttls(_check_table(table, _MESH, key))
        if values["name"] in seen:
            raise ConfigError(f"{key}.name", f'duplicate connector name "{values["name"]}" '
                                             f"(also network_connector[{seen[values['name']]}]"
                                             "); give each connector its own name")
        seen[values["name"]] = i
        mesh.append(NetworkConnectorConfig(**values))

    security = _parse_security(data.get("security", {}), resolve)
    for i, text in enumerate(broker.listen):
        if text.lower().startswith(("ssl://", "stomp+ssl://")) and not security.tls.cert:
            raise ConfigError("security.tls.cert", f"required by the "
                                                   f"{text.partition(':')[0]}:// listener "
                                                   f"broker.listen[{i}]")
    monitor = MonitorSection(**_check_table(data.get("monitor", {}), _MONITOR, "monitor"))
    if monitor.listen.lower().startswith("https:") and not security.tls.cert:
        raise ConfigError("security.tls.cert", "required by the https:// monitor.listen")
    if monitor.basic_auth and not security.users:
        raise ConfigError("monitor.basic_auth", "no [[security.user]] is configured: "
                                                "nobody could log in")
    store = StoreSection(**_check_table(data.get("store", {}), _STORE, "store"))
    return BrokerConfig(broker, logging, policies, tree, tuple(mesh),
                        source_path=None if base is None else source, security=security,
                        monitor=monitor, store=store)


def _parse_security(data: Any, resolve: Callable[[str], str]) -> SecurityConfig:
    if not isinstance(data, dict):
        raise ConfigError("security", f"must be a table, got {_show(data)}")
    known = {**_SECURITY, **dict.fromkeys(_SECURITY_TABLES)}
    for name in data:
        if name not in known:
            raise ConfigError(f"security.{name}", "unknown key" + _suggest(name, known))
    values = _check_table({k: v for k, v in data.items() if k in _SECURITY}, _SECURITY,
                          "security")
    if values["max_failure_delay"] < values["failure_delay"]:
        raise ConfigError("security.max_failure_delay", "must be >= failure_delay")

    users: list[UserConfig] = []
    seen: dict[str, int] = {}
    for i, table in enumerate(_array_of_tables(data.get("user", []), "security.user")):
        user = UserConfig(**_check_table(table, _USER, f"security.user[{i}]"))
        if user.name in seen:
            raise ConfigError(f"security.user[{i}].name",
                              f'duplicate user "{user.name}" '
                              f"(also security.user[{seen[user.name]}])")
        seen[user.name] = i
        users.append(user)
    groups = {g for u in users for g in u.groups}

    permissions: list[PermissionConfig] = []
    raw = _array_of_tables(data.get("permission", []), "security.permission")
    for i, table in enumerate(raw):
        key = f"security.permission[{i}]"
        perm = PermissionConfig(**_check_table(table, _PERMISSION, key))
        who = perm.principal
        # a principal nobody matches would silently grant nothing: refuse the typo
        if who.startswith("group:"):
            if who[6:] not in groups:
                raise ConfigError(f"{key}.principal",
                                  f"no user is in group {_show(who[6:])}"
                                  + _suggest(who[6:], groups or {"(none)"}, "groups"))
        elif who != "*" and who not in seen:
            raise ConfigError(f"{key}.principal", f"no user named {_show(who)}"
                              + _suggest(who, seen or {"(none)"}, "users"))
        permissions.append(perm)

    tls = _check_table(data.get("tls", {}), _TLS, "security.tls")
    for name in ("cert", "key", "ca"):
        tls[name] = resolve(tls[name])
    if tls["key"] and not tls["cert"]:
        raise ConfigError("security.tls.cert", "required when security.tls.key is set")
    if tls["verify_peer"] and not tls["ca"]:
        raise ConfigError("security.tls.ca", "verify_peer needs a CA bundle to verify "
                                             "client certificates against")
    tree = _check_table(data.get("tree", {}), _TREE_SCOPE, "security.tree")

    if values["authentication"] and not users:
        raise ConfigError("security.user", "authentication is on but no user is "
                                           "configured: nobody could connect")
    return SecurityConfig(**values, users=tuple(users), permissions=tuple(permissions),
                          tls=TlsConfig(**tls), tree=TreeScopeConfig(**tree))


# --------------------------------------------------------------------------- dump


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        # JSON string escapes are a subset of TOML basic-string escapes; DEL is the one
        # control character JSON leaves raw and TOML refuses.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _toml_table(header: str, obj: Any) -> str:
    lines = [header]
    lines += [f"{f.name} = {_toml_value(getattr(obj, f.name))}" for f in fields(obj)
              if getattr(obj, f.name) is not None]   # None: the default, left out
    return "\n".join(lines) + "\n"


def dump_config(config: BrokerConfig) -> str:
    """The config as TOML text, every key explicit (paths as resolved at load time)."""
    parts = [_toml_table("[broker]", config.broker), _toml_table("[logging]", config.logging)]
    parts += [_toml_table("[[policy]]", p) for p in config.policies]
    if config.tree_connector is not None:
        parts.append(_toml_table("[tree_connector]", config.tree_connector))
    parts += [_toml_table("[[network_connector]]", n) for n in config.network_connectors]
    sec = config.security
    if sec != SecurityConfig():
        lines = ["[security]"] + [f"{name} = {_toml_value(getattr(sec, name))}"
                                  for name in _SECURITY]
        parts.append("\n".join(lines) + "\n")
        parts += [_toml_table("[[security.user]]", u) for u in sec.users]
        parts += [_toml_table("[[security.permission]]", p) for p in sec.permissions]
        parts.append(_toml_table("[security.tls]", sec.tls))
        parts.append(_toml_table("[security.tree]", sec.tree))
    if config.monitor != MonitorSection():
        parts.append(_toml_table("[monitor]", config.monitor))
    if config.store != StoreSection():
        parts.append(_toml_table("[store]", config.store))
    return "\n".join(parts)
