"""The trio client library: one application connection to a broker, with failover.

Theory of operation
-------------------
``connect(uri)`` opens a nursery holding one *supervisor* task.  The supervisor dials
(every endpoint of a ``failover:`` URI in turn, sleeping the URI's back-off between
sweeps), exchanges hellos, then runs a reader and a writer until the socket dies.
Application calls never touch the socket:

* sends, acks and subscribes append frames to one outgoing list and wake the writer,
  which encodes everything queued (``encode_many``) and makes ONE ``send_all`` — a
  producer loop costs one syscall per batch, not per message; a synchronous persistent
  send (it waits for its receipt anyway) writes its frame itself when the writer is idle
  (``FramedStream.send_now``), a task hop less per round trip (issue #14); so does a
  *lone* send — nothing queued, the previous send ``_LONE_GAP_S`` ago or more (a paced
  producer, a till sending one price change): it leaves now, not at the task's next
  yield through the writer (issue #14, session 8: a hop less of a message's latency),
  while a producer loop's sends, microseconds apart, still go in one ``send_all``;
* the reader decodes every frame of each received chunk and routes it: ``Deliver`` to
  its Subscription's queue, ``Receipt`` / ``Error(ref)`` to the request waiting for it,
  ``StatReply`` to the FIFO of stat waiters, replies to ``request()`` by correlation id.

Invariants:

* Message ids are ``<producer>:<seq>``; the producer id is unique to this Connection
  object (a uuid), so ids stay unique across reconnects and a re-sent persistent message
  keeps its id — the broker can recognise it.
* A persistent send stays in ``_unconfirmed`` until its Receipt.  After a failover
  reconnect, live subscriptions are re-opened under the same ids and unconfirmed sends are
  re-sent in order, before anything the application queues afterwards.
* Frames queued for a socket that died are dropped: acks of deliveries the broker has
  already requeued, and non-persistent sends (at most once, as in JMS).
* Memory is bounded: the outgoing list by ``high_water`` frames and the unconfirmed
  sends by ``max_unconfirmed``; ``send`` waits for room, ``send_nowait`` raises
  ``trio.WouldBlock``.
* Nothing raises into the application's nursery.  A connection that is lost and cannot
  be re-established makes every pending and later call raise ``ConnectionClosed``.
* Liveness: when the broker's hello announces a ``heartbeat_interval``, a watchdog pings
  a broker silent for an interval and treats one that leaves the ping unanswered for
  another interval as lost (a half-open socket), which starts the failover.
* Duplicates after a failover: each subscription remembers the ids it handed out (a
  bounded window).  A message that comes again after the application acked it (the
  ack died with the old socket, or a slave restored it) is acked again and not handed
  out; one handed out but not acked comes with ``redelivered`` at least 1, as JMS asks;
  one still waiting in the subscription's queue from the old socket is replaced there
  by the new copy (the application gets it once, and its ack reaches the broker).
"""

from __future__ import annotations

import math
import random
import re
import secrets
import ssl
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from itertools import islice
from typing import Any

import trio

from treefed.errors import (DestinationError, FrameError, LimitError, LocalError,
                            RemoteError, SelectorError, TreefedError)
from treefed.transport.backoff import backoff_for
from treefed.transport.uri import Endpoint, Failover, parse_uri
from treefed.transport.framed import FramedStream
from treefed.transport.idlepoll import IdlePoller
from treefed.transport.streams import open_tcp
from treefed.wire.codec import DEFAULT_MAX_FRAME, check_hello
from treefed.wire.ids import SCOPE_SEP, original
from treefed.wire.frames import (PROTOCOL_VERSION, Ack, Admin, Bye, Deliver, Error, Hello, Nack,
                                 Ping, Pong, Receipt, Send, StatReply, StatRequest,
                                 Subscribe, Unsubscribe)

__all__ = ["connect", "Connection", "Subscription", "ReceivedMessage", "ConnectionClosed",
           "remote_error"]

_RECEIVE_SIZE = 256 * 1024
#: Entries per page ``stat_all`` asks for (the broker may answer fewer: a page must fit
#: one frame).
_STAT_PAGE = 10_000
#: Seconds a peer has to answer our hello before we call it no treefed broker.
HELLO_TIMEOUT = 10.0
#: Error codes of a peer that is not a treefed broker (said as they are, not "refused").
_NOT_A_BROKER = ("not_a_broker", "hello_timeout")
#: ``ref`` of the Error refusing a StatRequest (security.guard.STAT_REF)
_STAT_REF = "stat"
#: A producer that does not wait yields to the writer once this many frames are queued:
#: big enough to amortise a send_all, small enough to keep the pipeline moving.
_WRITE_BATCH = 256
#: A send that does not wait, finds nothing queued and comes at least this long after the
#: previous such send (or the last full batch handed to the writer) is written at once by
#: the sending task (a lone message waits for no batch and no writer wake-up); sends
#: closer together are queued for one ``send_all``.
_LONE_GAP_S = 0.0001
#: A cumulative ack is sent (the consumer yields to the writer) once it covers
#: 1/_ACK_DIVISOR of the prefetch: credit flows back while the rest is worked through.
_ACK_DIVISOR = 2
#: The failover audit is trimmed back to its size this many ids at a time.
_AUDIT_SLACK = 256
#: codes a FrameDecoder / hello check may put in an error frame
_FRAME_CODES = frozenset(("bad_frame", "bad_cbor", "oversized", "not_array", "unknown_type",
                          "missing_field", "bad_field", "too_many_fields", "not_hello",
                          "bad_version", "bad_role"))
_POSITION = re.compile(r"at position (\d+)")


class ConnectionClosed(TreefedError):
    """The connection is gone (closed by us, or lost and not re-established)."""

    code = "closed"


