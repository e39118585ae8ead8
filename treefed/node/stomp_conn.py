"""STOMP connections in the node: a ``FramedStream`` look-alike over the STOMP codec.

Theory of operation
-------------------
``BrokerNode`` runs every connection with one reader and one writer over an object with
``receive_frames()`` / ``send_frames(frames)`` / ``stream``.  ``StompStream`` is that
object for ``stomp://`` and ``stomp+ssl://`` listeners: it parses STOMP bytes
(``stomp.codec``), hands them to the connection's ``stomp.adapter.StompSession`` and
returns *native* frames; the writer's native frames come back out as STOMP bytes.  So the
site task, the authenticator, the guard, flow control, the overflow bound and ``stat``
treat a STOMP client exactly like a native one -- the node only chooses this class.

What only STOMP needs, and lives here:

* heart-beats as negotiated in CONNECT / CONNECTED: ``heartbeat_loop`` (started in the
  connection's nursery) writes an EOL when nothing else was written for ``send_every``;
  a read that waits more than twice ``expect_every`` raises
  ``FrameError(heartbeat_timeout)``, which the node answers with ERROR and a close.
  The node's own ping heart-beats skip STOMP connections (``protocol``).
* ``ack:auto``: after a batch of MESSAGE frames is written, one cumulative Ack per
  subscription is fed back to the site task through ``inject`` (the node's inbox).
* every ERROR ends the connection (STOMP has no recoverable error): once one is
  written, the pending read is cancelled and reports end of stream, so the node forgets
  the connection, flushes and closes.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable, Iterable

import trio

import treefed
from treefed.errors import FrameError
from treefed.stomp.adapter import StompSession
from treefed.stomp.codec import DEFAULT_MAX_BODY, StompDecoder, encode
from treefed.wire.frames import Ack, Deliver

__all__ = ["StompStream", "RECEIVE_SIZE", "HEARTBEAT_GRACE"]

RECEIVE_SIZE = 64 * 1024
#: a client is dead after this many of its announced heart-beat periods of silence
HEARTBEAT_GRACE = 2.0


class StompStream:
    """One STOMP connection's reader/writer (see module doc)."""

    protocol = "stomp"

    def __init__(self, stream: trio.abc.Stream, max_body: int = DEFAULT_MAX_BODY) -> None:
        self.stream = stream
        self.session = StompSession("stomp-" + secrets.token_hex(8),
                                    server=f"treefed/{treefed.__version__}")
        self._decoder = StompDecoder(max_body=max_body)
        self._send_lock = trio.Lock()       # writer and heart-beats share the stream
        self._last_tx = trio.current_time()
        self._read_scope: trio.CancelScope | None = None
        self._pending_error: FrameError | None = None   # raised after the frames before it
        self._inject: Callable[[list], Awaitable[None]] | None = None
        self._hb_changed = trio.Event()
        self.poller = None   # an IdlePoller told of every read (transport/idlepoll.py)

    def start(self, nursery: trio.Nursery,
              inject: Callable[[list], Awaitable[None]]) -> None:
        """Run heart-beats in the connection's nursery; ``inject(frames)`` feeds native
        frames (auto acks) to the site task as if this connection had sent them."""
        self._inject = inject
        nursery.start_soon(self.heartbeat_loop)

    # ------------------------------------------------------------------ reading
    async def receive_frames(self) -> list:
        """Native frames for the site task (never empty); EndOfChannel at the end."""
        decoder, session = self._decoder, self.session
        if self._pending_error is not None:
            raise self._pending_error
        if session.failed:
            raise trio.EndOfChannel("STOMP session ended (ERROR sent)")
        while True:
            out: list = []
            now = time.time()
            try:
                for frame in decoder.frames():
                    out += session.receive(frame, now)
                    if session.state == "closed":
                        break
            except FrameError as exc:
                session.fatal = exc
                if not out:
                    raise
                self._pending_error = exc
            if out:
                return out
            if session.state == "closed":
                # After DISCONNECT: wait for the client to close, discarding anything
                # else.  Reporting the end now could reach the site task in the same
                # batch as the DISCONNECT and cut off its RECEIPT.
                while await self._receive_some():
                    pass
                raise trio.EndOfChannel("STOMP session ended")
            data = await self._receive_some()
            if data and self.poller is not None:
                self.poller.poke()
            if not data:
                if decoder.buffered:
                    raise FrameError(f"connection closed inside a STOMP frame "
                                     f"({decoder.buffered} bytes pending)", code="truncated")
                raise trio.EndOfChannel("peer closed the connection")
            decoder.receive_data(data)

    async def _receive_some(self) -> bytes:
        """One read, bounded by the client's heart-beat period (re-armed when CONNECTED
        settles it) and cut short when an ERROR went out."""
        with trio.CancelScope() as scope:
            self._read_scope = scope
            self._arm(scope)
            try:
                return await self.stream.receive_some(RECEIVE_SIZE)
            finally:
                self._read_scope = None
        if self.session.failed:
            raise trio.EndOfChannel("STOMP session ended (ERROR sent)")
        every = self.session.expect_every * HEARTBEAT_GRACE
        raise FrameError(f"no heart-beat from the client for {every:g} s",
                         code="heartbeat_timeout")

    def _arm(self, scope: trio.CancelScope) -> None:
        every = self.session.expect_every
        scope.deadline = (trio.current_time() + every * HEARTBEAT_GRACE if every
                          else float("inf"))

    # ------------------------------------------------------------------ writing
    async def send_frames(self, frames: Iterable) -> None:
        session = self.session
        escapes = session.version != "1.0"
        chunks: list[bytes] = []
        message, auto = session.message, session.auto_subs
        last: dict[str, str] = {}      # auto-ack subscription -> last message written
        for native in frames:
            if type(native) is Deliver:             # the per-message case, inlined
                chunks.append(encode(message(native), escapes=escapes))
                if native.sub in auto:
                    last[native.sub] = native.msg
                continue
            for f in session.send(native)[0]:
                chunks.append(encode(f, escapes=escapes))
        if chunks:
            await self._write(b"".join(chunks))
            if session.state == "connected" and not self._decoder.escapes:
                self._decoder.escapes = session.version != "1.0"
                self._hb_changed.set()
                if self._read_scope is not None:   # the read in progress began before
                    self._arm(self._read_scope)    # heart-beats were agreed
        if last and self._inject is not None and not session.failed:
            await self._inject([Ack(s, m, upto=True) for s, m in last.items()])
        if session.failed and self._read_scope is not None:
            self._read_scope.cancel()

    async def _write(self, data: bytes) -> None:
        if not self.session.send_every:
            # no heart-beat task writes on this connection (it starts only after the
            # CONNECTED that fixed send_every went out): the lock's checkpoint is saved
            await self.stream.send_all(data)
            return
        async with self._send_lock:
            await self.stream.send_all(data)
            self._last_tx = trio.current_time()

    async def heartbeat_loop(self) -> None:
        """Write an EOL whenever nothing else went out for the negotiated period."""
        await self._hb_changed.wait()
        every = self.session.send_every
        if not every:
            return
        try:
            while not self.session.failed and self.session.state != "closed":
                wait = self._last_tx + every - trio.current_time()
                if wait > 0:
                    await trio.sleep(wait)
                    continue
                await self._write(b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError,
                trio.BusyResourceError):
            pass

    async def aclose(self) -> None:
        await self.stream.aclose()
