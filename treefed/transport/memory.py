"""In-process byte streams for brokers in one trio process (the memory scenario engine).

Theory of operation
-------------------
``pipe_pair()`` returns two connected ``PipeStream`` ends; each direction is one
``_Pipe``: a ``bytearray`` the writer appends to and the reader takes from, a
``ParkingLot`` the reader waits on, and an end-of-stream flag.  Same semantics as
``trio.testing.memory_stream_pair`` (unbounded, in order, ``send_eof`` / ``aclose`` give
the peer ``b""``, writing towards a closed peer raises ``BrokenResourceError``, using a
closed end ``ClosedResourceError``), without its layers: no pump callback, no
``StapledStream``, no conflict detector, one checkpoint per call instead of two.

``write_nowait(data)`` is the synchronous write ``FramedStream.send_now`` uses (issue
#14, in-process estate): the broker's site task hands a batch's bytes to the peer's
buffer itself and wakes the peer's reader, so a frame crossing an in-process link no
longer wakes the sending connection's writer task (one task switch fewer per link per
batch, as on plain TCP).  Bytes still cross as encoded frames: each broker decodes its
own copy, as it would from a socket.
"""

from __future__ import annotations

import trio

__all__ = ["PipeStream", "pipe_pair"]


class _Pipe:
    """One direction: bytes written and not yet read, and whether the writer ended."""

    __slots__ = ("buf", "eof", "reader_gone", "lot")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.eof = False            # the writing end sent EOF or closed
        self.reader_gone = False    # the reading end closed: writes are broken
        self.lot = trio.lowlevel.ParkingLot()


class PipeStream(trio.abc.HalfCloseableStream):
    """One end of an in-process stream pair (see the module docstring)."""

    __slots__ = ("_in", "_out", "_closed")

    def __init__(self, incoming: _Pipe, outgoing: _Pipe) -> None:
        self._in = incoming
        self._out = outgoing
        self._closed = False

    def write_nowait(self, data: bytes | bytearray) -> bool:
        """Append ``data`` for the peer now; False (nothing written) when this end is
        closed or shut for writing, or the peer is gone: the caller's ``send_all``
        then meets the error."""
        out = self._out
        if self._closed or out.eof or out.reader_gone:
            return False
        if data:
            out.buf += data
            out.lot.unpark_all()
        return True

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        if self._closed or self._out.eof:
            raise trio.ClosedResourceError("this end is closed for writing")
        if self._out.reader_gone:
            raise trio.BrokenResourceError("the peer closed its end")
        if data:
            self._out.buf += data
            self._out.lot.unpark_all()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise trio.ClosedResourceError("this end is closed")

    async def send_eof(self) -> None:
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise trio.ClosedResourceError("this end is closed")
        self._out.eof = True
        self._out.lot.unpark_all()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        inc = self._in
        if not inc.buf and not inc.eof and not self._closed:
            await inc.lot.park()   # the checkpoint: woken by a write, EOF or close
            while not inc.buf and not inc.eof and not self._closed:
                await inc.lot.park()
        else:
            await trio.lowlevel.checkpoint()
        if self._closed:
            raise trio.ClosedResourceError("this end is closed")
        buf = inc.buf
        if not buf:
            return b""   # the peer ended the stream
        if max_bytes is None or max_bytes >= len(buf):
            data = bytes(buf)
            buf.clear()
        else:
            data = bytes(buf[:max_bytes])
            del buf[:max_bytes]
        return data

    def close(self) -> None:
        """Close both directions: the peer reads EOF, its writes break."""
        if self._closed:
            return
        self._closed = True
        self._out.eof = True
        self._out.lot.unpark_all()
        self._in.reader_gone = True
        self._in.buf.clear()
        self._in.lot.unpark_all()   # a receive of ours in progress raises Closed

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()


def pipe_pair() -> tuple[PipeStream, PipeStream]:
    """Two connected in-process stream ends."""
    a_to_b, b_to_a = _Pipe(), _Pipe()
    return PipeStream(b_to_a, a_to_b), PipeStream(a_to_b, b_to_a)