def remote_error(frame: Error) -> RemoteError:
    """The ``RemoteError`` subclass for a broker's error frame, carrying its code."""
    code, text = frame.code, frame.message
    if code == "bad_selector":
        # SelectorError's constructor formats its own prefix; keep the broker's text.
        exc: RemoteError = SelectorError.__new__(SelectorError)
        RemoteError.__init__(exc, text, code=code)
        found = _POSITION.search(text)
        exc.position = int(found.group(1)) if found else None
        exc.reason = text
        return exc
    if code == "bad_destination":
        return DestinationError(text, code=code)
    if code == "limit" or code.startswith("limit"):
        return LimitError(text, code=code)
    if code in _FRAME_CODES:
        return FrameError(text, code=code)
    return RemoteError(text, code=code)


class _Lost(Exception):
    """Internal: the current socket is finished (EOF, broker error, broker bye)."""


#: what ends one socket (and, under failover, starts a reconnect)
_SOCKET_ERRORS = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, _Lost,
                  trio.TooSlowError)


class _Waiter:
    """One pending request (receipt, stat, reply): an event and its outcome."""

    __slots__ = ("event", "value", "error")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def set(self, value: Any = None, error: BaseException | None = None) -> None:
        if not self.event.is_set():
            self.value, self.error = value, error
            self.event.set()

    async def wait(self) -> Any:
        await self.event.wait()
        if self.error is not None:
            raise self.error
        return self.value


class ReceivedMessage:
    """A delivered message.  Wraps the Deliver frame (no copy); ``ack``/``nack`` answer it
    on the connection generation it arrived on (after a reconnect the broker has
    requeued it already, so a stale ack is dropped)."""

    __slots__ = ("frame", "_conn", "_gen")

    def __init__(self, frame: Deliver, conn: Connection, gen: int) -> None:
        self.frame = frame
        self._conn = conn
        self._gen = gen

    id = property(lambda self: original(self.frame.msg),
                  doc="message id as its producer chose it (producer:sequence)")
    dst = property(lambda self: self.frame.dst, doc="destination it was sent to")
    body = property(lambda self: self.frame.body)
    headers = property(lambda self: self.frame.headers)
    persistent = property(lambda self: self.frame.persistent)
    priority = property(lambda self: self.frame.priority)
    redelivered = property(lambda self: self.frame.redelivered)
    reply_to = property(lambda self: self.frame.reply_to)
    timestamp = property(lambda self: self.frame.timestamp)
    expires = property(lambda self: self.frame.expires)
    subscription = property(lambda self: self.frame.sub)

    def ack_nowait(self) -> None:
        """Acknowledge: the broker deletes the message and returns prefetch credit."""
        frame, conn = self.frame, self._conn
        msg_id = frame.msg
        sub = conn._subs.get(frame.sub)
        if sub is not None:
            audit = sub._audit
            if msg_id in audit:
                audit[msg_id] = True   # a copy after a failover is a duplicate
            if self._gen == conn._gen:
                sub._settled(msg_id, None)
        elif self._gen == conn._gen:
            conn._queue(Ack(frame.sub, msg_id))

    async def ack(self) -> None:
        self.ack_nowait()
        await trio.lowlevel.checkpoint_if_cancelled()

    async def nack(self) -> None:
        """Give the message back for redelivery (the DLQ after max redeliveries)."""
        if self._gen == self._conn._gen:
            sub = self._conn._subs.get(self.frame.sub)
            nack = Nack(self.frame.sub, self.frame.msg)
            if sub is not None:
                sub._settled(self.frame.msg, nack)
            else:
                self._conn._queue(nack)
        await trio.lowlevel.checkpoint_if_cancelled()

    async def reply(self, body: bytes, *, headers: dict | None = None) -> str:
        """Send ``body`` to this message's ``reply_to``, correlated to its id."""
        if not self.frame.reply_to:
            raise LocalError(f"message {self.frame.msg} has no reply_to", code="no_reply_to")
        h = dict(headers) if headers else {}
        h["correlation_id"] = original(self.frame.msg)
        return await self._conn.send(self.frame.reply_to, body, headers=h)

    def as_dict(self) -> dict:
        """JSON-able view (the body decoded as UTF-8 where possible)."""
        f = self.frame
        try:
            body: Any = f.body.decode("utf-8")
        except UnicodeDecodeError:
            body = f.body.hex()
        return {"id": original(f.msg), "dst": f.dst, "headers": f.headers, "body": body,
                "persistent": f.persistent, "priority": f.priority,
                "redelivered": f.redelivered, "reply_to": f.reply_to,
                "timestamp": f.timestamp, "expires": f.expires}

    def __repr__(self) -> str:
        return f"<ReceivedMessage {self.frame.msg} {self.frame.dst} {len(self.frame.body)}B>"


