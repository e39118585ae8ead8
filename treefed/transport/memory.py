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

Frame links (issue #14, in-process estate round 2). ``frame_link()`` returns two
``FrameEnd``s: in-process connections that carry *frames*, not bytes. A ``FrameEnd`` has
``FramedStream``'s interface (``receive_frames``, ``send_frames``, ``send_now``,
``send_frame``, ``pending``, ``protocol``, ``stream``) and is a trio stream itself (for
closing and the linger drain), so a node serves it in place of a ``FramedStream`` over a
pipe: nothing is encoded, nothing decoded, no bytes are copied. Each frame crosses as a
fresh *copy* (``copy_frame``): lists and dicts are new, a float field given an int
becomes a float, a tuple a list, a bytearray bytes — what the peer would get from the
codec — so no mutable object is shared between two brokers (free-form maps — hello
options, stat replies, admin arguments — are copied all the way down). A frame type
whose fields the copy does not know crosses through the codec itself. Sending appends to
the peer's list and wakes its receiver, in the caller's task: the append happens before
the checkpoint, so ``send_now`` and a writer's ``send_frames`` never reorder. Semantics
as the pipes': unbounded, in order, ``send_eof`` / ``aclose`` end the peer's stream
(``trio.EndOfChannel`` from ``receive_frames``), sending to a closed peer
``BrokenResourceError``, using a closed end ``ClosedResourceError``. Closing an end from
a task that is already cancelled (``aclose_forcefully``, a node's teardown) closes it
without the checkpoint, which would only raise the Cancelled the caller is about to see
anyway (the memory engine closes ~16,000 links at the end of a 4 x 1,000 run). What a
frame link does not do that a socket does: check frame sizes and validate fields (both
ends are this process's own code); the cross-engine scenario tests hold the memory
engine to the tcp engine's results.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import trio

from treefed.wire.codec import FrameDecoder, encode
from treefed.wire.frames import SPECS

__all__ = ["PipeStream", "pipe_pair", "FrameEnd", "frame_link", "copy_frame",
           "aclose_forcefully"]


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


# --------------------------------------------------------------------------- frame links


def _as_bytes(v: Any) -> bytes:
    return v if type(v) is bytes else bytes(v)


def _as_float(v: Any) -> Any:
    return float(v) if type(v) is int else v   # the codec's "int accepted" conversion


def _as_list(v: Any) -> list:
    return list(v)


def _as_dict(v: Any) -> dict:
    return dict(v)   # headers: str -> scalar values


#: value types ``_deep`` converts (anything else is a scalar, kept as it is)
_NESTED = frozenset((dict, list, tuple, bytearray, memoryview))


def _deep(v: Any) -> Any:
    """A free-form map's value as the codec returns it: new dicts and lists (tuples
    become lists, bytearrays bytes), scalars as they are.  A dict or list of scalars
    only (a hello's options: ~20 of them, 16,000 hellos in a 4 x 1,000 estate) is
    copied without a call per value (issue #14)."""
    t = type(v)
    if t is dict:
        out = dict(v)
        if not _NESTED.isdisjoint(map(type, v.values())):
            for k, x in v.items():
                if type(x) in _NESTED:
                    out[k] = _deep(x)
        return out
    if t is list or t is tuple:
        if _NESTED.isdisjoint(map(type, v)):
            return list(v)
        return [_deep(x) for x in v]
    if t is bytearray or t is memoryview:
        return bytes(v)
    return v


#: Per frame kind (SPECS' type tags): how a field's value is copied; None: as it is
#: (immutable values).
_FIELD_COPY: dict[str, Callable[[Any], Any] | None] = {
    "str": None, "int": None, "bool": None, "str?": None, "bytes": _as_bytes,
    "float": _as_float, "num?": _as_float, "strlist": _as_list, "headers": _as_dict,
    "map": _deep,
}


def _plan(cls: type) -> tuple | None:
    specs = SPECS[cls]
    if any(s.kind not in _FIELD_COPY for s in specs):
        return None
    return tuple((s.name, _FIELD_COPY[s.kind]) for s in specs)


_PLANS: dict[type, tuple | None] = {cls: _plan(cls) for cls in SPECS}


def _through_codec(frame: Any) -> Any:
    decoder = FrameDecoder()
    decoder.receive_data(encode(frame))
    (copy,) = decoder.frames()
    return copy


def _copier(cls: type, plan: tuple | None) -> Callable[[Any], Any]:
    """One function per frame kind that builds the copy from the plan's fields in one
    call -- ``cls(f.a, _conv1(f.b), ...)``, written out once at import (as dataclasses
    writes ``__init__``) -- instead of a loop over the plan per frame (issue #14: every
    frame of an in-process estate crosses here).  No plan: through the codec."""
    if plan is None:
        return _through_codec
    args = ", ".join(f"f.{name}" if conv is None else f"_c{i}(f.{name})"
                     for i, (name, conv) in enumerate(plan))
    scope: dict[str, Any] = {"_cls": cls}
    scope.update({f"_c{i}": conv for i, (_, conv) in enumerate(plan) if conv is not None})
    exec(f"def copy(f):\n    return _cls({args})\n", scope)   # names from SPECS only
    return scope["copy"]


_COPIERS: dict[type, Callable[[Any], Any]] = {cls: _copier(cls, plan)
                                              for cls, plan in _PLANS.items()}


def copy_frame(frame: Any) -> Any:
    """The frame the peer of an in-process link receives: what the codec would hand it
    (see "Frame links"), without encoding."""
    return _COPIERS[type(frame)](frame)


class _Frames:
    """One direction of a frame link: frames sent and not yet received (or, once the
    receiving end called ``deliver_to``, the function that takes them at once), and
    the one task waiting to receive them.  A direction has one receiver, so it keeps
    that task itself rather than a ``ParkingLot`` (an OrderedDict and a generator per
    wake-up; issue #14: ~60,000 wake-ups and 16,000 links in a 4 x 1,000 estate)."""

    __slots__ = ("frames", "eof", "reader_gone", "waiter", "deliver")

    def __init__(self) -> None:
        self.frames: list = []
        self.deliver: Callable[[list], Any] | None = None
        self.eof = False            # the sending end sent EOF or closed
        self.reader_gone = False    # the receiving end closed: sends are broken
        self.waiter: trio.lowlevel.Task | None = None   # the receiver, while it waits

    def wake(self) -> None:
        """Frames, EOF or close: the waiting receiver (if any) runs again."""
        task = self.waiter
        if task is not None:
            self.waiter = None
            trio.lowlevel.reschedule(task)

    def _abort(self, raise_cancel: Any) -> Any:
        self.waiter = None   # cancelled while waiting
        return trio.lowlevel.Abort.SUCCEEDED

    async def wait(self) -> None:
        """Sleep until ``wake`` (a checkpoint: cancellable)."""
        if self.waiter is not None:
            raise trio.BusyResourceError("another task is receiving on this frame link end")
        self.waiter = trio.lowlevel.current_task()
        await trio.lowlevel.wait_task_rescheduled(self._abort)


class FrameEnd(trio.abc.HalfCloseableStream):
    """One end of an in-process frame link (see "Frame links")."""

    __slots__ = ("_in", "_out", "_closed")
    protocol = "treefed"
    pending = b""    # FramedStream's: bytes send_now could not write (never here)

    def __init__(self, incoming: _Frames, outgoing: _Frames) -> None:
        self._in = incoming
        self._out = outgoing
        self._closed = False

    @property
    def stream(self) -> FrameEnd:
        """FramedStream's underlying stream: this end (for send_eof, close, drain)."""
        return self

    def _put(self, frames: Any) -> None:
        out = self._out
        if self._closed or out.eof:
            raise trio.ClosedResourceError("this end is closed for sending")
        if out.reader_gone:
            raise trio.BrokenResourceError("the peer closed its end")
        copiers = _COPIERS
        batch = [copiers[type(f)](f) for f in frames]   # copy_frame, inlined
        if batch:
            if out.deliver is not None:   # the receiver takes them now (``deliver_to``)
                out.deliver(batch)
                return
            out.frames += batch
            out.wake()

    def send_now(self, frames: list) -> bool:
        """Hand ``frames`` to the peer at once; False (nothing sent) when this end or the
        peer is closed — the caller's ``send_frames`` then meets the error."""
        out = self._out
        if self._closed or out.eof or out.reader_gone or not frames:
            return False
        self._put(frames)
        return True

    async def send_frames(self, frames: Any) -> None:
        self._put(frames)
        await trio.lowlevel.checkpoint()

    async def send_frame(self, frame: Any) -> None:
        await self.send_frames((frame,))

    async def receive_frames(self) -> list:
        """Every frame received so far (never empty); trio.EndOfChannel once the peer
        ended the stream and everything was received."""
        inc = self._in
        if not inc.frames and not inc.eof and not self._closed:
            await inc.wait()   # the checkpoint: woken by a send, EOF or close
            while not inc.frames and not inc.eof and not self._closed:
                await inc.wait()
        else:
            await trio.lowlevel.checkpoint()
        return self.take_frames()

    def take_frames(self) -> list:
        """``receive_frames`` without its checkpoint, once ``receive_ready()``: the
        frames here (never empty), or trio.EndOfChannel / ClosedResourceError."""
        inc = self._in
        if self._closed:
            raise trio.ClosedResourceError("this end is closed")
        frames = inc.frames
        if not frames:
            raise trio.EndOfChannel("the peer ended the stream")
        inc.frames = []
        return frames

    def receive_ready(self) -> bool:
        """True when ``receive_frames`` will not wait: frames are here, or the stream
        ended (a node's reader then needs no hello timeout: issue #14)."""
        inc = self._in
        return bool(inc.frames) or inc.eof or self._closed

    def deliver_to(self, deliver: Callable[[list], Any]) -> None:
        """From now on, frames sent to this end are handed to ``deliver(frames)`` in the
        sender's call instead of waiting for ``receive_frames`` (frames already waiting
        go first, now): a receiver that handles frames synchronously needs no task of
        its own (the memory engine's workload client, issue #14). ``deliver`` must not
        block or raise; the end of the stream is not reported to it."""
        inc = self._in
        inc.deliver = deliver
        waiting, inc.frames = inc.frames, []
        if waiting:
            deliver(waiting)

    # trio stream side: what a node does with ``framed.stream`` and the raw stream
    async def send_all(self, data: Any) -> None:   # pragma: no cover - not a byte stream
        raise TypeError("a frame link carries frames: use send_frames")

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """The linger drain: discard what arrives; b"" once the peer ended the stream."""
        try:
            await self.receive_frames()   # discarded
        except trio.EndOfChannel:
            return b""
        return b"\0"

    async def send_eof(self) -> None:
        await trio.lowlevel.checkpoint()
        if self._closed:
            raise trio.ClosedResourceError("this end is closed")
        self._out.eof = True
        self._out.wake()

    def close(self) -> None:
        """Close both directions: the peer's stream ends, its sends break."""
        if self._closed:
            return
        self._closed = True
        self._out.eof = True
        self._out.wake()
        self._in.reader_gone = True
        self._in.frames = []
        self._in.wake()   # a receive of ours in progress raises Closed

    async def aclose(self) -> None:
        self.close()
        if trio.current_effective_deadline() != -math.inf:
            await trio.lowlevel.checkpoint()
        # else: already cancelled (``aclose_forcefully``, a node's teardown): closed now;
        # the checkpoint would only raise the Cancelled the caller is about to see anyway


def frame_link() -> tuple[FrameEnd, FrameEnd]:
    """Two connected in-process frame-link ends."""
    a_to_b, b_to_a = _Frames(), _Frames()
    return FrameEnd(b_to_a, a_to_b), FrameEnd(a_to_b, b_to_a)


async def aclose_forcefully(stream: trio.abc.AsyncResource) -> None:
    """``trio.aclose_forcefully(stream)``; a frame link's end is closed at once, without
    the cancel scope that call builds and cancels (in a cancelled scope
    ``FrameEnd.aclose`` is ``close()`` and nothing more).  A node closes every
    connection's stream so when it ends: a 4 x 1,000 memory estate's teardown did it
    ~12,000 times (issue #14)."""
    if type(stream) is FrameEnd:
        stream.close()
    else:
        await trio.aclose_forcefully(stream)
