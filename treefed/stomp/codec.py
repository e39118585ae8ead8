"""STOMP 1.0-1.2 frames: an incremental parser and an encoder (pure, no I/O).

Theory of operation
-------------------
A STOMP frame is ``COMMAND EOL (name:value EOL)* EOL body NUL``, where EOL is LF or
CR LF.  Between frames a peer may send bare EOLs: heart-beats.  ``StompDecoder`` is an
h11-style parser: ``receive_data(bytes)`` buffers, ``next_frame()`` returns a
``StompFrame`` or ``NEED_DATA``; ``frames()`` yields every complete frame buffered.
Invariants:

* Heart-beat EOLs are skipped and counted (``heartbeats``); any byte counts as life.
* The header block (command and headers) is at most ``max_header_bytes`` and holds at
  most ``max_headers`` headers; the body is at most ``max_body``.  Each limit is checked
  as soon as the bytes that break it are buffered (or, for a ``content-length`` body,
  as soon as the header names it), so a hostile peer never makes us hold more.
* A body with ``content-length`` is exactly that many bytes (NULs included) followed by
  NUL; without it the body ends at the first NUL.
* Header escaping (``\\r \\n \\c \\\\``) is decoded once ``escapes`` is on (STOMP 1.1
  and 1.2 after CONNECT; never for CONNECT / CONNECTED themselves, as the spec says);
  an undefined escape is an error.  A repeated header keeps its FIRST value.
* Commands are checked against ``commands`` (the client's set by default).
* Every failure is a ``FrameError`` whose ``code`` names it (``bad_frame``,
  ``unknown_command``, ``too_many_headers``, ``headers_too_large``, ``body_too_large``,
  ``bad_header``); the decoder then stays broken (the connection is closing).

``encode`` is the inverse (escaping per ``escapes``, ``content-length`` added to every
frame with a body).  Nothing here knows what a frame means: ``adapter.py`` does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterator

from treefed.errors import FrameError

__all__ = ["StompFrame", "StompDecoder", "NEED_DATA", "CLIENT_COMMANDS", "SERVER_COMMANDS",
           "encode", "escape", "unescape", "MAX_HEADERS", "MAX_HEADER_BYTES",
           "DEFAULT_MAX_BODY"]

#: Most headers one frame may carry (ActiveMQ refuses more than 1000 too).
MAX_HEADERS = 1000
#: Longest header block (command line and every header line), in bytes.
MAX_HEADER_BYTES = 64 * 1024
#: Default largest body, in bytes (a broker uses its ``max_frame_bytes``).
DEFAULT_MAX_BODY = 4 * 1024 * 1024

CLIENT_COMMANDS = frozenset({"CONNECT", "STOMP", "SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK",
                             "NACK", "BEGIN", "COMMIT", "ABORT", "DISCONNECT"})
SERVER_COMMANDS = frozenset({"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"})
_UNESCAPED = frozenset({"CONNECT", "CONNECTED", "STOMP"})


class _NeedData:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA = _NeedData()

_ESCAPES = {"r": "\r", "n": "\n", "c": ":", "\\": "\\"}
_ESCAPE_SEQ = re.compile(r"\\(.?)", re.S)
_SPECIAL = re.compile(r"[\\:\r\n]")


@dataclass(slots=True)
class StompFrame:
    """One STOMP frame.  ``headers`` keeps the first value of a repeated name, in order."""

    command: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def _unescape_one(m: re.Match) -> str:
    ch = _ESCAPES.get(m.group(1))
    if ch is None:
        seq = m.group(0)
        raise FrameError(f"undefined escape sequence {seq!r} in a header"
                         if len(seq) > 1 else "header ends inside an escape sequence",
                         code="bad_header")
    return ch


def unescape(text: str) -> str:
    """Decode a 1.1/1.2 escaped header name or value; FrameError on an undefined escape."""
    if "\\" not in text:
        return text
    return _ESCAPE_SEQ.sub(_unescape_one, text)


def escape(text: str) -> str:
    # four C-level scans cost less than one regex call on the short values of headers
    if "\\" not in text and ":" not in text and "\n" not in text and "\r" not in text:
        return text
    return (text.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n")
            .replace(":", "\\c"))


class StompDecoder:
    """Incremental STOMP parser (see module doc)."""

    __slots__ = ("_buf", "_pos", "_error", "max_headers", "max_header_bytes", "max_body",
                 "commands", "escapes", "heartbeats", "_head", "_scan")

    def __init__(self, *, max_headers: int = MAX_HEADERS,
                 max_header_bytes: int = MAX_HEADER_BYTES, max_body: int = DEFAULT_MAX_BODY,
                 commands: frozenset[str] = CLIENT_COMMANDS) -> None:
        self._buf = bytearray()
        self._pos = 0               # start of unparsed input in _buf
        self._error: FrameError | None = None
        self.max_headers = max_headers
        self.max_header_bytes = max_header_bytes
        self.max_body = max_body
        self.commands = commands
        self.escapes = False        # decode header escapes (1.1/1.2 after CONNECT)
        self.heartbeats = 0         # bare EOLs seen between frames
        self._head: tuple[StompFrame, int, int | None] | None = None  # parsed header
        #                             block waiting for its body: (frame, body start, length)
        self._scan = 0              # where the NUL search resumes (no content-length)

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as frames (heart-beats excluded)."""
        return len(self._buf) - self._pos

    def receive_data(self, data: bytes) -> None:
        self._buf += data

    def frames(self) -> Iterator[StompFrame]:
        """Every complete frame buffered; raises FrameError at the first malformed one."""
        while True:
            frame = self.next_frame()
            if frame is NEED_DATA:
                return
            yield frame

    def next_frame(self) -> StompFrame | _NeedData:
        if self._error is not None:
            raise self._error
        try:
            frame = self._next()
        except FrameError as exc:
            self._error = exc
            raise
        except UnicodeDecodeError as exc:
            self._error = FrameError(f"frame is not UTF-8: {exc.reason}", code="bad_frame")
            raise self._error from None
        if self._pos > 65536 and self._pos * 2 > len(self._buf):
            del self._buf[:self._pos]
            if self._head is not None:
                f, start, length = self._head
                self._head = (f, start - self._pos, length)
            self._scan = max(0, self._scan - self._pos)
            self._pos = 0
        return frame

    def _next(self) -> StompFrame | _NeedData:
        buf = self._buf
        if self._head is None:
            pos, end = self._pos, len(buf)
            while pos < end:                            # heart-beats between frames
                b = buf[pos]
                if b == 10:
                    self.heartbeats += 1
                    pos += 1
                elif b == 13 and pos + 1 < end and buf[pos + 1] == 10:
                    self.heartbeats += 1
                    pos += 2
                elif b == 13 and pos + 1 == end:
                    break
                else:
                    break
            self._pos = pos
            if pos >= end or (buf[pos] == 13 and pos + 1 == end):
                return NEED_DATA
            stop = buf.find(b"\n\n", pos)
            # a CR LF blank line can only end the block if it starts before ``stop``:
            # bounding the search keeps a buffer of many frames linear to parse
            crlf = buf.find(b"\n\r\n", pos, stop + 2 if stop != -1 else len(buf))
            if crlf != -1 and (stop == -1 or crlf < stop):
                block_end, body_start = crlf, crlf + 3
            elif stop != -1:
                block_end, body_start = stop, stop + 2
            else:
                if end - pos > self.max_header_bytes:
                    raise _limit("headers_too_large", f"header block longer than "
                                 f"{self.max_header_bytes} bytes")
                nul = buf.find(b"\0", pos)
                if nul != -1:
                    raise FrameError("frame ends (NUL) inside its header block",
                                     code="bad_frame")
                return NEED_DATA
            if block_end - pos > self.max_header_bytes:
                raise _limit("headers_too_large",
                             f"header block longer than {self.max_header_bytes} bytes")
            frame, length = self._parse_head(buf[pos:block_end].decode("utf-8"))
            self._head = (frame, body_start, length)
            self._scan = body_start
        frame, start, length = self._head
        if length is not None:
            if len(buf) < start + length + 1:
                return NEED_DATA
            if buf[start + length] != 0:
                raise FrameError(f"{frame.command}: no NUL after the {length}-byte body "
                                 "that content-length announced", code="bad_frame")
            nul = start + length
        else:
            nul = buf.find(b"\0", self._scan)
            if nul == -1:
                self._scan = len(buf)
                if len(buf) - start > self.max_body:
                    raise _limit("body_too_large",
                                 f"body longer than {self.max_body} bytes")
                return NEED_DATA
            if nul - start > self.max_body:
                raise _limit("body_too_large", f"body longer than {self.max_body} bytes")
        frame.body = bytes(buf[start:nul])
        self._pos = nul + 1
        self._head = None
        return frame

    def _parse_head(self, text: str) -> tuple[StompFrame, int | None]:
        lines = text.split("\n")
        command = lines[0]
        if command.endswith("\r"):
            command = command[:-1]
        if command not in self.commands:
            shown = command if len(command) <= 40 else command[:40] + "..."
            raise FrameError(f"unknown command {shown!r}", code="unknown_command")
        if len(lines) - 1 > self.max_headers:
            raise _limit("too_many_headers", f"more than {self.max_headers} headers")
        escaped = self.escapes and command not in _UNESCAPED and "\\" in text
        crlf = "\r" in text
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if crlf and line.endswith("\r"):
                line = line[:-1]
            key, colon, val = line.partition(":")
            if not colon:
                raise FrameError(f"{command}: header line without ':': {line[:40]!r}",
                                 code="bad_header")
            if escaped:
                key, val = unescape(key), unescape(val)
            if key not in headers:
                headers[key] = val
        length: int | None = None
        text = headers.get("content-length")
        if text is not None:
            if not text.isdigit() or not text.isascii():
                raise FrameError(f"{command}: content-length {text!r} is not a number",
                                 code="bad_header")
            length = int(text)
            if length > self.max_body:
                raise _limit("body_too_large", f"body of {length} bytes: longer than "
                             f"{self.max_body} bytes")
        return StompFrame(command, headers), length


def _limit(code: str, what: str) -> FrameError:
    return FrameError(f"limit exceeded: {what}", code=code)


def encode(frame: StompFrame, *, escapes: bool = True) -> bytes:
    """A frame's bytes.  ``content-length`` is added whenever there is a body."""
    esc = escapes and frame.command not in _UNESCAPED
    parts = [frame.command]
    if esc:
        names = _ESCAPED_NAMES
        for name, value in frame.headers.items():
            key = names.get(name)
            if key is None:
                key = escape(name)
                if len(names) < 4096:
                    names[name] = key
            parts.append(f"{key}:{escape(value)}")
    else:
        parts += [f"{name}:{value}" for name, value in frame.headers.items()]
    body = frame.body
    if body:
        if "content-length" in frame.headers:
            parts = [p for p in parts if not p.startswith("content-length:")]
        parts.append(f"content-length:{len(body)}")
    parts.append("\n")
    return "\n".join(parts).encode("utf-8") + body + b"\0"


#: header name -> its escaped form (names repeat on every message)
_ESCAPED_NAMES: dict[str, str] = {}
