"""Connection URIs: ``tcp://h:p``, ``ssl://h:p``, ``failover:(...)?opts``, ``static:(...)?opts``.

Theory of operation
-------------------
``parse_uri`` turns the text a user wrote in a config file into one frozen value:

* ``Endpoint`` — one address.  ``tcp://host:port`` or ``ssl://host:port``; an IPv6 host is
  written in brackets (``tcp://[::1]:61616``).  The port is required: a URI that silently
  defaulted a port would connect somewhere the user did not mean.
* ``Failover`` — one connection to whichever listed endpoint answers (a parent with a
  standby).  ActiveMQ failover option names and defaults.
* ``Static`` — the ActiveMQ static discovery list used by network connectors.  In ActiveMQ
  every listed endpoint becomes its own bridge; the node does that split.  Reconnect options
  are those of the static agent, whose defaults differ from failover's.

Options use ActiveMQ's names and units (milliseconds); the dataclasses hold seconds, the
unit every other treefed timer uses.  ``maxReconnectAttempts`` keeps ActiveMQ's meaning per
scheme (failover: -1 unlimited, 0 no retry; static: 0 unlimited), normalised by
``retry_limit`` (None = unlimited).

Every problem is a ``ConfigError`` naming the offending option or part.  This module only
parses: it never resolves names or opens sockets.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from treefed.errors import ConfigError

__all__ = ["Endpoint", "Failover", "Static", "Target", "parse_uri"]

_SIMPLE_SCHEMES = ("tcp", "ssl")
#: schemes only a listener takes: STOMP clients (node/stomp_conn.py), plain or TLS
_LISTEN_SCHEMES = ("stomp", "stomp+ssl")
_HOSTNAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?\Z")


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One address to connect to or listen on."""

    scheme: str     # "tcp" or "ssl"
    host: str       # hostname or IP literal, IPv6 without brackets
    port: int       # 1..65535 (0 only in listen URIs: any free port)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        """A single endpoint is a list of one, so callers can treat every target alike."""
        return (self,)


@dataclass(frozen=True, slots=True)
class Failover:
    """Failover transport: one live connection to any of ``endpoints``."""

    endpoints: tuple[Endpoint, ...]
    initial_reconnect_delay: float = 0.010  # seconds before the first reconnect
    max_reconnect_delay: float = 30.0       # cap on the delay between attempts
    use_exponential_backoff: bool = True
    backoff_multiplier: float = 2.0
    max_reconnect_attempts: int = -1        # ActiveMQ: -1 unlimited, 0 = never retry
    randomize: bool = True                  # pick endpoints in random order

    @property
    def retry_limit(self) -> int | None:
        """Reconnect attempts allowed, None for unlimited."""
        return None if self.max_reconnect_attempts < 0 else self.max_reconnect_attempts

    def __str__(self) -> str:
        return _composite_text("failover", self, Failover)


@dataclass(frozen=True, slots=True)
class Static:
    """Static discovery list of a network connector (one bridge per endpoint in ActiveMQ)."""

    endpoints: tuple[Endpoint, ...]
    initial_reconnect_delay: float = 1.0
    max_reconnect_delay: float = 30.0
    use_exponential_backoff: bool = True
    backoff_multiplier: float = 2.0
    max_reconnect_attempts: int = 0         # ActiveMQ static agent: 0 = unlimited
    randomize: bool = False

    @property
    def retry_limit(self) -> int | None:
        """Reconnect attempts allowed, None for unlimited."""
        return None if self.max_reconnect_attempts <= 0 else self.max_reconnect_attempts

    def __str__(self) -> str:
        return _composite_text("static", self, Static)


Target = Endpoint | Failover | Static

# ActiveMQ option name -> (dataclass field, parser)
_MS, _BOOL, _FLOAT, _INT = "ms", "bool", "float", "int"
_OPTIONS: dict[str, tuple[str, str]] = {
    "initialReconnectDelay": ("initial_reconnect_delay", _MS),
    "maxReconnectDelay": ("max_reconnect_delay", _MS),
    "useExponentialBackOff": ("use_exponential_backoff", _BOOL),
    "backOffMultiplier": ("backoff_multiplier", _FLOAT),
    "maxReconnectAttempts": ("max_reconnect_attempts", _INT),
    "randomize": ("randomize", _BOOL),
}


def parse_uri(text: str, *, key: str = "uri", listen: bool = False) -> Target:
    """Parse a connection URI. ``key`` names the config key in errors; ``listen`` allows
    port 0 (bind any free port) for a single endpoint."""
    if not isinstance(text, str):
        raise ConfigError(key, f"expected a URI string, got {type(text).__name__}")
    text = text.strip()
    scheme, sep, rest = text.partition(":")
    scheme = scheme.lower()
    if sep and rest.isdigit():
        raise ConfigError(key, f"{text!r} is a bare host:port, not a URI: "
                               f"write tcp://{text}")
    if listen and scheme in ("stomp", "stomp+ssl"):
        return _parse_endpoint(text, key, listen=listen)
    if not sep or not scheme.isalpha():
        raise ConfigError(key, f"{text!r} is not a URI: expected scheme://host:port, "
                               "e.g. tcp://127.0.0.1:61616")
    if scheme in ("failover", "static"):
        if listen:
            raise ConfigError(key, f"a {scheme}: URI cannot be listened on")
        return _parse_composite(scheme, rest, text, key)
    if scheme in _SIMPLE_SCHEMES:
        return _parse_endpoint(text, key, listen=listen)
    raise ConfigError(key, f"unsupported scheme {scheme!r} in {text!r} "
                           "(use tcp, ssl, failover or static)")


