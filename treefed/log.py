"""Logging: structlog configured once, and a fast writer for the event log.

Theory of operation
-------------------
Two ways out, one schema (``treefed.events``): every line carries ``ts`` (float epoch
seconds, virtual seconds in replay), ``broker``, ``event`` (the event name, which is
structlog's own message key, so nothing needs renaming) and ``v`` (SCHEMA_VERSION), plus
``run`` in scenario runs.

* ``configure_logging`` sets up structlog for a broker process: level filtering in the
  bound logger class itself (``make_filtering_bound_logger``, so a disabled debug call is a
  bare ``return``), processors add ``level``, ``ts`` and ``v``; only the last one renders —
  JSON lines when the output is not a terminal, the console renderer when it is.  The
  node binds ``broker`` (and ``link``) with ``get_logger(broker=...)``.
* ``EventWriter`` is for scenario runs that write millions of lines: a structlog
  processor chain costs several microseconds a line, so it formats each line directly with
  one pre-built JSON encoder, caches the constant ``broker``/``event`` part, and writes in
  chunks of many lines (gzip when the path ends in ``.gz``).

Nothing here is imported by the pure packages; they return ``Log`` actions and the shell
hands them to one of these.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import sys
from pathlib import Path
from typing import IO, Any

import structlog

from treefed.errors import ConfigError
from treefed.events import SCHEMA_VERSION

__all__ = ["configure_logging", "get_logger", "add_schema_version", "EventWriter"]

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}

# The file configure_logging opened itself, closed when it is called again.
_owned_file: IO[str] | None = None


def add_schema_version(logger: Any, method: str, event_dict: dict) -> dict:
    """Processor: stamp the event-log schema version ``v`` on every line."""
    event_dict.setdefault("v", SCHEMA_VERSION)
    return event_dict


def configure_logging(level: str = "info", *, file: str | os.PathLike | IO[str] | None = None,
                      json: bool | None = None) -> None:
    """Configure structlog for this process.

    ``file``: None or "" for stderr, a path (appended to) or an open text file.
    ``json``: force JSON lines (True) or the console renderer (False); None picks JSON
    unless the output is a terminal.
    """
    global _owned_file
    try:
        min_level = _LEVELS[level.lower()]
    except (KeyError, AttributeError):
        raise ConfigError("logging.level", f"must be one of {', '.join(_LEVELS)}, "
                                           f"got {level!r}") from None
    if _owned_file is not None:
        _owned_file.close()
        _owned_file = None
    if file is None or file == "":
        stream: IO[str] = sys.stderr
    elif isinstance(file, (str, os.PathLike)):
        stream = _owned_file = open(file, "a", encoding="utf-8")
    else:
        stream = file
    if json is None:
        json = not (hasattr(stream, "isatty") and stream.isatty())

    processors: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt=None, key="ts"),  # fmt=None: float epoch
        add_schema_version,
    ]
    if json:
        processors += [structlog.processors.format_exc_info,
                       structlog.processors.JSONRenderer(separators=(",", ":"))]
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=stream.isatty()))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(min_level),
        logger_factory=structlog.WriteLoggerFactory(file=stream),
        cache_logger_on_first_use=True,
    )


def get_logger(**bind: Any) -> Any:
    """A bound logger with ``bind`` in its context (the node binds ``broker``)."""
    logger = structlog.get_logger()
    return logger.bind(**bind) if bind else logger


# --------------------------------------------------------------------------- event writer

# One encoder built once: json.dumps with keyword arguments builds a new encoder per call.
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False,
                           default=str).encode


class EventWriter:
    """Buffered JSON-lines writer for the event log (see module docstring).

    ``path_or_file``: a path (``.gz`` suffix -> gzip unless ``compress`` says otherwise)
    or an open file, text or binary, which is flushed but not closed by ``close()``.
    ``fields`` must not repeat the common keys (ts, broker, event, run, v).
    """

    __slots__ = ("_file", "_owned", "_gzip", "_text", "_buf", "_limit", "_prefix", "_run",
                 "lines")

    def __init__(self, path_or_file: str | os.PathLike | IO, *, run: str | None = None,
                 compress: bool | None = None, buffer_lines: int = 8192) -> None:
        self._gzip: gzip.GzipFile | None = None
        if isinstance(path_or_file, (str, os.PathLike)):
            path = Path(path_or_file)
            if compress if compress is not None else path.suffix == ".gz":
                # Level 3: a run's log compresses ~10x; higher levels cost CPU for little.
                self._file: IO = gzip.open(path, "wb", compresslevel=3)
            else:
                self._file = open(path, "wb")
            self._owned = True
            self._text = False
        else:
            self._file = path_or_file
            self._owned = False
            self._text = isinstance(path_or_file, io.TextIOBase)
            if compress:
                if self._text:
                    raise ValueError("compress=True needs a binary file")
                self._gzip = self._file = gzip.GzipFile(fileobj=path_or_file, mode="wb",
                                                        compresslevel=3)
        self._run = run
        self._buf: list[str] = []
        self._limit = buffer_lines
        self._prefix: dict[tuple[str, str], str] = {}
        self.lines = 0  # lines written so far (buffered included)

    def write(self, ts: float, broker: str, event: str, fields: dict[str, Any] | None = None,
              ) -> None:
        """Append one event line (``event`` a name from events.EVENTS)."""
        prefix = self._prefix.get((broker, event))
        if prefix is None:
            prefix = self._prefix[(broker, event)] = self._make_prefix(broker, event)
        if fields:
            self._buf.append(f'{{"ts":{ts!r}{prefix},{_encode(fields)[1:]}\n')
        else:
            self._buf.append(f'{{"ts":{ts!r}{prefix}}}\n')
        self.lines += 1
        if len(self._buf) >= self._limit:
            self.flush()

    def _make_prefix(self, broker: str, event: str) -> str:
        run = f',"run":{_encode(self._run)}' if self._run is not None else ""
        return f',"broker":{_encode(broker)},"event":{_encode(event)}{run},"v":{SCHEMA_VERSION}'

    def flush(self) -> None:
        """Write buffered lines through to the file."""
        if self._buf:
            chunk = "".join(self._buf)
            self._buf.clear()
            self._file.write(chunk if self._text else chunk.encode("utf-8"))
        self._file.flush()

    def close(self) -> None:
        """Flush, and close the file if this writer opened it. Idempotent."""
        if self._file is None:
            return
        self.flush()
        if self._owned or self._gzip is not None:
            self._file.close()
        self._file = None

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
