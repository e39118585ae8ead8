"""The pure broker: destinations, consumers, dispatch, acks, expiry, DLQ, limits.

Theory of operation
-------------------
Module map (issue 18: the broker split along its seams; ``Broker`` is the facade, and
the only owner of state):

* ``core/records.py`` -- the state records: ``Conn``, ``Consumer``, ``Dest``,
  ``ConsumerInfo``, ``msg_size``, the shared empties;
* ``core/dispatch.py`` -- the one message decision point: ``eligible``, ``pick`` (queues:
  a consumer index, ``WAIT`` or ``NOBODY``), ``take`` (round robin), ``fanout`` (topics);
* ``core/flow.py`` -- flow control: destination limit verdicts, per-connection limits,
  the memory refusal, blocked producers (``Blocked``);
* ``core/duplicates.py`` -- duplicate tracking: held / consumed / seen ids
  (``Duplicates``);
* here -- the entry points and everything that acts: admission, giving (Deliver /
  Forward), draining pending messages, acks, pending and expiry, DLQ, memory books.

``Broker`` is a state object.  Every entry point takes ``now`` and returns the actions
(core/actions.py) the shell must perform in order; nothing here awaits, sleeps or reads a
clock.  A *connection* (``conn``) is any string; a *consumer* is ``(conn, sub_id)`` with a
destination pattern.  Consumers added with ``peer=`` are network demand: what they get is
sent as ``Forward`` frames and released by ``ForwardAck``; local consumers get ``Deliver``
frames and release with ``Ack``.

Destinations are created on first use and found through two indexes: consumers by
pattern (``SubscriptionIndex.match`` when a destination is created) and destinations by
name (``select`` when a wildcard consumer arrives).  Each destination keeps its own list
of matching consumers, sorted by priority (highest first) and rotated within a level, so
per-message dispatch never consults the index.

Queues (dispatch.py): a message goes to one consumer -- the first *eligible* one with
credit in that list, i.e. the highest priority level that has credit, round-robin within
the level.  No such consumer: the message waits in ``pending``.  Invariant: after every
entry point no pending message could be dispatched, so a new message may be dispatched
directly without overtaking; whatever returns credit (ack, forward-ack, nack, a new or
removed consumer) drains pending again.  Eligibility per consumer: its selector matches;
a network consumer is never given a message whose path holds its peer, nor one whose path
is already ``message_ttl`` long, nor a ``local_only`` destination's message; a fallback
consumer only when no regular consumer is eligible (credit not considered).
Topics: every eligible subscription gets the same Message object; network consumers of
one conn share a single copy per dispatch; a subscriber without credit gets the message
queued for it (up to prefetch x 10, oldest dropped).  Topic messages are never stored,
even when persistent: treefed has no durable topic subscriptions.  Messages to temporary
destinations are not stored either -- they die with the connection that owns them.

Persistence: a persistent queue message yields StoreMessage when accepted and
DeleteMessage when acked, dropped, expired or dead-lettered (``consumed=True`` when a
local consumer's ack settled it); the shell commits a batch's stores before its Outs, so
a Receipt (an Out) means "stored".  Expiry: ``expires`` is absolute; expired messages are
never delivered -- checked at dispatch, and a heap of pending messages' expiry times
drives ``next_deadline`` / ``handle_timer``.

Faults (duplicates.py).  A queue message is *held* here from acceptance until it is
acked, forward-acked or dropped; a copy of a held message, or of one a local consumer
acked, is a duplicate whatever route it took (a producer re-sending after failover, a
peer re-forwarding after a reconnect or a restart, a copy that toured the tree).
Duplicates survive a restart: held messages come back through ``restore``, and the ids
local consumers acked (the newest ``dedup_window``) go to the store with their
``DeleteMessage(consumed=True)`` and come back as ``restore(..., consumed=)`` -- so a
copy the upstream re-forwards because our ForwardAck was lost is still acked and dropped.
Ids that were only forwarded on are not remembered that way: such a message may come back
on a tree link (a replay).  A rested message goes back up to a fallback (parent) only
``replay_delay`` after it rested, so a consumer that restarts gets its backlog here, in
order; a message that returns to a broker it left is queued by timestamp among the newer
ones (timestamps never go back).  ``withdraw`` takes back an accepted message whose store
commit failed.

Flow control ("block", flow.py): a Send to a full destination is parked, not accepted,
and the connection is paused; its later sends queue behind it in order; when the
destination has room they are admitted in order and the connection resumed.

Limits (issue #12).  A temporary destination belongs to the connection that created it:
no wildcard over temp names, no other consumer (``_check_temp``).  A client connection
holds at most ``max_subscriptions_per_conn`` consumers and ``max_inflight_per_conn`` of
summed prefetch.  ``max_memory_bytes`` caps the message bytes held (``_mem``: queues'
pending and in flight, topic backlogs); past it sends are refused ``memory_full`` and
non-persistent forwards dropped, and ``page_out`` swaps waiting persistent bodies for
``core.paging.Paged`` markers the shell reads back from its store.  With
``idle_destination_seconds`` a timer forgets empty destinations without consumers of
their own, and a topic nobody subscribes to is never kept.

Refusals: whatever a peer sends that is wrong becomes ``Out(conn, Error(code, message,
ref))`` to that conn only; TreefedError subclasses raised inside are turned into Error
frames at the entry point.  Anything else escaping is a bug in this module.
Never: imports trio/time/random, logs directly (Log actions only, message events only
when ``log_messages``), or touches the store itself.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import replace
from itertools import count
from typing import Any, Callable, Iterable

from treefed.core.actions import Action, DeleteMessage, Log, Out, Pause, Resume, StoreMessage
from treefed.core.actions import PageIn
from treefed.core.destinations import is_wildcard, parse_destination
from treefed.core.dispatch import NOBODY, fanout, pick, take
from treefed.core.duplicates import Duplicates
from treefed.core.flow import (
    BLOCK,
    DROP_OLDEST,
    Blocked,
    check_conn_limits,
    full,
    limit_verdict,
    memory_refusal,
)
from treefed.core.index import SubscriptionIndex
from treefed.core.message import Message
from treefed.core.paging import Paged
from treefed.core.policy import PolicySet
from treefed.core.records import (
    INF,
    NO_DESTS,
    NO_MESSAGES,
    NO_PENDING,
    Conn,
    Consumer,
    ConsumerInfo,
    Dest,
    info,
    msg_size,
)
from treefed.errors import DestinationError, RemoteError, TreefedError
from treefed.wire.frames import (
    Ack,
    Deliver,
    Error,
    Forward,
    ForwardAck,
    Nack,
    Ping,
    Pong,
    Receipt,
    Send,
    Subscribe,
    Unsubscribe,
)

__all__ = ["Broker", "ConsumerInfo", "TOPIC_BACKLOG_FACTOR"]

#: A topic subscriber without credit has at most prefetch x this many messages queued.
TOPIC_BACKLOG_FACTOR = 10
#: A forwarded message whose path is this long is looping (tree replays can revisit
#: brokers, so the path check alone does not bound them): dropped, reason "hop_limit".
MAX_HOPS = 64


class Broker:
    """One broker's destinations, consumers and dispatch, driven by ``(input, now)``."""

    def __init__(self, broker_id: str, policies: PolicySet | None = None, *,
                 max_redeliveries: int = 6, dlq: str = "queue://DLQ",
                 log_messages: bool = True, dedup_window: int = 100_000,
                 replay_delay: float = 0.0, max_subscriptions_per_conn: int = 0,
                 max_inflight_per_conn: int = 0, max_memory_bytes: int = 0,
                 idle_destination_seconds: float = 0.0) -> None:
        self.broker_id = broker_id
        # memory (issue #12, defect 8; 0 = off): message bytes held here (queues' pending
        # and in-flight, topic backlogs) may not pass max_memory_bytes -- a send that
        # would is refused "memory_full", a non-persistent forward dropped; destinations
        # with nothing in them and no consumer of their own are forgotten after
        # idle_destination_seconds (a later message simply creates them again)
        self.max_memory_bytes = max_memory_bytes
        self.idle_destination_seconds = idle_destination_seconds
        self._mem = 0                             # message bytes held (see above)
        self._paged = 0                           # of them, bodies paged out to the store
        self._idle_due: float | None = None
        self.collected = 0                        # destinations forgotten as idle
        self.pageable = False   # the shell sets it when its store can read bodies back
        # the store cursor (core/broker.py; 0 = off): a queue holds at most this many
        # waiting persistent messages in memory, the rest stay in the store only and are
        # paged back in (PageIn -> page_in) as consumers take the page -- the shell sets it
        # when its store can read pages (ActiveMQ's maxPageSize)
        self.page_size = 0
        self._spilling: dict[Dest, None] = {}     # queues with messages in the store only
        # producer flow control for non-persistent sends (0 = off; the shell sets it from
        # broker.max_queue_memory_bytes): a local producer's non-persistent send to a queue
        # whose messages in memory would pass this is parked, its connection paused, until
        # consumers take some (ActiveMQ: producerFlowControl with a queue memoryLimit)
        self.queue_memory_bytes = 0
        self._closing_conn: Conn | None = None   # see _admit_on_close
        # per client connection (issue #12, defect 7; 0 = unlimited): its consumers, and
        # the sum of their prefetch -- what it may hold delivered and unacked at once
        self.max_subscriptions_per_conn = max_subscriptions_per_conn
        self.max_inflight_per_conn = max_inflight_per_conn
        self.replay_delay = replay_delay      # a rested message goes back up its path (to
        #   a fallback consumer) only this long after it rested: a consumer restarting at
        #   a store gets its backlog, in order, instead of it touring the tree
        self.policies = policies if policies is not None else PolicySet()
        self.max_redeliveries = max_redeliveries
        self.dlq = parse_destination(dlq)
        self.log_messages = log_messages
        self._dups = Duplicates(dedup_window)     # held / consumed / seen ids (duplicates.py)
        self._conns: dict[str, Conn] = {}
        self._dests: dict[str, Dest] = {}
        self._subs = SubscriptionIndex(flat_literals=True)  # consumer patterns -> consumers
        self._dest_index = SubscriptionIndex()    # live destination names -> Dest
        self._timers: list[tuple[float, int, Dest]] = []   # heap of pending expiries
        self._expiring = 0                        # pending messages with an expiry, all dests
        self._seq = count()
        self._waiting: dict[Dest, None] = {}     # queues with pending messages (ordered set)
        self._blocked = Blocked()                 # producers parked on full dests (flow.py)
        self._replays: list[tuple[float, int, Dest]] = []  # heap: rested messages due
        self._stamp = 0.0                         # last timestamp given: never goes back,
        #                                           so order by timestamp is send order
        self._dropped: dict[str, int] = {}        # reason -> messages dropped
        self._dead_lettered = 0
        # running totals for monitoring (counters only ever grow; the monitor exports them)
        self.produced = 0                         # sends accepted from local producers
        self.received = 0                         # forwards accepted from peer brokers
        self.delivered = 0                        # deliveries to local consumers
        self.forwarded = 0                        # forwards to peer brokers
        self._handlers: dict[type, Callable[[str, Any, float], list]] = {
            Send: self.send,
            Subscribe: self._on_subscribe,
            Unsubscribe: self._on_unsubscribe,
            Ack: self._on_ack,
            Nack: self._on_nack,
            Forward: self.accept_forward,
            ForwardAck: self._on_forward_ack,
            Ping: self._on_ping,
        }

    @property
    def dedup_window(self) -> int:
        """How many consumed ids and forwarded keys are remembered (core/duplicates.py)."""
        return self._dups.window

    # ------------------------------------------------------------------ connections

    def connect(self, conn: str, now: float) -> list[Action]:
        self._conn(conn)
        return []

    def disconnect(self, conn: str, now: float) -> list[Action]:
        """Drop ``conn``: its consumers go (in-flight requeued, redelivered + 1), its parked
        sends are discarded unaccepted, its temporary destinations are deleted."""
        cs = self._conns.pop(conn, None)
        if cs is None:
            return []
        out: list[Action] = []
        for c in list(cs.consumers.values()):
            self._remove(c, now, out)
        if cs.parked and self.queue_memory_bytes:
            self._admit_on_close(cs, now, out)
        self._blocked.leave(cs)
        for name in cs.temps:
            d = self._dests.get(name)
            if d is not None and d.owner == conn:
                self._delete_dest(d, now, out)
        self._finish(now, out)
        return out

    def handle_frame(self, conn: str, frame: Any, now: float) -> list[Action]:
        """A frame from ``conn``. Refusals come back as Error frames to ``conn`` only."""
        handler = self._handlers.get(type(frame))
        if handler is None:
            return [Out(conn, Error("bad_frame",
                                    f"{type(frame).__name__} frames are not accepted here"))]
        try:
            return handler(conn, frame, now)
        except TreefedError as exc:
            return [Out(conn, Error(exc.code, exc.message, _ref(frame)))]

    # ------------------------------------------------------------------ consumers

    def add_consumer(self, conn: str, sub_id: str, dst: str, now: float, *,
                     selector: Any = None, prefetch: int = 1000, priority: int = 0,
                     peer: str | None = None, message_ttl: int = -1, fallback: bool = False,
                     local_only_ok: bool = False, replay: bool = False) -> list[Action]:
        """Open a consumer; raises a TreefedError (nothing changed) when refused.

        ``selector`` is selector text (compiled here) or an already compiled selector."""
        cs = self._conn(conn)
        if sub_id in cs.consumers:
            raise RemoteError(f"subscription {sub_id!r} already exists on this connection",
                              code="duplicate_subscription")
        pattern = parse_destination(dst, allow_wildcards=True)
        if not isinstance(prefetch, int) or prefetch < 1:
            raise RemoteError(f"prefetch must be at least 1, not {prefetch!r}", code="bad_frame")
        wildcard = is_wildcard(pattern)
        temp = pattern.startswith("temp-")
        if temp:
            self._check_temp(conn, pattern, wildcard, peer)
        if peer is None and (self.max_subscriptions_per_conn
                             or self.max_inflight_per_conn):
            check_conn_limits(cs, prefetch, self.max_subscriptions_per_conn,
                              self.max_inflight_per_conn)
        if isinstance(selector, str):
            if selector.strip():
                from treefed.core.selector import compile_selector  # lazy: lark grammar
                selector = compile_selector(selector)
            else:
                selector = None
        # Validation done: from here on nothing raises.
        if wildcard:
            dests = self._dest_index.select(pattern)
        else:
            # Created on first use, not here (a message finds its consumers through the
            # index then): most demand never carries a message.  A temp destination is
            # created now, because its owner is the subscribing connection.
            d = self._dests.get(pattern)
            if d is None and temp and peer is None:
                d = self._new_dest(pattern)
            if temp and peer is None and d.owner is None:
                d.owner = conn
                cs.temps.append(pattern)
            dests = [d] if d is not None else []
        seq = next(self._seq)
        c = Consumer(cs, sub_id, pattern, selector, prefetch, priority, peer, message_ttl,
                      fallback, local_only_ok,
                      f"{self.broker_id}/{conn}/{sub_id}" if peer is None else None, seq,
                      replay)
        cs.consumers[sub_id] = c
        if peer is None:
            cs.credit += prefetch
        self._subs.insert(pattern, c)
        out: list[Action] = []
        if peer is None:
            out.append(Log("consumer.added", {"consumer": c.gid, "dst": pattern}))
        for d in dests:
            self._attach(c, d)
        if not c.topic:
            for d in dests:
                if d.pending:
                    self._drain(d, now, out)
        self._finish(now, out)
        return out

    def _check_temp(self, conn: str, pattern: str, wildcard: bool, peer: str | None) -> None:
        """A temporary destination belongs to the connection that created it (issue #12,
        defect 3): nobody -- client or peer broker -- subscribes to temp names by
        wildcard; a client may not subscribe to a temp name that exists elsewhere
        (another connection here owns it, or demand for it came over a link: it was
        created at another broker); a peer may not claim one a client here owns."""
        if wildcard:
            raise DestinationError(f"a temporary destination cannot be subscribed by "
                                   f"wildcard: {pattern!r}")
        existing = self._dests.get(pattern)
        owner = existing.owner if existing is not None else None
        if peer is None:
            if owner not in (None, conn) or any(
                    c.conn != conn for c in self._subs.match(pattern)):
                raise RemoteError(f"{pattern} belongs to another connection",
                                  code="forbidden")
        elif owner is not None:
            raise RemoteError(f"{pattern} belongs to a connection of this broker",
                              code="forbidden")
    def selector_widened(self, conn: str, sub_id: str, now: float) -> list[Action]:
        """The consumer's selector object now matches more than before (it was changed
        in place, e.g. a federation conduit gained a member): offer it the queue messages
        waiting at its destinations.  Cost: those destinations' pending messages only."""
        cs = self._conns.get(conn)
        c = cs.consumers.get(sub_id) if cs is not None else None
        out: list[Action] = []
        if c is None or c.topic:
            return out
        for d in list(c.dests):
            if d.pending:
                self._drain(d, now, out)
        self._finish(now, out)
        return out

    def remove_consumer(self, conn: str, sub_id: str, now: float) -> list[Action]:
        """Close a consumer: its in-flight messages are requeued (redelivered + 1)."""
        cs = self._conns.get(conn)
        c = cs.consumers.get(sub_id) if cs is not None else None
        if c is None:
            raise RemoteError(f"no subscription {sub_id!r} on this connection",
                              code="no_such_subscription")
        out: list[Action] = []
        self._remove(c, now, out)
        self._finish(now, out)
        return out

    def has_consumer(self, conn: str, sub_id: str) -> bool:
        cs = self._conns.get(conn)
        return cs is not None and sub_id in cs.consumers

    def consumer(self, conn: str, sub_id: str) -> ConsumerInfo | None:
        cs = self._conns.get(conn)
        c = cs.consumers.get(sub_id) if cs is not None else None
        return info(c) if c is not None else None

    def temp_owner(self, name: str) -> str | None:
        """The local connection owning temporary destination ``name``, or None."""
        d = self._dests.get(name)
        return d.owner if d is not None else None

    def consumers_for(self, dst: str) -> list[ConsumerInfo]:
        """Consumers a message to concrete ``dst`` would be considered for, in dispatch
        order; for a wildcard ``dst``, the consumers subscribed with exactly that pattern."""
        pattern = parse_destination(dst, allow_wildcards=True)
        if is_wildcard(pattern):
            found = [c for cs in self._conns.values() for c in cs.consumers.values()
                     if c.pattern == pattern]
            found.sort(key=lambda c: c.seq)
        else:
            d = self._dests.get(pattern)
            if d is not None:
                found = list(d.consumers)
            else:
                found = sorted(self._subs.match(pattern), key=lambda c: (-c.priority, c.seq))
        return [info(c) for c in found]

    # ------------------------------------------------------------------ messages arriving

    def send(self, conn: str, frame: Send, now: float) -> list[Action]:
        """A producer's Send. Refusals are Error(ref=frame.id) frames, never exceptions."""
        out: list[Action] = []
        self.send_many(conn, [frame], now, out)
        return out

    def send_many(self, conn: str, frames: list, now: float, out: list) -> None:
        """A run of a producer's Send frames: ``send`` of each in turn, their actions
        appended to ``out`` (issue #14: one core call per read chunk, not three calls
        and a list per message).  Appending to the caller's list keeps what earlier
        sends did should a later one fail unexpectedly."""
        cs = self._conns.get(conn) or self._conn(conn)
        blocked = self._blocked
        for i, frame in enumerate(frames):
            if cs.parked is not None:
                cs.parked.extend(frames[i:])   # behind the blocked send, in order
                return
            try:
                if not self._admit_send(cs, frame, now, out):
                    cs.parked = deque((frame,))
                    out.append(Pause(conn, cs.blocked_on.name))
            except TreefedError as exc:
                out.append(Out(conn, Error(exc.code, exc.message, frame.id)))
            if blocked.room:
                try:
                    self._unblock(now, out)
                except TreefedError as exc:   # as handle_frame answers it
                    out.append(Out(conn, Error(exc.code, exc.message, frame.id)))

    def allow_revisits(self, conn: str) -> None:
        """Link ``conn`` is a tree link: a message it brings may have passed this broker
        before (it rested somewhere and was replayed back).  Loops stay bounded by
        MAX_HOPS."""
        self._conn(conn).revisit = True

    def accept_forward(self, conn: str, frame: Forward, now: float) -> list[Action]:
        """A message forwarded by a peer broker on link ``conn``.

        Duplicates (id seen within ``dedup_window``) are acked and dropped; a refused
        forward is answered with Error(ref=id) *and* ForwardAck so the sender does not hold
        it forever; an accepted one is stored first (if persistent), then acked."""
        cs = self._conns.get(conn) or self._conn(conn)
        if cs.parked is not None:
            cs.parked.append(frame)
            return []
        out: list[Action] = []
        try:
            if not self._admit_forward(cs, frame, now, out):
                cs.parked = deque((frame,))
                out.append(Pause(conn, cs.blocked_on.name))
        except TreefedError as exc:
            self._refuse_forward(conn, frame, exc, out)
        if self._blocked.room:
            self._unblock(now, out)
        return out

    def accept_forwards(self, conn: str, frames: list, now: float, out: list) -> None:
        """A run of Forward frames from link ``conn``, as ``accept_forward`` of each in
        turn, with their actions appended to ``out``, except that every ForwardAck of the
        run goes as ONE frame after the run's other actions (issue #14: one ack action
        per message was an allocation, an ``Out`` and a pass of the shell's action loop
        per forwarded message at every hop).  The acks keep their place after the
        messages' StoreMessage actions (see actions.py); a refused forward's Error goes
        after the acks of the forwards before it and before its own ack.  Appending to the caller's list keeps what
        earlier forwards did should a later one fail unexpectedly."""
        cs = self._conns.get(conn) or self._conn(conn)
        acks: list = []
        blocked = self._blocked
        try:
            for i, frame in enumerate(frames):
                if cs.parked is not None:
                    cs.parked.extend(frames[i:])
                    break
                try:
                    if not self._admit_forward(cs, frame, now, out, acks):
                        cs.parked = deque((frame,))
                        out.append(Pause(conn, cs.blocked_on.name))
                except TreefedError as exc:
                    if acks:   # the acks of the forwards before it go before its error
                        out.append(Out(conn, ForwardAck(acks)))
                        acks = []
                    self._refuse_forward(conn, frame, exc, out, acks)
                if blocked.room:
                    try:
                        self._unblock(now, out)
                    except TreefedError as exc:   # as handle_frame answers it
                        if acks:
                            out.append(Out(conn, ForwardAck(acks)))
                            acks = []
                        out.append(Out(conn, Error(exc.code, exc.message, frame.id)))
        finally:
            if acks:
                out.append(Out(conn, ForwardAck(acks)))

    def restore(self, messages: Iterable[Message], now: float,
                consumed: Iterable[str] = ()) -> list[Action]:
        """Put stored messages back on their queues after a restart, in order, keeping
        ``redelivered``; no StoreMessage is emitted for them.  Rows that cannot belong in
        the store (topic or temporary destinations) are deleted.

        ``consumed``: ids of queue messages local consumers acked before the restart,
        oldest first (``store.load_consumed()``); they are remembered first (the newest
        ``dedup_window`` of them), so a copy re-forwarded or re-sent later is a duplicate."""
        dups = self._dups
        dups.restore(consumed)
        out: list[Action] = []
        touched: dict[Dest, None] = {}
        for m in messages:
            try:
                name = parse_destination(m.dst)
            except DestinationError:
                out.append(DeleteMessage(m.id, m.dst))
                continue
            d = self._dests.get(name) or self._new_dest(name)
            if not d.stored:
                out.append(DeleteMessage(m.id, m.dst))
                continue
            d.bytes += msg_size(m)
            self._mem += msg_size(m)
            self._rest(d, m, now)  # it waited here across a restart: free to go anywhere
            dups.hold(m.id)
            self._push_pending(d, m)
            dups.remember(m.id)   # a peer re-forwarding it after our restart is a duplicate
            touched[d] = None
        for d in touched:
            self._drain(d, now, out)
        self._finish(now, out)
        return out

    def withdraw(self, msg_id: str, dst: str, now: float,
                 msg: Message | None = None) -> list[Action]:
        """Take back an accepted persistent message the shell could not store (the
        commit failed: store full).  It leaves pending, or the consumer it was given to
        (whose Deliver/Forward of this batch the shell must not send; credit returns),
        and is forgotten by the duplicate checks, so the producer's retry or the peer's
        re-forward is accepted later.  Unknown (id, dst): nothing happens.  ``msg``: the
        message of the failed StoreMessage -- one past its queue's page (``spilled``) is
        known to the core by count only."""
        d = self._dests.get(dst)
        if d is None or d.topic:
            return []
        out: list[Action] = []
        m = None
        for i in range(len(d.pending) - 1, -1, -1):
            if d.pending[i].id == msg_id:
                m = d.pending[i]
                del d.pending[i]
                if m.expires:
                    self._left_pending(d)
                if not d.pending:
                    self._waiting.pop(d, None)
                break
        holder = None
        if m is None:
            for c in d.consumers:
                m = c.inflight.get(msg_id)
                if m is not None and m.dst == dst:
                    del c.inflight[msg_id]
                    if c.peer is not None:
                        c.cs.forwarded.pop(msg_id, None)
                    d.inflight -= 1
                    holder = c
                    break
                m = None
        if m is None and msg is not None and msg.spilled and d.spilled:
            m = msg
            self._unspill(d, m)
        if m is None:
            return out
        d.enqueued -= 1
        d.bytes -= msg_size(m)
        self._mem -= msg_size(m)
        if type(m.body) is Paged:
            self._paged -= len(m.body)
        self._dups.release(msg_id)
        self._dups.forget(msg_id, len(m.path))
        if d.blocked:
            self._blocked.note_room(d)
        if holder is not None:
            self._credit_returned(holder, now, out)
        self._finish(now, out)
        return out

    # ------------------------------------------------------------------ timers

    def next_deadline(self) -> float | None:
        """When ``handle_timer`` next has work: the earliest pending expiry, replay
        release or idle-destination sweep, or None."""
        when = self._next_message_deadline()
        idle = self._idle_due
        if idle is not None and (when is None or idle < when):
            return idle
        return when

    def _next_message_deadline(self) -> float | None:
        heap = self._timers
        replay = self._replays[0][0] if self._replays else None
        while heap:
            when, _, d = heap[0]
            # An entry is stale when its message left pending: then the destination's
            # earliest pending expiry is later than the entry (or there is none).
            if d.alive and d.expiring and when >= d.next_expiry:
                return when if replay is None or when < replay else replay
            heapq.heappop(heap)
        return replay

    def handle_timer(self, now: float) -> list[Action]:
        """Expire pending messages whose time has come (DLQ or discard by policy), and
        offer rested messages whose ``replay_delay`` has passed to fallback consumers."""
        heap = self._timers
        due: dict[Dest, None] = {}
        while heap and heap[0][0] <= now:
            _, _, d = heapq.heappop(heap)
            if d.alive and d.expiring and d.next_expiry <= now:
                due[d] = None
        out: list[Action] = []
        for d in due:
            self._sweep(d, now, out)
        replays = self._replays
        while replays and replays[0][0] <= now:
            _, _, d = heapq.heappop(replays)
            if d.alive and d.pending:
                self._drain(d, now, out)   # rested messages now free to go back up
        if self._idle_due is not None and now >= self._idle_due:
            self._collect_idle(now)
        self._finish(now, out)
        return out

    def page_out(self) -> int:
        """Past a quarter of ``max_memory_bytes`` in memory, swap the bodies of waiting
        persistent queue messages (newest first: the last to be delivered) for ``Paged``
        markers until an eighth is left (a batch being committed is held twice: decoded
        and encoded for the store, so the rest of the cap is its headroom).  Only call it right after a successful commit:
        then every such message is in the store.  Returns the bytes paged out."""
        cap = self.max_memory_bytes
        if not (cap and self.pageable) or self._mem - self._paged <= cap // 4:
            return 0
        goal = self._mem - self._paged - cap // 8
        freed = 0
        for d in list(self._waiting):
            if not d.stored:
                continue
            for m in reversed(d.pending):
                body = m.body
                if type(body) is bytes and m.persistent and len(body) >= 256:
                    m.body = Paged(len(body), (m.id, d.name))
                    freed += len(body)
                    if freed >= goal:
                        break
            if freed >= goal:
                break
        self._paged += freed
        return freed

    def _collect_idle(self, now: float) -> None:
        """Forget destinations idle for ``idle_destination_seconds``: nothing pending, in
        flight or queued for a subscriber, nobody blocked on them, no consumer of their
        own (wildcard and fallback consumers find a recreated one through the index),
        not a temporary one (those die with their owner).  Runs every half period."""
        idle = self.idle_destination_seconds
        for d in list(self._dests.values()):
            if d.temp or d.pending or d.inflight or d.blocked or d.roomy or d.spilled:
                continue
            if len(d.consumers) != d.fallbacks and any(
                    c.pattern == d.name for c in d.consumers):
                continue
            if d.touched < 0:
                d.touched = now     # never used (created by a restore or a consumer)
                continue
            if now - d.touched < idle or any(c.backlog for c in d.consumers):
                continue
            d.alive = False
            del self._dests[d.name]
            self._dest_index.remove(d.name, d)
            self._waiting.pop(d, None)
            for c in d.consumers:
                c.dests.pop(d, None)
            d.consumers = []
            self.collected += 1
        self._idle_due = now + max(idle / 2, 0.5) if self._dests else None

    # ------------------------------------------------------------------ statistics

    def set_policies(self, policies: PolicySet) -> None:
        """Replace the destination policies (a live reload): existing destinations take
        their new policy at once; messages already held stay (limits apply to what
        arrives next)."""
        self.policies = policies
        for d in self._dests.values():
            policy = policies.for_destination(d.name)
            d.policy = policy
            d.limited = policy.limited
            d.local_only = policy.local_only or d.name == self.dlq

    def destination_sizes(self) -> list[tuple[str, int, int, int]]:
        """``(name, depth, bytes, consumers)`` per destination: what monitoring scrapes,
        without the copy of every consumer that ``statistics`` makes."""
        return [(d.name, len(d.pending) + d.spilled, d.bytes, len(d.consumers))
                for d in self._dests.values()]

    def statistics(self) -> dict:
        """JSON-able snapshot: connections, destinations, consumers, drop counters."""
        dests = {
            name: {"depth": len(d.pending) + d.spilled, "enqueued": d.enqueued,
                   "dequeued": d.dequeued, "consumers": len(d.consumers),
                   "inflight": d.inflight, "bytes": d.bytes}
            for name, d in self._dests.items()
        }
        consumers = []
        for cs in self._conns.values():
            for c in cs.consumers.values():
                consumers.append({
                    "conn": c.conn, "sub": c.sub_id, "dst": c.pattern, "peer": c.peer,
                    "priority": c.priority, "prefetch": c.prefetch, "fallback": c.fallback,
                    "selector": getattr(c.selector, "text", None), "inflight": len(c.inflight),
                    "queued": len(c.backlog) if c.backlog else 0, "delivered": c.delivered,
                })
        return {
            "broker": self.broker_id,
            "connections": len(self._conns),
            "destinations": dests,
            "consumers": consumers,
            "dropped": dict(self._dropped),
            "dead_lettered": self._dead_lettered,
            "messages": {"produced": self.produced, "received": self.received,
                         "delivered": self.delivered, "forwarded": self.forwarded},
            "memory": {"held_bytes": self._mem, "paged_out_bytes": self._paged,
                       "max_memory_bytes": self.max_memory_bytes,
                       "destinations_collected": self.collected},
            "parked": sum(len(cs.parked) for cs in self._conns.values() if cs.parked),
            "stored_only": sum(d.spilled for d in self._spilling),   # past their page
            "index": self._subs.statistics(),
        }

    # ================================================================== internals

    def _conn(self, conn: str) -> Conn:
        cs = self._conns.get(conn)
        if cs is None:
            cs = self._conns[conn] = Conn(conn)
        return cs

    def _new_dest(self, name: str) -> Dest:
        d = Dest(name, self.policies.for_destination(name))
        found = self._subs.match(name)
        if found:
            d.consumers = sorted(found, key=lambda c: (-c.priority, c.seq)) \
                if len(found) > 1 else list(found)   # one: no sort call (issue #14)
            for c in d.consumers:
                if c.dests is NO_DESTS:
                    c.dests = {}
                c.dests[d] = None
                if c.fallback:
                    d.fallbacks += 1
                if c.replay:
                    d.replayers += 1
        if name == self.dlq:
            d.local_only = True   # dead letters are this site's to inspect, never forwarded
        self._dests[name] = d
        self._dest_index.insert(name, d)
        return d

    def _delete_dest(self, d: Dest, now: float, out: list) -> None:
        """Delete a temporary destination: pending discarded, attached consumers detached
        (whatever they hold of it is forgotten: its acks will find nothing)."""
        d.alive = False
        del self._dests[d.name]
        self._dest_index.remove(d.name, d)
        self._waiting.pop(d, None)
        while d.pending:
            self._discard(d, d.pending.popleft(), "deleted", out)
        consumers, d.consumers = d.consumers, []
        for c in consumers:
            c.dests.pop(d, None)
            gone = [i for i, m in c.inflight.items() if m.dst == d.name]
            for msg_id in gone:
                del c.inflight[msg_id]
                c.cs.forwarded.pop(msg_id, None)
                if not d.topic:
                    self._dups.release(msg_id)
            if gone:
                self._credit_returned(c, now, out)
        self._expiring -= d.expiring
        d.expiring = 0
        if d.blocked:
            self._blocked.note_room(d)   # parked sends for it are re-run and refused

    def _attach(self, c: Consumer, d: Dest) -> None:
        cons = d.consumers
        i = len(cons)
        while i and cons[i - 1].priority < c.priority:
            i -= 1
        cons.insert(i, c)   # at the end of its priority level
        if c.dests is NO_DESTS:
            c.dests = {}
        c.dests[d] = None
        if c.fallback:
            d.fallbacks += 1
        if c.replay:
            d.replayers += 1

    def _remove(self, c: Consumer, now: float, out: list) -> None:
        cs = c.cs
        del cs.consumers[c.sub_id]
        if c.peer is None:
            cs.credit -= c.prefetch
        self._subs.remove(c.pattern, c)
        requeue: dict[Dest, list[Message]] = {}
        for m in c.inflight.values():
            if c.peer is not None:
                cs.forwarded.pop(m.id, None)
            d = self._dests.get(m.dst)
            if d is None:
                continue
            d.inflight -= 1
            if not d.topic:
                m.redelivered += 1
                requeue.setdefault(d, []).append(m)
        c.inflight.clear()
        if c.backlog:
            self._mem -= sum(map(msg_size, c.backlog))
        c.backlog = None
        dests = list(c.dests)
        c.dests.clear()
        for d in dests:
            d.consumers.remove(c)
            if c.fallback:
                d.fallbacks -= 1
            if c.replay:
                d.replayers -= 1
        for d, msgs in requeue.items():
            self._requeue_front(d, msgs)
        # Requeued messages, and messages that only a fallback consumer may now take.
        for d in dict.fromkeys([*dests, *requeue]):
            if d.pending:
                self._drain(d, now, out)
        for d in dests:
            if d.temp and d.owner is None and not d.consumers and d.alive:
                self._delete_dest(d, now, out)   # remote-owned temp: its last demand went
        if c.peer is None:
            out.append(Log("consumer.removed", {"consumer": c.gid, "dst": c.pattern}))

    # ------------------------------------------------------------------ admission

    def _admit_send(self, cs: Conn, f: Send, now: float, out: list) -> bool:
        """Accept a Send (True) or register it as blocked (False); raises to refuse."""
        if f.persistent and self._dups.known(f.id):
            # A producer re-sent after a failover what we already have (its receipt was
            # lost with the old connection): confirm it again, keep one copy.
            if f.receipt:
                out.append(Out(cs.name, Receipt(f.id)))
            self._count_drop("duplicate", f.id, f.dst, out)
            return True
        d = self._lookup_for_send(f.dst)
        if not 0 <= f.priority <= 9:
            raise RemoteError(f"priority must be 0..9, not {f.priority}", code="bad_frame")
        ttl = f.ttl
        stamp = self._stamp = now if now > self._stamp else self._stamp
        m = Message(f.id, d.name, f.headers, f.body, f.persistent, f.priority, stamp,
                    now + ttl / 1000 if ttl > 0 else 0.0, f.reply_to)
        size = msg_size(m)
        if self.max_memory_bytes and self._mem - self._paged + size > self.max_memory_bytes \
                and not (m.persistent and d.stored and self.pageable):
            # a persistent queue message is refused only where bodies cannot be paged
            # out to a store (see page_out)
            raise memory_refusal(self._mem - self._paged, d.name, size,
                                 self.max_memory_bytes)
        if d.limited and not self._check_limits(cs, d, size, out):
            return False
        if self.queue_memory_bytes and d.pending and d.consumers and not m.persistent \
                and not d.topic \
                and self._waiting_bytes(d) + size > self.queue_memory_bytes \
                and self._may_pause(cs, d):
            self._blocked.block(cs, d)   # waits for room: _settle_many & co call note_room
            return False
        d.enqueued += 1
        d.touched = now
        if not d.topic:
            d.bytes += size
            self._mem += size
            self._dups.hold(m.id)
            if m.persistent and d.stored:
                out.append(StoreMessage(m))
        if f.receipt:
            out.append(Out(cs.name, Receipt(f.id)))
        self.produced += 1
        if self.log_messages:
            out.append(Log("message.produced", {"msg": m.id, "dst": d.name}))
        if d.topic:
            self._fanout(d, m, now, out)
        else:
            self._dispatch_new(d, m, now, out)
        return True

    def _admit_forward(self, cs: Conn, f: Forward, now: float, out: list,
                       acks: list | None = None) -> bool:
        """``acks``: collect the ids to acknowledge there (``accept_forwards``) rather
        than appending one ForwardAck action each."""
        if len(f.path) >= MAX_HOPS:
            # Whatever the routing did, a message that crossed this many links is looping.
            if acks is None:
                out.append(Out(cs.name, ForwardAck([f.id])))
            else:
                acks.append(f.id)
            self._count_drop("hop_limit", f.id, f.dst, out)
            return True
        # A retransmit (reconnect mid-forward, a sender restarted before it saw our ack)
        # is a copy of a message we hold, or one a local consumer already took.  Elsewhere
        # the id alone is remembered too (ActiveMQ's audit) and a path holding this broker
        # is a loop.  On a tree link a queue message may legitimately come back after it
        # left (a replay), with any path, so only "held or consumed" tells a duplicate
        # there; topic copies never rest, so their key is the id and the path length.
        dup, key = self._dups.check_forward(f.id, f.dst, len(f.path), cs.revisit)
        if dup or (self.broker_id in f.path and not cs.revisit):
            # Ack so the sender releases its copy, and drop it.
            if acks is None:
                out.append(Out(cs.name, ForwardAck([f.id])))
            else:
                acks.append(f.id)
            self._count_drop("duplicate" if dup else "loop", f.id, f.dst, out)
            return True
        d = self._lookup_for_send(f.dst)
        m = Message(f.id, d.name, f.headers, f.body, f.persistent, f.priority,
                    f.timestamp or now, f.expires, f.reply_to, tuple(f.path), f.redelivered)
        size = msg_size(m)
        if self.max_memory_bytes and not (m.persistent and d.stored) \
                and self._mem - self._paged + size > self.max_memory_bytes:
            # a persistent queue message was confirmed upstream: it is taken (the store
            # holds it); anything else may be lost, and is, rather than the broker
            raise memory_refusal(self._mem - self._paged, d.name, size,
                                 self.max_memory_bytes)
        if d.limited and not self._check_limits(cs, d, size, out):
            return False
        if key is not None:
            self._dups.remember(key)
        d.enqueued += 1
        d.touched = now
        if not d.topic:
            d.bytes += size
            self._mem += size
            self._dups.hold(m.id)
            if m.persistent and d.stored:
                out.append(StoreMessage(m))
        if acks is None:
            out.append(Out(cs.name, ForwardAck([f.id])))   # after the store: see actions.py
        else:
            acks.append(f.id)   # one ForwardAck after the run (accept_forwards)
        self.received += 1
        if d.topic:
            self._fanout(d, m, now, out)
        else:
            self._dispatch_new(d, m, now, out)
        return True

    def _refuse_forward(self, conn: str, f: Forward, exc: TreefedError, out: list,
                        acks: list | None = None) -> None:
        out.append(Out(conn, Error(exc.code, exc.message, f.id)))
        if acks is None:
            out.append(Out(conn, ForwardAck([f.id])))
        else:
            acks.append(f.id)
        self._count_drop(exc.code, f.id, f.dst, out)

    def _lookup_for_send(self, dst: str) -> Dest:
        # A live destination's key is its canonical name, so text equal to a key needs
        # no parsing (the usual case: producers send to canonical names).
        d = self._dests.get(dst) if type(dst) is str else None
        if d is not None:
            name = dst
        else:
            name = parse_destination(dst)
            d = self._dests.get(name)
        if d is None:
            if name.startswith("temp-") and not self._subs.match(name):
                raise RemoteError(f"{name} does not exist (its owner is gone)",
                                  code="no_such_destination")
            if self.idle_destination_seconds and name.startswith("topic://") \
                    and not self._subs.match(name):
                # nobody subscribes: the message is dropped (no_route) and the name is
                # not kept -- it would be idle at once; a flood of topic names costs
                # nothing here (defect 8)
                return Dest(name, self.policies.for_destination(name))
            d = self._new_dest(name)
            if self.idle_destination_seconds and self._idle_due is None:
                self._idle_due = 0.0   # next_deadline: sweep at the next timer
        elif d.temp and d.owner is None and not d.consumers:
            raise RemoteError(f"{name} does not exist (its owner is gone)",
                              code="no_such_destination")
        return d

    def _check_limits(self, cs: Conn, d: Dest, size: int, out: list) -> bool:
        """True: admit. False: blocked (registered on ``d``). Raises LimitError to refuse
        (the verdict is flow.limit_verdict's)."""
        verdict = limit_verdict(d, size)
        if verdict == BLOCK:
            self._blocked.block(cs, d)
            return False
        if verdict == DROP_OLDEST:
            # Only pending messages can be dropped; if everything held is in flight the
            # new message is admitted over the limit rather than refused.
            while d.pending and full(d, size):
                m = d.pending.popleft()
                if m.expires:
                    self._left_pending(d)
                self._discard(d, m, "limit", out)
            if not d.pending:
                self._waiting.pop(d, None)
        return True

    # ------------------------------------------------------------------ flow control

    def _finish(self, now: float, out: list) -> None:
        if self._blocked.room:
            self._unblock(now, out)
        if self._spilling:
            self._refill(out)

    def _unblock(self, now: float, out: list) -> None:
        """Re-run parked sends of conns blocked on destinations that gained room."""
        for cs in self._blocked.released():
            self._run_parked(cs, now, out)

    def _run_parked(self, cs: Conn, now: float, out: list) -> None:
        parked = cs.parked
        while parked:
            f = parked[0]
            try:
                if type(f) is Send:
                    admitted = self._admit_send(cs, f, now, out)
                else:
                    admitted = self._admit_forward(cs, f, now, out)
            except TreefedError as exc:
                if type(f) is Send:
                    out.append(Out(cs.name, Error(exc.code, exc.message, f.id)))
                else:
                    self._refuse_forward(cs.name, f, exc, out)
                admitted = True
            if not admitted:
                return   # blocked again (maybe on another destination): stay paused
            parked.popleft()
        cs.parked = None
        out.append(Resume(cs.name))

    # ------------------------------------------------------------------ dispatch

    def _dispatch_new(self, d: Dest, m: Message, now: float, out: list) -> None:
        if m.expires and now >= m.expires:
            self._expire(d, m, now, out)
            return
        if d.spilled and m.persistent and d.stored:
            self._spill(d, m)   # behind the ones in the store: it waits its turn there
            return
        i = pick(d, m, now) if d.consumers else NOBODY
        if i == NOBODY and not m.rested:
            # No consumer here could ever take it (credit aside): it rests, and a replay
            # consumer may now take it back along its path (tree: store -> root -> store).
            self._rest(d, m, now)
            if d.replayers:
                i = pick(d, m, now)
        if i < 0:
            if m.persistent and d.stored and self.page_size \
                    and len(d.pending) >= self.page_size:
                self._spill(d, m)
            else:
                self._push_pending(d, m)
        else:
            self._give(take(d, i), d, m, out)

    def _drain(self, d: Dest, now: float, out: list, only: Consumer | None = None) -> None:
        """Dispatch what pending messages can be, in order, until credit runs out.

        ``only``: just this consumer gained credit, so stop when it has none left."""
        pending = d.pending
        if not pending or not d.consumers:
            return
        free = 0
        if only is None:
            for c in d.consumers:
                if len(c.inflight) < c.prefetch:
                    free += c.prefetch - len(c.inflight)
            if not free:
                return
        kept: list[Message] | None = None
        n = len(pending)
        while n:
            n -= 1
            m = pending.popleft()
            if m.expires and now >= m.expires:
                self._left_pending(d)
                self._expire(d, m, now, out)
                continue
            i = pick(d, m, now)
            if i == NOBODY and not m.rested:
                self._rest(d, m, now)   # see _dispatch_new
                if d.replayers:
                    i = pick(d, m, now)
            if i < 0:
                if kept is None:
                    kept = []
                kept.append(m)
                continue
            if m.expires:
                self._left_pending(d)
            self._give(take(d, i), d, m, out)
            if only is not None:
                if len(only.inflight) >= only.prefetch:
                    break
            else:
                free -= 1
                if not free:
                    break
        if kept:
            pending.extendleft(reversed(kept))
        if not pending:
            self._waiting.pop(d, None)

    def _fanout(self, d: Dest, m: Message, now: float, out: list) -> None:
        """Topic: a copy to every subscription dispatch.fanout chooses (one per network
        conn); one without credit gets it queued."""
        if m.expires and now >= m.expires:
            self._count_drop("expired", m.id, d.name, out)
            return
        taken = False
        for c in fanout(d, m, now):
            taken = True
            if c.backlog or len(c.inflight) >= c.prefetch:
                self._queue_for(c, m, out)
            else:
                self._give(c, d, m, out)
        if not taken:
            # Nobody here or beyond wants it (a tree root with no interest anywhere):
            # topics are not stored, so it is dropped — and counted.
            self._count_drop("no_route", m.id, d.name, out)

    def _queue_for(self, c: Consumer, m: Message, out: list) -> None:
        backlog = c.backlog
        if backlog is None:
            backlog = c.backlog = deque()
        elif len(backlog) >= c.prefetch * TOPIC_BACKLOG_FACTOR:
            old = backlog.popleft()
            self._mem -= msg_size(old)
            self._count_drop("overflow", old.id, old.dst, out)
        backlog.append(m)
        self._mem += msg_size(m)

    def _give(self, c: Consumer, d: Dest, m: Message, out: list) -> None:
        if c.inflight is NO_MESSAGES:
            c.inflight = {}
        c.inflight[m.id] = m
        c.delivered += 1
        d.inflight += 1
        if c.peer is None:
            self.delivered += 1
            out.append(Out(c.conn, Deliver(c.sub_id, m.id, m.dst, m.headers, m.body,
                                           m.persistent, m.priority, m.redelivered,
                                           m.reply_to, m.timestamp, m.expires)))
            if self.log_messages:
                out.append(Log("message.delivered",
                               {"msg": m.id, "dst": m.dst, "consumer": c.gid}))
        else:
            c.cs.forwarded[m.id] = c
            self.forwarded += 1
            path = [*m.path, self.broker_id]
            out.append(Out(c.conn, Forward(m.dst, m.id, path, m.headers, m.body, m.persistent,
                                           m.priority, m.expires, m.reply_to, m.timestamp,
                                           m.redelivered)))
            if self.log_messages:
                out.append(Log("message.forwarded", {"msg": m.id, "dst": m.dst, "link": c.conn,
                                                     "peer": c.peer, "hops": len(path)}))

    def _credit_returned(self, c: Consumer, now: float, out: list) -> None:
        if c.topic:
            backlog = c.backlog
            while backlog and len(c.inflight) < c.prefetch:
                m = backlog.popleft()
                self._mem -= msg_size(m)
                d = self._dests.get(m.dst)
                if d is None or not d.alive:
                    continue
                if m.expires and now >= m.expires:
                    self._count_drop("expired", m.id, m.dst, out)
                    continue
                self._give(c, d, m, out)
            if not backlog:
                c.backlog = None
            return
        # A wildcard consumer may span many queues: walk whichever set is smaller.
        if len(c.dests) <= len(self._waiting):
            candidates = [d for d in c.dests if d.pending]
        else:
            candidates = [d for d in self._waiting if d in c.dests]
        for d in candidates:
            if len(c.inflight) >= c.prefetch:
                break
            self._drain(d, now, out, only=c)

    # ------------------------------------------------------------------ acks

    def _settle_many(self, msgs: list, out: list, consumed: bool = False) -> None:
        """Consumers finished with ``msgs``: each leaves its destination for good (its
        in-flight count, bytes and memory booked, its duplicate hold released, a stored
        one's DeleteMessage appended to ``out`` in order; ``consumed``: a local
        consumer's ack, the store remembers the id, see restore).  Each stretch of one
        destination's messages is booked once -- the same books and actions as one
        message at a time (tests/core/test_settle_runs.py).  An Ack or a ForwardAck
        settles a read's worth of messages; per message a ``_settle`` + ``release`` +
        ``msg_size`` were ~100 bytecodes, mostly calls (issue #14)."""
        dests = self._dests
        dups = self._dups
        held = dups.held
        d = None
        name = None
        n = size = 0
        for m in msgs:
            if m.dst != name:
                if n:
                    self._settled(d, n, size)
                name = m.dst
                d = dests.get(name)
                n = size = 0
            if d is None:
                continue
            n += 1
            if d.topic:
                continue
            msg_id = m.id
            k = held.get(msg_id, 0)   # Duplicates.release, inline
            if k > 1:
                held[msg_id] = k - 1
            else:
                held.pop(msg_id, None)
            k = m.nbytes
            size += k if k >= 0 else msg_size(m)
            if type(m.body) is Paged:
                self._paged -= len(m.body)
            if m.persistent and d.stored:
                out.append(DeleteMessage(msg_id, d.name, consumed))
        if n:
            self._settled(d, n, size)
        if not held and dups.held is held:
            dups.held = {}   # as release does when the last copy leaves

    def _settled(self, d: Dest, n: int, size: int) -> None:
        """``_settle_many``'s books for ``n`` messages of ``d`` (``size`` bytes)."""
        d.inflight -= n
        d.dequeued += n
        if not d.topic:
            d.bytes -= size
            self._mem -= size
            if d.blocked:
                self._blocked.note_room(d)

    def _on_ack(self, conn: str, f: Ack, now: float) -> list[Action]:
        c = self._consumer_or_raise(conn, f.sub)
        inflight = c.inflight
        if f.msg not in inflight:
            raise RemoteError(f"message {f.msg!r} is not in flight on {f.sub!r}",
                              code="no_such_message")
        if f.upto:
            # Cumulative: ``inflight`` is in delivery order, so the acked messages are
            # its prefix up to f.msg (whatever was acked or nacked singly is gone).
            ids = []
            for msg_id in inflight:
                ids.append(msg_id)
                if msg_id == f.msg:
                    break
            msgs = [inflight.pop(msg_id) for msg_id in ids]
        else:
            msgs = [inflight.pop(f.msg)]
        out: list[Action] = []
        if c.peer is not None:
            forwarded = c.cs.forwarded
            for m in msgs:
                forwarded.pop(m.id, None)
            self._settle_many(msgs, out)
        elif not c.topic and self._dups.window > 0:
            # only these can come again: a producer re-sends unconfirmed persistent
            # sends, a peer re-forwards what it saw no ForwardAck for; the run's ids
            # join the consumed window in one call (issue #14)
            self._dups.consume_many([m.id for m in msgs if m.persistent or m.path])
            self._settle_many(msgs, out, True)   # DeleteMessage(consumed=True)
        else:
            self._settle_many(msgs, out)
        self._credit_returned(c, now, out)   # once per frame, however many it settled
        self._finish(now, out)
        return out

    def _on_forward_ack(self, conn: str, f: ForwardAck, now: float) -> list[Action]:
        cs = self._conns.get(conn)
        if cs is None:
            return []
        out: list[Action] = []
        freed: dict[Consumer, None] = {}
        settled = []
        forwarded = cs.forwarded
        for msg_id in f.ids:
            c = forwarded.pop(msg_id, None)
            if c is None:
                continue   # already released (requeued after a link drop): harmless
            m = c.inflight.pop(msg_id, None)
            if m is not None:
                settled.append(m)
                freed[c] = None
        self._settle_many(settled, out)   # in this order (#14)
        for c in freed:
            if cs.consumers.get(c.sub_id) is c:
                self._credit_returned(c, now, out)
        self._finish(now, out)
        return out

    def _on_nack(self, conn: str, f: Nack, now: float) -> list[Action]:
        c = self._consumer_or_raise(conn, f.sub)
        m = c.inflight.pop(f.msg, None)
        if m is None:
            raise RemoteError(f"message {f.msg!r} is not in flight on {f.sub!r}",
                              code="no_such_message")
        if c.peer is not None:
            c.cs.forwarded.pop(m.id, None)
        out: list[Action] = []
        d = self._dests.get(m.dst)
        if d is not None:
            d.inflight -= 1
            exhausted = m.redelivered >= self.max_redeliveries
            if d.topic:
                # Topic copies are shared between subscribers: redeliver a private copy.
                if exhausted:
                    self._count_drop("max_redeliveries", m.id, d.name, out)
                    self._dead_letter(m, "max_redeliveries", now, out)
                else:
                    if c.backlog is None:
                        c.backlog = deque()
                    c.backlog.appendleft(replace(m, redelivered=m.redelivered + 1))
                    self._mem += msg_size(m)
            elif exhausted:
                self._discard(d, m, "max_redeliveries", out, dlq=d.name != self.dlq, now=now)
            else:
                m.redelivered += 1
                self._requeue_front(d, [m])
                self._drain(d, now, out)
        self._credit_returned(c, now, out)
        self._finish(now, out)
        return out

    def _consumer_or_raise(self, conn: str, sub_id: str) -> Consumer:
        cs = self._conns.get(conn)
        c = cs.consumers.get(sub_id) if cs is not None else None
        if c is None:
            raise RemoteError(f"no subscription {sub_id!r} on this connection",
                              code="no_such_subscription")
        return c

    # ------------------------------------------------------------------ pending, expiry, DLQ

    def _rest(self, d: Dest, m: Message, now: float) -> None:
        """``m`` found no consumer that could ever take it here: it may go back along
        its path — at once to demand, after ``replay_delay`` to a fallback (parent)."""
        m.rested = True
        delay = self.replay_delay
        if delay > 0:
            m.replay_at = now + delay
            # one timer per destination and quarter second, however many messages rest
            when = math.ceil(m.replay_at * 4) / 4
            if when > d.replay_timer:
                d.replay_timer = when
                heapq.heappush(self._replays, (when, next(self._seq), d))

    def _push_pending(self, d: Dest, m: Message) -> None:
        pending = d.pending
        if not pending:
            self._waiting[d] = None
            if pending is NO_PENDING:
                pending = d.pending = deque()
            pending.append(m)
        elif pending[-1].timestamp <= m.timestamp or self.broker_id not in m.path:
            pending.append(m)
        else:
            # A message that left this broker came back (tree replay after an outage or
            # restart) while newer ones waited here: put it back where it was, so each
            # producer's messages stay in order.  Only returning messages pay this walk.
            i = len(pending)
            for newer in reversed(pending):
                if newer.timestamp <= m.timestamp:
                    break
                i -= 1
            pending.insert(i, m)
        if m.expires:
            self._track_expiry(d, m)

    def _requeue_front(self, d: Dest, msgs: list[Message]) -> None:
        if not d.pending:
            self._waiting[d] = None
            if d.pending is NO_PENDING:
                d.pending = deque()
        d.pending.extendleft(reversed(msgs))
        for m in msgs:
            if m.expires:
                self._track_expiry(d, m)

    def _track_expiry(self, d: Dest, m: Message) -> None:
        d.expiring += 1
        self._expiring += 1
        if m.expires < d.next_expiry:
            d.next_expiry = m.expires
        heap = self._timers
        heapq.heappush(heap, (m.expires, next(self._seq), d))
        if len(heap) > 2 * self._expiring + 4096:
            self._compact_timers()

    def _compact_timers(self) -> None:
        # Entries of messages that left pending stay until they surface; with long ttls
        # and busy queues they would pile up, so rebuild from what is really pending.
        seq = self._seq
        heap = [(m.expires, next(seq), d) for d in self._waiting for m in d.pending
                if m.expires]
        heapq.heapify(heap)
        self._timers = heap

    def _left_pending(self, d: Dest) -> None:
        """An expiring message left ``pending`` (not needed for ones without expiry)."""
        d.expiring -= 1
        self._expiring -= 1
        if not d.expiring:
            d.next_expiry = INF

    def _sweep(self, d: Dest, now: float, out: list) -> None:
        keep: deque[Message] = deque()
        expired: list[Message] = []
        nxt = INF
        for m in d.pending:
            e = m.expires
            if e and now >= e:
                expired.append(m)
            else:
                keep.append(m)
                if e and e < nxt:
                    nxt = e
        d.pending = keep
        d.expiring -= len(expired)
        self._expiring -= len(expired)
        d.next_expiry = nxt
        if not keep:
            self._waiting.pop(d, None)
        for m in expired:
            self._expire(d, m, now, out)

    def _expire(self, d: Dest, m: Message, now: float, out: list) -> None:
        to_dlq = d.policy.on_expiry == "dlq" and d.stored and d.name != self.dlq
        self._discard(d, m, "expired", out, dlq=to_dlq, now=now)

    def _discard(self, d: Dest, m: Message, reason: str, out: list, *, dlq: bool = False,
                 now: float = 0.0) -> None:
        """``m`` (already out of pending / in-flight) leaves queue ``d`` unconsumed."""
        self._dups.release(m.id)
        d.bytes -= msg_size(m)
        self._mem -= msg_size(m)
        if type(m.body) is Paged:
            self._paged -= len(m.body)
        if m.persistent and d.stored:
            out.append(DeleteMessage(m.id, d.name))
        self._count_drop(reason, m.id, d.name, out)
        if dlq:
            self._dead_letter(m, reason, now, out)
        if d.blocked:
            self._blocked.note_room(d)

    def _dead_letter(self, m: Message, reason: str, now: float, out: list) -> None:
        """A copy of ``m`` goes to the DLQ, headers telling why and where it was headed.
        The DLQ admits regardless of limits: dead letters must not block or vanish."""
        headers = dict(m.headers)
        headers["dlq_reason"] = reason
        headers["original_dst"] = m.dst
        dm = Message(m.id, self.dlq, headers, m.body, m.persistent, m.priority, m.timestamp,
                     0.0, m.reply_to, m.path, m.redelivered)
        dd = self._dests.get(self.dlq) or self._new_dest(self.dlq)
        dd.enqueued += 1
        dd.bytes += msg_size(dm)
        self._mem += msg_size(dm)
        self._dups.hold(dm.id)
        if dm.persistent and dd.stored:
            out.append(StoreMessage(dm))
        self._dead_lettered += 1
        self._dispatch_new(dd, dm, now, out)

    # ------------------------------------------------------------------ store cursor

    def page_in(self, dst: str, msgs: list[Message], cursor: int, exhausted: bool,
                now: float) -> list[Action]:
        """The shell's answer to ``PageIn``: ``msgs`` (oldest first) were read back from
        the store for queue ``dst``, the last at store seq ``cursor``; ``exhausted``: the
        store has no more rows of ``dst`` after them.  They join the page and go out."""
        out: list[Action] = []
        d = self._dests.get(dst)
        if d is None:
            return out
        d.spill_paging = False
        hold = self._dups.hold
        for m in msgs:
            size = msg_size(m)
            d.spilled -= 1
            d.spilled_bytes -= size
            self._mem += size
            hold(m.id)
            self._push_pending(d, m)
        if cursor:
            d.spill_cursor = cursor
        if d.spilled < 0 or (exhausted and d.spilled):
            # counted but not in the store (or the reverse): the store is the truth
            d.bytes -= d.spilled_bytes
            d.spilled = d.spilled_bytes = 0
        if not d.spilled:
            self._spilling.pop(d, None)
            d.spill_cursor = 0
            d.spilled_bytes = 0
            d.spill_first = None
        if d.pending:
            self._drain(d, now, out)
        self._finish(now, out)
        return out

    def _admit_on_close(self, cs: Conn, now: float, out: list) -> None:
        """``cs`` closed (a producer that flushed and said goodbye) while sends waited
        for room: the ones producer flow control held (already read, so already in
        memory) are taken over the queue's limit, in order, rather than lost; the first
        a destination policy blocks or refuses ends it (as before: discarded)."""
        parked = cs.parked
        self._blocked.leave(cs)
        self._closing_conn = cs
        try:
            for f in parked:
                if type(f) is not Send:
                    break
                try:
                    if not self._admit_send(cs, f, now, out):
                        break
                except TreefedError:
                    break
        finally:
            self._closing_conn = None

    @staticmethod
    def _waiting_bytes(d: Dest) -> int:
        """The bytes of ``d``'s messages waiting in memory for a consumer (the held
        bytes' share of them; what consumers were given is bounded by their prefetch)."""
        waiting = len(d.pending)
        return (d.bytes - d.spilled_bytes) * waiting // (waiting + d.inflight)

    def _may_pause(self, cs: Conn, d: Dest) -> bool:
        """Producer flow control (only while ``d`` has consumers: without one, messages
        wait up to ``max_memory_bytes`` as before) may pause ``cs`` for room at ``d``
        unless ``cs`` itself consumes from ``d``: paused, its acks would never make that
        room (nor one that is closing: ``_admit_on_close``)."""
        if cs is self._closing_conn:
            return False
        for c in d.consumers:
            if c.cs is cs:
                return False
        return True

    def _spill(self, d: Dest, m: Message) -> None:
        """``m`` (stored by this batch) waits in the store only: the core drops it, its
        id too -- a copy sent or forwarded again meanwhile is one row (the store's
        INSERT OR IGNORE on (id, dst)) and the page-in finds it once; the count it added
        is put right when the page-in reaches the end of the store (``page_in``)."""
        m.spilled = True
        self._dups.release(m.id)
        size = msg_size(m)
        if not d.spilled and not d.spill_cursor:
            d.spill_first = m.id   # the first page-in starts at its row
        d.spilled += 1
        d.spilled_bytes += size
        self._mem -= size
        self._spilling[d] = None

    def _unspill(self, d: Dest, m: Message) -> None:
        """Spilled ``m`` was not stored after all (``withdraw``): back on the books, which
        the caller then takes it off."""
        size = msg_size(m)
        d.spilled -= 1
        d.spilled_bytes -= size
        self._mem += size
        if not d.spilled:
            self._spilling.pop(d, None)
            d.spill_cursor = 0
            d.spill_first = None

    def _refill(self, out: list) -> None:
        """Ask the shell for the next page of each queue whose page ran low and that has
        consumers (one PageIn out per queue at a time)."""
        low = (self.page_size + 1) // 2
        dead = None
        for d in self._spilling:   # called after every input: the common case is a look
            if d.spill_paging or len(d.pending) >= low or not d.consumers:
                continue
            if not d.alive:
                dead = [d] if dead is None else dead + [d]
                continue
            exclude: frozenset = frozenset()
            if not d.spill_cursor:
                # the first page of a spell: the rows before the first spilled one are
                # messages still held in memory (waiting or in flight) -- leave them out
                ids = [m.id for m in d.pending]
                name = d.name
                for c in d.consumers:
                    ids.extend(i for i, m in c.inflight.items() if m.dst == name)
                exclude = frozenset(ids)
            d.spill_paging = True
            out.append(PageIn(d.name, self.page_size - len(d.pending), d.spill_cursor,
                              exclude, None if d.spill_cursor else d.spill_first))
        if dead is not None:
            for d in dead:
                self._spilling.pop(d, None)

    def _count_drop(self, reason: str, msg_id: str, dst: str, out: list) -> None:
        self._dropped[reason] = self._dropped.get(reason, 0) + 1
        if self.log_messages:
            out.append(Log("message.dropped", {"msg": msg_id, "dst": dst, "reason": reason}))

    # ------------------------------------------------------------------ small handlers

    def _on_subscribe(self, conn: str, f: Subscribe, now: float) -> list[Action]:
        if not f.id:
            raise RemoteError("subscription id must not be empty", code="bad_frame")
        out = self.add_consumer(conn, f.id, f.dst, now, selector=f.selector,
                                prefetch=f.prefetch, priority=f.priority)
        out.insert(0, Out(conn, Receipt(f.id)))   # before any Deliver for it
        return out

    def _on_unsubscribe(self, conn: str, f: Unsubscribe, now: float) -> list[Action]:
        out = self.remove_consumer(conn, f.id, now)
        out.insert(0, Out(conn, Receipt(f.id)))
        return out

    def _on_ping(self, conn: str, f: Ping, now: float) -> list[Action]:
        return [Out(conn, Pong(f.token))]


def _ref(frame: Any) -> str | None:
    """The request id an Error refers to: the frame's id, or the message id of an ack."""
    ref = getattr(frame, "id", None)
    if ref is None:
        ref = getattr(frame, "msg", None)
    return ref