def _parse_endpoint(text: str, key: str, *, listen: bool = False) -> Endpoint:
    scheme, sep, rest = text.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in (_SIMPLE_SCHEMES + _LISTEN_SCHEMES if listen
                                 else _SIMPLE_SCHEMES):
        raise ConfigError(key, f"{text!r} is not a tcp:// or ssl:// URI")
    if "?" in rest:
        option = rest.partition("?")[2].partition("=")[0]
        raise ConfigError(key, f"unknown option {option!r} in {text!r}")
    if "/" in rest or "@" in rest:
        raise ConfigError(key, f"{text!r}: expected only host:port after {scheme}://")
    if rest.startswith("["):
        host, bracket, port_text = rest[1:].partition("]")
        if not bracket or not port_text.startswith(":"):
            raise ConfigError(key, f"{text!r}: expected [ipv6]:port")
        port_text = port_text[1:]
        try:
            if ipaddress.ip_address(host).version != 6:
                raise ValueError
        except ValueError:
            raise ConfigError(key, f"{text!r}: {host!r} is not an IPv6 address") from None
    else:
        host, colon, port_text = rest.rpartition(":")
        if not colon:
            raise ConfigError(key, f"{text!r}: the port is required (host:port)")
        if ":" in host:
            raise ConfigError(key, f"{text!r}: write an IPv6 host in brackets, [{host}]")
        if not _HOSTNAME.match(host):
            raise ConfigError(key, f"{text!r}: invalid host {host!r}")
    if not port_text.isdigit() or not port_text.isascii():
        raise ConfigError(key, f"{text!r}: port {port_text!r} is not a number")
    port = int(port_text)
    if not (0 if listen else 1) <= port <= 65535:
        raise ConfigError(key, f"{text!r}: port {port} is out of range "
                               f"({0 if listen else 1}..65535)")
    return Endpoint(scheme, host, port)


def _parse_composite(scheme: str, rest: str, text: str, key: str) -> Failover | Static:
    if rest.startswith("//"):
        rest = rest[2:]  # ActiveMQ also accepts static://(...) and failover://(...)
    if rest.startswith("("):
        inner, paren, query = rest[1:].rpartition(")")
        if not paren:
            raise ConfigError(key, f"{text!r}: missing ')'")
        if query and not query.startswith("?"):
            raise ConfigError(key, f"{text!r}: unexpected {query!r} after ')'")
        query = query[1:]
    else:
        inner, query = rest, ""  # failover:tcp://a:1,tcp://b:2 (no options)
    parts = [p.strip() for p in inner.split(",")]
    if not inner.strip() or not all(parts):
        raise ConfigError(key, f"{text!r}: empty endpoint in the list")
    for part in parts:
        if part.lower().startswith(("failover:", "static:")):
            raise ConfigError(key, f"{text!r}: nested {part.partition(':')[0]}: URIs "
                                   "are not supported")
    endpoints = tuple(_parse_endpoint(p, key) for p in parts)
    cls = Failover if scheme == "failover" else Static
    values = _parse_options(query, text, key)
    result = cls(endpoints, **values)
    if result.max_reconnect_delay < result.initial_reconnect_delay:
        raise ConfigError(key, f"{text!r}: maxReconnectDelay is below initialReconnectDelay")
    return result


def _parse_options(query: str, text: str, key: str) -> dict[str, object]:
    values: dict[str, object] = {}
    if not query:
        return values
    for pair in query.split("&"):
        name, eq, raw = pair.partition("=")
        if name not in _OPTIONS:
            known = ", ".join(_OPTIONS)
            raise ConfigError(key, f"unknown option {name!r} in {text!r} (known: {known})")
        if not eq or not raw:
            raise ConfigError(key, f"option {name} needs a value")
        field, kind = _OPTIONS[name]
        if field in values:
            raise ConfigError(key, f"option {name} is given twice")
        values[field] = _option_value(name, kind, raw, key)
    return values


def _option_value(name: str, kind: str, raw: str, key: str) -> object:
    if kind == _BOOL:
        if raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        raise ConfigError(key, f"option {name}={raw!r}: expected true or false")
    if kind == _FLOAT:
        try:
            value = float(raw)
        except ValueError:
            value = float("nan")
        if not value >= 1.0 or value == float("inf"):
            raise ConfigError(key, f"option {name}={raw!r}: expected a number >= 1")
        return value
    try:
        number = int(raw)
    except ValueError:
        raise ConfigError(key, f"option {name}={raw!r}: expected an integer") from None
    if kind == _MS:
        if number < 0:
            raise ConfigError(key, f"option {name}={raw!r}: milliseconds must be >= 0")
        return number / 1000.0
    if number < -1:
        raise ConfigError(key, f"option {name}={raw!r}: expected -1 or more")
    return number


def _composite_text(scheme: str, target: Failover | Static, cls: type) -> str:
    """Render back to ActiveMQ syntax, options only where they differ from the defaults."""
    defaults = cls((),)
    options = []
    for name, (field, kind) in _OPTIONS.items():
        value = getattr(target, field)
        if value == getattr(defaults, field):
            continue
        if kind == _MS:
            value = round(value * 1000)
        elif kind == _BOOL:
            value = str(value).lower()
        options.append(f"{name}={value}")
    inner = ",".join(str(e) for e in target.endpoints)
    return f"{scheme}:({inner})" + (f"?{'&'.join(options)}" if options else "")
