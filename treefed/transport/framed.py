"""Frames over a byte stream (trio): the reader and writer every connection uses.

Theory of operation
-------------------
``FramedStream`` pairs one trio stream with one ``FrameDecoder``.

* ``receive_frames()`` returns *every* complete frame of what has arrived, reading at most
  ``receive_size`` bytes per wake-up, so a busy link costs one await per buffer, not per
  frame.  It never returns an empty list: it waits until at least one frame is complete.
* A clean end of stream (the peer closed between frames) raises ``trio.EndOfChannel``;
  closing in the middle of a frame raises ``FrameError(code="truncated")``.  A malformed
  frame raises ``FrameError`` after the frames that preceded it have been returned.
* ``send_frames(frames)`` encodes the batch and writes it with ONE ``send_all``.  Like any
  trio stream it must not be called from two tasks at once: a connection has one writer
  task that drains its queue into this call.

``poller``: an ``IdlePoller`` (transport/idlepoll.py) whose ``poke()`` every read that
returned bytes calls; None (the default) for none.

Transport failures surface as trio's ``BrokenResourceError`` / ``ClosedResourceError``.

Writing without a task hop (issue #14).  ``send_now(frames)`` is the synchronous path for
whoever produced the frames (the broker's site task, a client's ``send``): on a plain
TCP ``trio.SocketStream`` with no ``send_frames`` in progress it encodes the frames and
writes them with one non-blocking ``send``, so a lone receipt leaves without waking the
connection's writer task and without the scheduler pass trio's ``send_all`` takes after
every write.  What the kernel did not take at once stays in ``pending`` and goes first
in the next ``send_frames`` (the caller wakes its writer then), so bytes never
interleave or reorder.  It returns False, having consumed nothing, when that path is
not open (TLS and other streams, a send in progress, a full socket buffer, an
error): the frames then go the usual way, through the writer, which meets the error.
An in-process pipe (transport/memory.py) takes the whole batch at once, or nothing
when it is closed.

Reading after a drained read (issue #14).  trio's ``receive_some`` first tries a read
and only then waits for the socket; for a connection whose last read took less than
``receive_size`` (the kernel had no more) that first read is a syscall that fails with
EAGAIN on every wake-up — a lone message's hop paid it at every broker.  On plain TCP
``receive_frames`` then waits for readability first and reads after it (the wait is
the checkpoint); after a full read it uses ``receive_some`` as before, whose checkpoint
after a successful read keeps a flooding peer from starving the other tasks.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable

import trio

from treefed.errors import FrameError
from treefed.transport.memory import PipeStream
from treefed.wire.codec import DEFAULT_MAX_FRAME, FrameDecoder, encode, encode_many
from treefed.wire.frames import Frame

__all__ = ["FramedStream", "RECEIVE_SIZE"]

RECEIVE_SIZE = 64 * 1024


class FramedStream:
    """A trio stream that carries treefed frames."""

    __slots__ = ("stream", "receive_size", "_decoder", "pending", "_sending", "_sock",
                 "_pipe", "_drained", "poller")
    protocol = "treefed"    # what ``stat`` shows (node/stomp_conn.py: "stomp")

    def __init__(self, stream: trio.abc.Stream, max_frame: int = DEFAULT_MAX_FRAME, *,
                 receive_size: int = RECEIVE_SIZE) -> None:
        self.stream = stream
        self.receive_size = receive_size
        self._decoder = FrameDecoder(max_frame)
        self.pending = b""      # bytes ``send_now`` could not write: sent first by send_frames
        self._sending = False   # a send_frames is in progress (send_now must not write)
        # the socket ``send_now`` may write to: plain TCP only (TLS encrypts in send_all)
        self._sock = stream.socket if type(stream) is trio.SocketStream else None
        # or the in-process pipe it may append to (transport/memory.py)
        self._pipe = stream if type(stream) is PipeStream else None
        self._drained = False   # the last read took less than receive_size: wait first
        self.poller = None      # an IdlePoller told of every read (transport/idlepoll.py)

    async def receive_frames(self) -> list[Frame]:
        """Wait for and return every complete frame received so far (never empty).
        Raises trio.EndOfChannel on a clean EOF, FrameError on malformed input."""
        decoder = self._decoder
        while True:
            # every frame before a malformed one comes first; the decoder keeps the
            # error and the next call raises it
            frames = decoder.take()
            if frames:
                return frames
            if self._drained and self._sock is not None:
                data = await self._wait_and_read()
            else:
                data = await self.stream.receive_some(self.receive_size)
            self._drained = len(data) < self.receive_size
            if self.poller is not None and data:
                self.poller.poke()
            if not data:
                if decoder.buffered:
                    raise FrameError(f"connection closed inside a frame "
                                     f"({decoder.buffered} bytes pending)", code="truncated")
                raise trio.EndOfChannel("peer closed the connection")
            decoder.receive_data(data)

    async def _wait_and_read(self) -> bytes:
        """Read from the plain TCP socket the last read drained (see "Reading after a
        drained read"): wait until it is readable, then read — trio's ``receive_some``
        would first try a read that fails with EAGAIN."""
        sock = self._sock
        while True:
            if sock.fileno() < 0:   # closed before the wait (as receive_some says it)
                raise trio.ClosedResourceError("this socket was already closed")
            await trio.lowlevel.wait_readable(sock)   # ClosedResourceError if closed
            try:
                return os.read(sock.fileno(), self.receive_size)
            except BlockingIOError:
                continue   # a spurious wake-up
            except OSError as exc:   # as trio's SocketStream translates them
                if exc.errno in (errno.EBADF, errno.ENOTSOCK):
                    raise trio.ClosedResourceError("this socket was already closed") from None
                raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc

    async def send_frames(self, frames: Iterable[Frame]) -> None:
        """Write a batch of frames with one send_all (nothing is sent for an empty batch),
        after what ``send_now`` left ``pending``."""
        data = encode_many(frames)
        if self.pending:
            data, self.pending = self.pending + data, b""
        if data:
            self._sending = True
            try:
                await self.stream.send_all(data)
            finally:
                self._sending = False

    def send_now(self, frames: list[Frame]) -> bool:
        """Try to write ``frames`` at once, without waiting (see "Writing without a task
        hop").  True: consumed — written, or partly written with the rest in ``pending``
        for the next ``send_frames``.  False: nothing consumed; send them the usual way."""
        sock = self._sock
        if sock is None:
            pipe = self._pipe
            if pipe is None or self._sending or not frames:
                return False
            try:
                data = encode_many(frames)
            except Exception:   # an unencodable frame: the writer meets (and reports) it
                return False
            return pipe.write_nowait(data)   # all or nothing: no pending bytes
        if self._sending or self.pending or not frames:
            return False
        fd = sock.fileno()
        if fd < 0 or sock.did_shutdown_SHUT_WR:
            return False
        try:
            data = encode_many(frames)
        except Exception:   # an unencodable frame: the writer meets (and reports) it
            return False
        try:
            sent = os.write(fd, data)
        except OSError:   # EAGAIN (buffer full), or a broken socket the writer will meet
            return False
        if sent < len(data):
            self.pending = data[sent:]
        return True

    async def send_frame(self, frame: Frame) -> None:
        """Write one frame (handshakes, errors; batches go through send_frames)."""
        await self.stream.send_all(encode(frame))

    async def aclose(self) -> None:
        await self.stream.aclose()
