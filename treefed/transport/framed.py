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

Transport failures surface as trio's ``BrokenResourceError`` / ``ClosedResourceError``.
"""

from __future__ import annotations

from collections.abc import Iterable

import trio

from treefed.errors import FrameError
from treefed.wire.codec import DEFAULT_MAX_FRAME, FrameDecoder, encode, encode_many
from treefed.wire.frames import Frame

__all__ = ["FramedStream", "RECEIVE_SIZE"]

RECEIVE_SIZE = 64 * 1024


class FramedStream:
    """A trio stream that carries treefed frames."""

    __slots__ = ("stream", "receive_size", "_decoder")
    protocol = "treefed"    # what ``stat`` shows (node/stomp_conn.py: "stomp")

    def __init__(self, stream: trio.abc.Stream, max_frame: int = DEFAULT_MAX_FRAME, *,
                 receive_size: int = RECEIVE_SIZE) -> None:
        self.stream = stream
        self.receive_size = receive_size
        self._decoder = FrameDecoder(max_frame)

    async def receive_frames(self) -> list[Frame]:
        """Wait for and return every complete frame received so far (never empty).
        Raises trio.EndOfChannel on a clean EOF, FrameError on malformed input."""
        decoder = self._decoder
        while True:
            frames: list[Frame] = []
            try:
                for frame in decoder.frames():
                    frames.append(frame)
            except FrameError:
                if not frames:
                    raise
                # the decoder keeps the error; the next call raises it
            if frames:
                return frames
            data = await self.stream.receive_some(self.receive_size)
            if not data:
                if decoder.buffered:
                    raise FrameError(f"connection closed inside a frame "
                                     f"({decoder.buffered} bytes pending)", code="truncated")
                raise trio.EndOfChannel("peer closed the connection")
            decoder.receive_data(data)

    async def send_frames(self, frames: Iterable[Frame]) -> None:
        """Write a batch of frames with one send_all (nothing is sent for an empty batch)."""
        data = encode_many(frames)
        if data:
            await self.stream.send_all(data)

    async def send_frame(self, frame: Frame) -> None:
        """Write one frame (handshakes, errors; batches go through send_frames)."""
        await self.stream.send_all(encode(frame))

    async def aclose(self) -> None:
        await self.stream.aclose()
