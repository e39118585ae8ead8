"""The one exception family of treefed.

Like h11's LocalProtocolError / RemoteProtocolError, errors are split by *whose* fault
they are: ``LocalError`` when our own caller misused an API or config, ``RemoteError``
when a peer (client or broker) sent something we refuse.  Foreign exceptions (OSError,
cbor2, sqlite3) are translated into these once, at the edge that called the library.

Every error carries a short machine ``code`` (sent in ``error`` frames, asserted by
tests) and a human message.
"""

from __future__ import annotations

__all__ = [
    "TreefedError",
    "LocalError",
    "RemoteError",
    "ConfigError",
    "SelectorError",
    "DestinationError",
    "FrameError",
    "LimitError",
    "StoreError",
]


class TreefedError(Exception):
    """Base of every treefed error. ``code`` names the problem for machines."""

    code = "error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class LocalError(TreefedError):
    """Our own side misused something (bad argument, bad config)."""

    code = "local"


class RemoteError(TreefedError):
    """A peer sent something we refuse. The connection's other traffic is unaffected."""

    code = "remote"


class ConfigError(LocalError):
    """A config or scenario file is invalid. ``key`` is the dotted key at fault."""

    code = "config"

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}" if key else problem)
        self.key = key
        self.problem = problem


class SelectorError(RemoteError):
    """A message selector does not parse or type-check. ``position`` is 0-based or None."""

    code = "bad_selector"

    def __init__(self, message: str, *, position: int | None = None) -> None:
        where = f" at position {position}" if position is not None else ""
        super().__init__(f"invalid selector{where}: {message}")
        self.position = position
        self.reason = message


class DestinationError(RemoteError):
    """A destination name is invalid."""

    code = "bad_destination"


class FrameError(RemoteError):
    """A frame is malformed: bad CBOR, unknown type, missing/mistyped field, oversized."""

    code = "bad_frame"


class LimitError(RemoteError):
    """A configured limit refused the request (destination full, message too large...)."""

    code = "limit"


class StoreError(TreefedError):
    """The message store failed (disk full, corrupt database)."""

    code = "store"