class Subscription:
    """A consumer: ``async for msg in sub`` or ``await sub.receive()``.

    Delivered messages wait in a deque.  ``receive`` returns at once (a cancel point, not
    a schedule point) while messages are queued, so a consumer draining a burst acks all
    of it before the writer runs.

    Acks are cumulative where they can be (``Ack(upto=True)``, as JMS client-ack and
    ActiveMQ's optimizeAcknowledge).  The ids delivered on the current socket are kept
    in delivery order; an ack of the oldest one becomes, or extends, one cumulative Ack
    frame that is still the last frame queued, so a burst acked in order leaves as ONE
    frame.  Nothing waits for a timer: the frame goes out whenever the writer next runs,
    exactly when a per-message ack would have -- or at once when it is lone (nothing else
    delivered and waiting, nothing queued).  An ack out of order, and every nack,
    is sent on its own (and the id skipped when the acks in order reach it), so acking
    messages singly and in any order keeps its meaning.  Once half the prefetch is
    covered by the frame in hand, the next ``receive`` yields so it leaves and the
    broker refills while the burst is still being worked through."""

    def __init__(self, conn: Connection, sub_id: str, frame: Subscribe) -> None:
        self.id = sub_id
        self.frame = frame              # re-sent as is on reconnect
        self._conn = conn
        self._queue: deque[ReceivedMessage] = deque()
        self._arrived = trio.Event()    # set when _queue gained messages or it ended
        self._ended = False
        self._error: BaseException | None = None   # why it ended, None = closed by us
        # id -> acked, for the ids handed out lately (oldest first): the failover audit
        self._audit: dict[str, bool] = {}
        self._audit_size = max(1024, 4 * frame.prefetch)
        # -- cumulative acks (see the class docstring); reset for every socket
        self._unsettled: deque[str] = deque()   # delivered ids, oldest first, whose ack
        #                                         or nack has not reached the head yet
        self._skipped: set[str] = set()         # of those, the ones settled out of order
        self._ack: Ack | None = None            # the cumulative Ack last queued
        self._ack_count = 0                     # messages it covers
        self._ack_every = max(1, frame.prefetch // _ACK_DIVISOR)
        self._ack_yield = False                 # the next receive lets the writer run

    @property
    def destination(self) -> str:
        return self.frame.dst

    @property
    def queued(self) -> int:
        """Messages delivered to this client and not yet taken by the application."""
        return len(self._queue)

    def _push(self, msg: ReceivedMessage) -> None:
        self._queue.append(msg)
        self._arrived.set()

    def _again(self, msg: ReceivedMessage) -> None:
        """``msg`` was delivered to this client before and never acked.  A copy from an
        older socket still waiting in the queue (the application never took it) gives
        way to it where it stands -- handed out once, and acked on the socket that can
        settle it; one the application took comes again flagged redelivered."""
        queue = self._queue
        msg_id = msg.frame.msg
        for i, old in enumerate(queue):
            if old.frame.msg == msg_id and old._gen != msg._gen:
                queue[i] = msg
                return
        if not msg.frame.redelivered:
            msg.frame.redelivered = 1
        self._push(msg)

    def _reset_acks(self) -> None:
        """A new socket: the broker requeued whatever the old one had in flight."""
        self._unsettled.clear()
        self._skipped.clear()
        self._ack = None
        self._ack_yield = False

    def _settled(self, msg_id: str, nack: Nack | None) -> None:
        """The application acked (``nack`` None) or nacked ``msg_id``: queue the frame."""
        conn = self._conn
        unsettled = self._unsettled
        if unsettled and unsettled[0] == msg_id:
            unsettled.popleft()
            skipped = self._skipped
            while skipped and unsettled and unsettled[0] in skipped:
                skipped.remove(unsettled.popleft())   # already settled on its own
            if nack is None:
                out = conn._out
                ack = self._ack
                if ack is not None and out and out[-1] is ack:
                    ack.msg = msg_id   # not taken by the writer yet: it covers one more
                    self._ack_count += 1
                    if self._ack_count >= self._ack_every:
                        self._ack = None
                        self._ack_yield = True
                    return
                ack = self._ack = Ack(self.id, msg_id, True)
                self._ack_count = 1
                if self._queue or out:   # more to ack soon, or frames queued: the writer
                    conn._queue(ack)
                else:
                    # a lone ack (nothing else delivered or queued): written now, from
                    # this task, when the writer is idle -- a broker holding a commit for
                    # it (concurrent store and dispatch) waits no writer wake-up (#14)
                    out.append(ack)
                    if not conn._write_now():
                        conn._wake.set()
                return
        elif unsettled:
            self._skipped.add(msg_id)
        else:
            self._skipped.clear()   # nothing outstanding: only double acks were left
        conn._queue(nack if nack is not None else Ack(self.id, msg_id))

    async def _next(self) -> ReceivedMessage | None:
        queue = self._queue
        while not queue:
            if self._ended:
                return None
            self._arrived = trio.Event()
            await self._arrived.wait()
        if self._ack_yield:
            self._ack_yield = False
            await trio.lowlevel.checkpoint()   # the writer sends the acks in hand
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
        return queue.popleft()

    async def receive(self) -> ReceivedMessage:
        """The next message; raises ConnectionClosed (or the broker's error) once the
        subscription is over and its queue drained."""
        queue = self._queue
        if queue and not self._ack_yield:   # the per-message path: one coroutine, not two
            await trio.lowlevel.checkpoint_if_cancelled()
            return queue.popleft()
        msg = await self._next()
        if msg is None:
            raise self._error or ConnectionClosed(f"subscription {self.id} is closed")
        return msg

    def receive_nowait(self) -> ReceivedMessage:
        """The next queued message or ``trio.WouldBlock``."""
        if self._queue:
            return self._queue.popleft()
        if self._ended:
            raise self._error or ConnectionClosed(f"subscription {self.id} is closed")
        raise trio.WouldBlock

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> ReceivedMessage:
        msg = await self._next()
        if msg is None:
            if self._error is not None:
                raise self._error
            raise StopAsyncIteration
        return msg

    async def close(self) -> None:
        """Unsubscribe; undelivered prefetched messages go back to the broker."""
        if self._conn._subs.pop(self.id, None) is not None:
            self._conn._queue(Unsubscribe(self.id))
            self._end(None)
        await trio.lowlevel.checkpoint()

    def _end(self, error: BaseException | None) -> None:
        if not self._ended:
            self._ended = True
            self._error = error
        self._arrived.set()


class Connection:
    """One application connection (see the module docstring).  Create with ``connect``."""

    def __init__(self, uri: str, *, client_id: str | None = None,
                 max_frame: int = DEFAULT_MAX_FRAME, high_water: int = 8192,
                 max_unconfirmed: int = 8192, username: str | None = None,
                 password: str | None = None, ssl_context: ssl.SSLContext | None = None,
                 hello_timeout: float = HELLO_TIMEOUT, idle_poll_us: int = 0) -> None:
        target = parse_uri(uri)
        if not isinstance(target, (Endpoint, Failover)):
            raise LocalError(f"{uri!r}: a client connects to tcp://, ssl:// or failover:",
                             code="bad_uri")
        self.uri = uri
        self.client_id = client_id
        self._username = username                 # sent in every hello (reconnects too)
        self._password = password
        self._ssl_context = ssl_context           # ssl:// endpoints; None = system CAs
        self._target = target
        self._hello_timeout = hello_timeout       # a peer that never says hello is not
        #                                           a treefed broker (an HTTP server, a
        #                                           silent port): a clear error, in time
        self.last_error: BaseException | None = None   # why the last attempt failed
        # poll up to idle_poll_us after a read instead of sleeping (transport/idlepoll.py;
        # CPU for latency, e.g. a one-at-a-time sender waiting for its receipts); 0 = off
        self.poller = IdlePoller(idle_poll_us) if idle_poll_us else None
        self._producer = f"{client_id or 'p'}-{uuid.uuid4().hex[:12]}"
        # secret sent in every hello: the broker scopes our message ids by its hash, so
        # nobody else can squat them and our resends after a failover stay duplicates
        self._producer_key = secrets.token_urlsafe(24)
        self._seq = 0
        self._sub_seq = 0
        self._max_frame = max_frame
        self._high_water = high_water
        self._max_unconfirmed = max_unconfirmed
        self._rng = random.Random()
        # -- outgoing
        self._out: list = []                      # frames queued for the writer
        self._wake = trio.Event()                 # set when _out gained frames
        self._room = trio.Event()                 # set when the writer took a full batch
        self._flushed = trio.Event()              # set when _out is empty and written
        self._writing = False                     # a send_all is in progress
        self._sent_at = 0.0                       # perf_counter() of the last send that
        #                                           found nothing queued, or of the last
        #                                           hand-off of a full batch to the writer
        # -- connection state
        self._gen = 0                             # socket generation, bumped per connect
        self._ready = trio.Event()                # set while a handshaken socket is live
        self._stream: FramedStream | None = None
        self._closed: ConnectionClosed | None = None   # set once: the connection is over
        self._closing = False                     # aclose() was called
        self.broker_hello: Hello | None = None    # the broker's hello on the current socket
        self.endpoint: Endpoint | None = None     # where the current socket goes
        self.reconnects = 0                       # successful reconnects after the first
        self._lost: BaseException | None = None   # why the current socket ended
        # -- requests in flight
        self._unconfirmed: dict[str, Send] = {}   # persistent sends without a receipt
        self._receipt_waiters: dict[str, _Waiter] = {}
        self._confirm_room = trio.Event()
        self._refused: deque[RemoteError] = deque(maxlen=1000)  # pipelined sends refused
        self._stat_waiters: deque[_Waiter] = deque()
        self._subs: dict[str, Subscription] = {}
        self._reply_sub: Subscription | None = None
        self._reply_waiters: dict[str, _Waiter] = {}
        self.confirmed_total = 0                  # receipts received for persistent sends
        self._last_rx = 0.0                       # trio time the broker was last heard

    # ------------------------------------------------------------------ public API
    @property
    def producer_id(self) -> str:
        return self._producer

    @property
    def connected(self) -> bool:
        """A handshaken socket is live (False while failing over and once closed)."""
        return self._ready.is_set() and self._closed is None

    def unconfirmed(self) -> list[str]:
        """Ids of persistent sends not confirmed yet, in send order."""
        return list(self._unconfirmed)

    def next_id(self) -> str:
        self._seq += 1
        return f"{self._producer}:{self._seq}"

    def send_nowait(self, dst: str, body: bytes | str = b"", *, headers: dict | None = None,
                    persistent: bool = False, priority: int = 4, ttl: int = 0,
                    reply_to: str | None = None, msg_id: str | None = None) -> str:
        """Queue a send without waiting; returns the message id.  A persistent send is
        tracked until its receipt (see ``wait_confirmed``).  Raises ``trio.WouldBlock``
        when disconnected or over a high-water mark, ConnectionClosed when closed."""
        self._check_open()
        if (not self._ready.is_set() or len(self._out) >= self._high_water
                or (persistent and len(self._unconfirmed) >= self._max_unconfirmed)):
            raise trio.WouldBlock
        return self._send_frame(dst, body, headers, persistent, priority, ttl, reply_to,
                                msg_id)

    async def send(self, dst: str, body: bytes | str = b"", *, headers: dict | None = None,
                   persistent: bool = False, priority: int = 4, ttl: int = 0,
                   reply_to: str | None = None, confirm: bool | None = None,
                   msg_id: str | None = None) -> str:
        """Send a message; returns its id.  ``ttl`` in milliseconds.  A persistent send
        waits for the broker's receipt (the message is committed) unless
        ``confirm=False``, which only waits for room and leaves the receipt to
        ``wait_confirmed``.  Raises the broker's RemoteError if it refuses the send.

        A send that does not wait for a receipt returns once queued: the frame leaves
        when this task next yields (it yields by itself every 256 queued frames, so the
        writer sends big batches) or at ``flush()`` — or at once when it is lone
        (nothing queued, no send in the last ``_LONE_GAP_S``)."""
        out = self._out
        if (self._closed is not None or not self._ready.is_set() or len(out) >= self._high_water
                or (persistent and len(self._unconfirmed) >= self._max_unconfirmed)):
            while True:   # not the per-message path: closed, reconnecting or full
                self._check_open()
                if not self._ready.is_set():
                    await self._wait_ready()
                elif len(self._out) >= self._high_water:
                    await self._room.wait()
                elif persistent and len(self._unconfirmed) >= self._max_unconfirmed:
                    await self._confirm_room.wait()
                else:
                    break
            out = self._out
        wait = persistent and confirm is not False
        lone = False
        if not wait and not out:   # (a producer loop's other sends read no clock)
            now = time.perf_counter()
            lone = now - self._sent_at >= _LONE_GAP_S
            self._sent_at = now
        msg_id = self._send_frame(dst, body, headers, persistent, priority, ttl, reply_to,
                                  msg_id, wake=not (wait or lone))
        if lone:
            # nothing queued and nothing sent just before: written now, from this task,
            # when the writer is idle (else the writer sends it, as any other)
            if not self._write_now():
                self._wake.set()
            await trio.lowlevel.checkpoint_if_cancelled()
        elif wait:
            waiter = self._receipt_waiters[msg_id] = _Waiter()
            # we wait for the receipt anyway: write the frame now, from this task, when
            # the writer is idle -- no writer wake-up per synchronous send (issue #14)
            if not self._write_now():
                self._wake.set()
            await waiter.wait()
        elif not len(out) % _WRITE_BATCH:
            # Every 256 frames queued, let the writer take them.  Only then: while the
            # writer is busy in send_all, a yield per send would buy nothing but a pass
            # of the scheduler (several microseconds) per message.  The writer takes
            # them now: the loop's next send, finding nothing queued, is not lone.
            self._sent_at = time.perf_counter()
            await trio.lowlevel.checkpoint()
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
        return msg_id

    async def wait_confirmed(self) -> None:
        """Wait until every persistent send so far is confirmed.  Raises the first
        refusal of a pipelined send since the last call, or ConnectionClosed."""
        while self._unconfirmed:
            self._check_open()
            last = next(reversed(self._unconfirmed))
            waiter = self._receipt_waiters.get(last)
            if waiter is None:
                waiter = self._receipt_waiters[last] = _Waiter()
            try:
                await waiter.wait()
            except RemoteError as exc:
                # our waiter took this refusal (so _on_error did not queue it): report
                # it below with the others -- never swallow it (issue #12, defect 6)
                self._refused.append(exc)
        if self._refused:
            first = self._refused.popleft()
            self._refused.clear()
            raise first
        await trio.lowlevel.checkpoint()

    async def subscribe(self, dst: str, *, selector: str | None = None,
                        prefetch: int = 100, priority: int = 0) -> Subscription:
        """Open a consumer; returns once the broker confirmed it.  Raises the broker's
        error, e.g. SelectorError (with ``position``) for a bad selector."""
        self._check_open()
        if not self._ready.is_set():
            await self._wait_ready()
        self._sub_seq += 1
        sub_id = f"s{self._sub_seq}"
        frame = Subscribe(sub_id, dst, selector, prefetch, priority)
        sub = self._subs[sub_id] = Subscription(self, sub_id, frame)
        waiter = self._receipt_waiters[sub_id] = _Waiter()
        self._queue(frame)
        try:
            await waiter.wait()
        except BaseException as exc:
            if self._subs.pop(sub_id, None) is not None:
                sub._end(None)
                if not isinstance(exc, RemoteError) and self.connected:
                    # cancelled while the broker may already hold the consumer
                    self._queue(Unsubscribe(sub_id))
            raise
        return sub

    async def request(self, dst: str, body: bytes | str = b"", *, timeout: float = 10.0,
                      headers: dict | None = None, persistent: bool = False,
                      ) -> ReceivedMessage:
        """Send to ``dst`` with a reply_to of this connection's temporary queue and wait
        for the reply carrying ``correlation_id`` = the request's id (``msg.reply``
        does that).  Raises trio.TooSlowError after ``timeout`` seconds."""
        if self._reply_sub is None:
            # named by a uuid: the client id may hold characters a name cannot
            sub = await self.subscribe(f"temp-queue://replies.{uuid.uuid4().hex}",
                                       prefetch=1000)
            if self._reply_sub is None:
                self._reply_sub = sub
            else:
                await sub.close()
        msg_id = self.next_id()
        waiter = self._reply_waiters[msg_id] = _Waiter()
        try:
            with trio.fail_after(timeout):
                await self.send(dst, body, headers=headers, persistent=persistent,
                                reply_to=self._reply_sub.frame.dst, msg_id=msg_id)
                return await waiter.wait()
        finally:
            self._reply_waiters.pop(msg_id, None)

    async def stat(self, what: str = "all", *, match: str | None = None, offset: int = 0,
                   limit: int = 0) -> dict:
        """The broker's statistics (connections, destinations, consumers, links): one
        page of them.  ``what``: all | summary | destinations | consumers | conns | links
        | connectors; ``match`` keeps destinations (and their consumers) matching a
        pattern; ``offset`` / ``limit`` page the lists.  ``reply["pages"]`` says per list
        its total and the ``next`` offset (None: complete).  See ``stat_all``."""
        self._check_open()
        if not self._ready.is_set():
            await self._wait_ready()
        waiter = _Waiter()
        self._stat_waiters.append(waiter)
        self._queue(StatRequest(what, match, offset, limit))
        return await waiter.wait()

    async def admin(self, command: str, **args: Any) -> dict:
        """Run an admin command (``link.add``, ``link.del``, ``link.list``, ``reload``)
        on the broker; its result, or the broker's RemoteError when it refused."""
        self._check_open()
        if not self._ready.is_set():
            await self._wait_ready()
        waiter = _Waiter()
        self._stat_waiters.append(waiter)   # answered in order, like stat
        self._queue(Admin(command, args))
        return await waiter.wait()

    async def stat_all(self, what: str = "all", *, match: str | None = None) -> dict:
        """Every page of ``stat(what, match=...)`` merged into one dict: a broker with
        40,000 destinations answers in pages that each fit a frame."""
        stats = await self.stat(what, match=match, limit=_STAT_PAGE)
        for section, info in list(stats.get("pages", {}).items()):
            if what not in ("all", section):
                continue
            while info.get("next") is not None:
                page = await self.stat(section, match=match, offset=info["next"],
                                       limit=_STAT_PAGE)
                items = page.get(section)
                if isinstance(items, dict):
                    stats.setdefault(section, {}).update(items)
                elif isinstance(items, list):
                    stats.setdefault(section, []).extend(items)
                info = page["pages"][section]
                if not info.get("returned"):
                    break   # the list shrank under us: what we have is all there is
            stats["pages"][section] = {"total": len(stats.get(section) or ()), "offset": 0,
                                       "returned": len(stats.get(section) or ()),
                                       "next": None}
        return stats

    async def flush(self) -> None:
        """Wait until every queued frame has been written to the socket."""
        while self._out or self._writing or (self._stream is not None
                                              and self._stream.pending):
            self._check_open()
            await self._flushed.wait()
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        """Flush (bounded), say bye, close the socket.  Idempotent."""
        if self._closing:
            return
        self._closing = True
        if self._closed is None and self._ready.is_set():
            self._queue(Bye("client closing"))
            with trio.move_on_after(2):
                try:
                    await self.flush()
                except ConnectionClosed:
                    pass
        self._fail(ConnectionClosed("connection closed by the application"))

    # ------------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self._closed is not None:
            raise self._closed

    async def _wait_ready(self) -> None:
        # _ready is replaced on disconnect; the failure path sets it to wake waiters
        await self._ready.wait()
        self._check_open()

    def _queue(self, frame: Any) -> None:
        self._out.append(frame)
        self._wake.set()

    def _send_frame(self, dst: str, body: bytes | str, headers: dict | None,
                    persistent: bool, priority: int, ttl: int, reply_to: str | None,
                    msg_id: str | None, wake: bool = True) -> str:
        if msg_id is None:
            self._seq += 1
            msg_id = f"{self._producer}:{self._seq}"
        if type(body) is str:
            body = body.encode("utf-8")
        frame = Send(dst, msg_id, headers if headers is not None else {}, body, persistent,
                     priority, ttl, reply_to, persistent)
        if persistent:
            self._unconfirmed[msg_id] = frame
        self._out.append(frame)
        if wake:
            self._wake.set()
        return msg_id

    def _write_now(self) -> bool:
        """Write everything queued at once when the socket takes it without waiting
        (``FramedStream.send_now``); False: the writer must be woken."""
        stream = self._stream
        if stream is None or self._writing or not self._ready.is_set() \
                or not stream.send_now(self._out):
            return False
        self._out = []
        return not stream.pending   # what the kernel did not take: the writer sends it

    def _fail(self, error: ConnectionClosed) -> None:
        """The connection is over for good: wake every waiter with ``error``."""
        if self._closed is None:
            self._closed = error
        error = self._closed
        for waiter in self._receipt_waiters.values():
            waiter.set(error=error)
        self._receipt_waiters.clear()
        for waiter in self._reply_waiters.values():
            waiter.set(error=error)
        while self._stat_waiters:
            self._stat_waiters.popleft().set(error=error)
        for sub in self._subs.values():
            sub._end(None if self._closing else error)
        self._ready.set()          # waiters wake and see _closed
        self._room.set()
        self._confirm_room.set()
        self._flushed.set()
        self._wake.set()

    async def _supervise(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Dial, handshake, run reader+writer; on loss reconnect per the URI's back-off."""
        target = self._target
        backoff = backoff_for(target)
        endpoints = list(target.endpoints)
        randomize = isinstance(target, Failover) and target.randomize
        started = False
        last_error: BaseException | None = None
        try:
            while not self._closing:
                delay = backoff.next_delay(self._rng)
                if delay is None:
                    raise ConnectionClosed(_cannot_connect(self.uri, last_error))
                if delay:
                    await trio.sleep(delay)
                # one attempt = one sweep over the endpoints; the one we just lost goes
                # last, so a broker that keeps dropping us is not retried first (both as
                # in ActiveMQ's failover transport)
                order = self._rng.sample(endpoints, len(endpoints)) if randomize \
                    else list(endpoints)
                if self.endpoint is not None and len(order) > 1:
                    order.remove(self.endpoint)
                    order.append(self.endpoint)
                opened = None
                for endpoint in order:
                    try:
                        opened = await self._open(endpoint)
                        break
                    except _SOCKET_ERRORS as exc:
                        last_error = self.last_error = exc
                    except RemoteError as exc:
                        # a failed TLS handshake is retried like an unreachable broker:
                        # under failover the next endpoint may well be fine
                        self.last_error = exc
                        if exc.code not in ("unreachable", "tls_failed"):
                            raise
                        last_error = exc
                if opened is None:
                    continue
                framed, early, hello, endpoint = opened
                backoff.connected(trio.current_time())
                if started:
                    self.reconnects += 1
                self._install(framed, hello, endpoint)
                if not started:
                    started = True
                    task_status.started()
                self._lost = None
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._read_loop, framed, early, nursery)
                        nursery.start_soon(self._write_loop, framed, nursery)
                        interval = hello.options.get("heartbeat_interval")
                        if isinstance(interval, (int, float)) and interval > 0:
                            nursery.start_soon(self._watchdog, float(interval), nursery)
                finally:
                    self._uninstall()
                    with trio.CancelScope(shield=True):
                        await trio.aclose_forcefully(framed.stream)
                last_error = self._lost
                backoff.disconnected(trio.current_time())
                if not isinstance(target, Failover):
                    raise ConnectionClosed(f"connection to {self.uri} lost: {last_error}")
        except RemoteError as exc:  # the broker refused our hello: retrying cannot help
            self._fail(ConnectionClosed(str(exc) if exc.code in _NOT_A_BROKER
                                        else f"{self.uri} refused the connection: {exc}"))
            if not started:
                task_status.started(exc)
        except ConnectionClosed as exc:
            self._fail(exc)
            if not started:
                task_status.started(exc)
        finally:
            if self._closed is None:
                self._fail(ConnectionClosed("connection closed"))

    async def _open(self, endpoint: Endpoint) -> tuple:
        stream = await open_tcp(endpoint, ssl_context=self._ssl_context)
        framed = FramedStream(stream, self._max_frame, receive_size=_RECEIVE_SIZE)
        framed.poller = self.poller
        try:
            await framed.send_frame(Hello(PROTOCOL_VERSION, "client", name=self.client_id,
                                          username=self._username,
                                          password=self._password,
                                          options={"producer_key": self._producer_key}))
            frames = None
            with trio.move_on_after(self._hello_timeout):
                try:
                    frames = await framed.receive_frames()
                except trio.EndOfChannel:
                    raise _Lost("broker closed the connection during the handshake") \
                        from None
                except FrameError as exc:
                    raise RemoteError(f"{endpoint} is not a treefed broker: its first bytes "
                                      f"are not a treefed frame ({exc.message})",
                                      code="not_a_broker") from None
            if frames is None:
                raise RemoteError(f"{endpoint} sent no hello within {self._hello_timeout:g} "
                                  "s: is it a treefed broker?", code="hello_timeout")
            first = frames[0]
            if type(first) is Error:
                raise remote_error(first)
            hello = check_hello(first, PROTOCOL_VERSION, ("broker",))
        except BaseException:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
            raise
        return framed, frames[1:], hello, endpoint

    def _install(self, stream: FramedStream, hello: Hello, endpoint: Endpoint) -> None:
        """A fresh socket: replay subscriptions and unconfirmed sends before anything
        queued while we were away (which is dropped: see the module docstring)."""
        self._gen += 1
        self._stream = stream
        self.broker_hello = hello
        self.endpoint = endpoint
        replay: list = []
        for sub in self._subs.values():
            replay.append(sub.frame)
            sub._reset_acks()
        replay += self._unconfirmed.values()
        self._out = replay
        self._writing = False
        self._ready.set()
        self._wake.set()

    def _uninstall(self) -> None:
        self._stream = None
        self._ready = trio.Event()
        self._out = []
        self._writing = False
        # stats and replies cannot survive the socket; receipts are re-earned by replay
        while self._stat_waiters:
            self._stat_waiters.popleft().set(error=ConnectionClosed("connection lost"))
        self._flushed.set()
        self._flushed = trio.Event()
        self._room.set()
        self._room = trio.Event()

    async def _write_loop(self, framed: FramedStream, nursery: trio.Nursery) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                frames = self._out
                if not frames and not framed.pending:   # pending: see _write_now
                    continue
                self._out = []
                if len(frames) >= self._high_water:
                    self._room.set()
                    self._room = trio.Event()
                self._writing = True
                await framed.send_frames(frames)
                self._writing = False
                if not self._out:
                    self._flushed.set()
                    self._flushed = trio.Event()
        except _SOCKET_ERRORS as exc:
            self._lost = self._lost or exc
        finally:
            nursery.cancel_scope.cancel()

    async def _watchdog(self, interval: float, nursery: trio.Nursery) -> None:
        """Ping a broker silent for ``interval``; one that stays silent for another
        interval after the ping is gone (half-open): end this socket."""
        pinged = None
        while True:
            await trio.sleep(interval / 2)
            now = trio.current_time()
            if pinged is not None and self._last_rx < pinged:
                if now - pinged >= interval:
                    self._lost = self._lost or _Lost(
                        f"broker silent for {now - self._last_rx:.1f} s (heartbeat)")
                    nursery.cancel_scope.cancel()
                    return
            elif now - self._last_rx >= interval:
                pinged = now
                self._queue(Ping(0))

    async def _read_loop(self, framed: FramedStream, frames: list,
                         nursery: trio.Nursery) -> None:
        gen = self._gen
        subs = self._subs
        self._last_rx = trio.current_time()
        try:
            while True:
                for frame in frames:
                    if type(frame) is Deliver:
                        sub = subs.get(frame.sub)
                        if sub is None:
                            continue  # closed meanwhile: the broker requeues it
                        audit = sub._audit
                        acked = audit.get(frame.msg)
                        again = False
                        if acked is None:
                            audit[frame.msg] = False
                            if len(audit) > sub._audit_size + _AUDIT_SLACK:
                                # oldest first, a slice at a time: popping one key per
                                # message from the front of a dict rescans the holes
                                # left there, about a microsecond a message
                                for old in list(islice(audit, _AUDIT_SLACK)):
                                    del audit[old]
                        elif acked:   # processed before a failover: settle it again
                            self._queue(Ack(frame.sub, frame.msg))
                            continue
                        else:
                            again = True   # delivered before, never acked
                        sub._unsettled.append(frame.msg)
                        msg = ReceivedMessage(frame, self, gen)
                        if sub is self._reply_sub:
                            self._route_reply(msg)
                        elif again:
                            sub._again(msg)
                        else:
                            sub._push(msg)
                    else:
                        self._dispatch(frame)
                if len(self._unconfirmed) < self._max_unconfirmed:
                    self._confirm_room.set()
                    self._confirm_room = trio.Event()
                frames = await framed.receive_frames()
                self._last_rx = trio.current_time()
        except trio.EndOfChannel:
            self._lost = self._lost or _Lost("broker closed the connection")
        except FrameError as exc:
            self._lost = self._lost or _Lost(f"malformed frame from the broker: {exc}")
        except _SOCKET_ERRORS as exc:
            self._lost = self._lost or exc
        finally:
            nursery.cancel_scope.cancel()

    def _route_reply(self, msg: ReceivedMessage) -> None:
        msg.ack_nowait()
        waiter = self._reply_waiters.get(msg.headers.get("correlation_id"))
        if waiter is not None:
            waiter.set(msg)

    def _dispatch(self, frame: Any) -> None:
        kind = type(frame)
        if kind is Receipt:
            rid = frame.id
            if SCOPE_SEP in rid:     # a send's receipt names the broker's scoped id
                rid = original(rid)
            if self._unconfirmed.pop(rid, None) is not None:
                self.confirmed_total += 1
            waiter = self._receipt_waiters.pop(rid, None)
            if waiter is not None:
                waiter.set()
        elif kind is Error:
            self._on_error(frame)
        elif kind is StatReply:
            if self._stat_waiters:
                self._stat_waiters.popleft().set(frame.data)
        elif kind is Ping:
            self._queue(Pong(frame.token))
        elif kind is Bye:
            raise _Lost(f"broker said bye: {frame.reason}")
        # Pong and anything else a client has no use for are ignored

    def _on_error(self, frame: Error) -> None:
        exc = remote_error(frame)
        ref = frame.ref
        if ref is not None and SCOPE_SEP in ref:
            ref = original(ref)
        if ref is None:
            raise _Lost(f"broker closed the connection: [{frame.code}] {frame.message}") \
                from exc
        if ref == _STAT_REF and self._stat_waiters:   # stat refused (not an admin)
            self._stat_waiters.popleft().set(error=exc)
            return
        waiter = self._receipt_waiters.pop(ref, None)
        if self._unconfirmed.pop(ref, None) is not None and waiter is None:
            self._refused.append(exc)
        sub = self._subs.get(ref)
        if sub is not None and waiter is None:   # an open subscription was ended
            del self._subs[ref]
            sub._end(exc)
        elif sub is not None:
            del self._subs[ref]
        if waiter is not None:
            waiter.set(error=exc)
        else:
            reply = self._reply_waiters.get(ref)
            if reply is not None:
                reply.set(error=exc)


def _cannot_connect(uri: str, error: BaseException | None, *,
                   within: float | None = None) -> str:
    """One sentence saying why ``uri`` could not be reached, naming each address once
    (the attempt's own error usually starts "cannot connect to <endpoint>")."""
    head = f"cannot connect to {uri}" + (f" within {within:g} s" if within else "")
    if error is None:
        return head + ("" if within else ": no attempts left")
    text = str(error)
    if text.startswith("cannot connect to "):
        if not within and text.startswith(f"cannot connect to {uri}"):
            return text   # a bare endpoint: the attempt's message says it all
        text = text[len("cannot connect to "):]
    return f"{head}; last attempt: {text}"


@asynccontextmanager
async def connect(uri: str, *, client_id: str | None = None, username: str | None = None,
                  password: str | None = None, ssl_context: ssl.SSLContext | None = None,
                  **options: Any) -> AsyncIterator[Connection]:
    """``async with connect("tcp://127.0.0.1:61616") as conn:`` — connected and
    handshaken on entry; flushed, bye sent and closed on exit.  ``username`` /
    ``password`` go in the hello of a broker with authentication on (a refusal raises
    RemoteError(code="auth_failed")); ``ssl_context`` is used for ``ssl://`` URIs (e.g.
    ``transport.tls.client_context(ca=...)``; default: the system CAs).  ``options``:
    ``max_frame``, ``high_water``, ``max_unconfirmed``, ``hello_timeout`` (seconds a
    peer has to answer our hello; longer means it is no treefed broker), ``idle_poll_us``
    (poll up to that long after each read instead of sleeping: CPU for latency,
    transport/idlepoll.py; 0, the default, never polls) and
    ``connect_timeout`` (seconds for the first connection, retries included; default
    none: a failover URI retries per its options).  Raises ConnectionClosed when no
    broker can be reached, the broker's RemoteError when it refuses our hello."""
    connect_timeout = options.pop("connect_timeout", None)
    conn = Connection(uri, client_id=client_id, username=username, password=password,
                      ssl_context=ssl_context, **options)
    failure = None
    try:
        async with trio.open_nursery() as nursery:
            if conn.poller is not None:
                nursery.start_soon(conn.poller.run)
            # the supervisor reports a failed first connection instead of raising it,
            # so it reaches the caller as itself rather than inside an ExceptionGroup
            with trio.move_on_after(math.inf if connect_timeout is None
                                    else connect_timeout) as startup:
                failure = await nursery.start(conn._supervise)
            if startup.cancelled_caught:   # e.g. failover retrying for ever (issue #12)
                failure = ConnectionClosed(_cannot_connect(
                    uri, conn.last_error, within=connect_timeout))
                conn._fail(failure)
            if failure is None:
                try:
                    yield conn
                finally:
                    try:
                        await conn.aclose()
                    finally:
                        nursery.cancel_scope.cancel()
            elif conn.poller is not None:
                nursery.cancel_scope.cancel()   # its task would hold the nursery open
    except BaseExceptionGroup as group:
        # Background tasks never raise, so a group holds the body's own exception:
        # give it back unwrapped, as a plain `async with` would.
        if len(group.exceptions) != 1:
            raise
        inner = group.exceptions[0]
        inner.__suppress_context__ = True
        raise inner
    if failure is not None:
        raise failure
