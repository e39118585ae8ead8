"""BrokerNode: the trio shell that runs one site's broker around a pure ``federation.Site``.

Theory of operation
-------------------
Actor shape.  ONE site task owns the Site (and through it the core Broker); nothing else
ever calls into them but a reader standing in for it while it is idle ("Inline batches"
below), under the same batch lock.  Every connection — client or broker link, accepted or
dialed —
has a reader task and a writer task:

* the reader takes every complete frame of each received chunk (``FramedStream``) and
  pushes ``(conn, frames)`` into one bounded memory channel, the *inbox*; a full inbox
  stops the readers, so TCP pushes back on producers instead of memory growing;
* the writer sleeps until its connection's outgoing list is non-empty, then encodes the
  whole list and writes it with ONE ``send_all``.  After a batch the site task first
  tries to write each list itself (``FramedStream.send_now``: plain TCP, writer idle,
  the socket takes it at once), so a lone receipt costs no writer wake-up (issue #14);
  the writer sends whatever that could not.

The site task awaits the inbox once, then takes whatever else is already there without
waiting — that is the *batch*.  It feeds each frame to the Site and performs the returned
actions with the batching guarantee of ``core/actions.py``: all StoreMessage /
DeleteMessage of the batch go to the store in ONE ``store.apply`` (group commit; in a
worker thread, or on this task while commits are fast, ``INLINE_COMMIT_S``, or small,
``INLINE_SMALL_ROWS`` while no disk stall, ``INLINE_SMALL_COMMIT_S``), and only afterwards
are the batch's Outs and Closes queued to writers, so a Receipt always means "committed"
(or "consumed": a batch whose stored messages all go to local client consumers has their
Delivers written first and may hold its commit for their acks, ``EARLY_PROBE_S``).
The ids of ``DeleteMessage(consumed=True)`` (a local consumer's ack) ride in the same
transaction (``apply(..., consumed=)``) and ``restore`` hands ``store.load_consumed()``
back to the broker, so a copy re-forwarded after a restart is still a duplicate.  While a
commit runs, new input piles up in the inbox and becomes the next, larger batch.  Timers
(expiry) run in the same task at ``site.next_deadline()``.

Inline batches (issue #14).  When the site task waits on an empty inbox, the batch lock
is free, no batch ended within ``INLINE_GAP_S`` and the chunk is small
(``INLINE_MAX_FRAMES``: not a pipelining client's flood), a reader handles its chunk itself as
a one-chunk batch under the batch lock (``_inline_batch``): a lone synchronous send costs
no task hand-off — the reader decodes, the Site handles, the store commits and the receipt
is written, in one task step.  The lock keeps batches serial, so "one owner at a time" and
per-connection order hold (the site task waits on the inbox only after handling all it
took).  Chunks that arrive together (several readers woken by one poll) fall within the
gap and go to the site task, which groups them into one commit — and from then on, for
``CROWDED_S`` (renewed while chunks keep arriving together or finding the site task busy),
every chunk goes to the site task, so concurrent senders keep the group commit they had.
The inline batch brings the site task's timer wait forward when it made an earlier
deadline (and leaves it alone when the deadline did not change).  It enters no cancel
scope of its own: every await inside a batch is ``in_thread`` (node/threads.py), which
cannot be cancelled, so closing the connection (which cancels its reader) cannot cut a
batch half-way — the cancellation lands at the reader's next read (issue #14, session 7: a
shield scope and a timer write per lone send were ~70 of its ~300 Python calls).

Invariants:

* The site task never blocks on a peer: queueing an Out is a list append.  A connection
  whose queue passes its high-water mark (a consumer that stopped reading) is closed with
  an ``overflow`` error instead of buffering without bound.
* The first frame on every connection must be a Hello of our protocol version; anything
  else gets an Error frame and that connection — only that one — is closed.  So does
  malformed input (the decoder's FrameError).  Closing flushes the queue, half-closes,
  and drains what the peer still sends for a moment, so the Error frame is not lost to a
  TCP reset.
* A broker link is identified ``L:<link>:<peer>`` once its hello names the peer; a
  client is ``c<n>``.  The Site learns of a connection only after its hello
  (``client_connected`` / ``link_up``) and forgets it exactly once (``client_closed`` /
  ``link_down``).
* Liveness: a connection has ``[broker] hello_timeout`` to say hello; with
  ``heartbeat_interval`` set, idle connections are pinged and one that leaves a ping
  unanswered for an interval is torn down.  Dialed links reconnect with the back-off of
  their URI (``static:`` defaults for a bare ``tcp://``), jittered, and show their state
  (waiting / connecting / operational / failed) and last error in ``statistics()``.
* Only this package sleeps: back-off, heartbeats, lingering closes, the expiry timer.
  ``now`` handed to the Site is epoch seconds (``time.time()``).

Faults (issue #7).  A full store (``max_store_bytes`` or the disk) never stops the
broker: the failed batch's messages are withdrawn from the core (their Deliver/Forward
frames are not sent, receipts become ``store_full`` errors, a link that forwarded one is
closed unacked so the peer keeps its copy), the batch's deletes are committed alone, and
persistent input is refused at the door until the store says it has ``room()`` again
(issue #12, defect 4: checked every ``SPACE_PROBE`` seconds while refusing, and at
start-up, so space freed by acks *or* by the operator reopens the door, also after a
restart).  Deletes never wait for room: the store spends its reserve on them, and a
batch of deletes it still could not commit is retried with the next commit, so an acked
message is not delivered again.  A connection
found dead by heartbeats is cut off at once (a half-open socket never drains); its
connector shows ``waiting`` and why.  Client hellos announce ``heartbeat_interval`` so
clients watch the broker too.  Master/slave waiting happens before the node exists
(``run.py``).

Security (``[security]``, issue #8).  ``ssl://`` listeners handshake before a connection
exists (``transport.tls.serve_tls``); ``ssl://`` connectors dial with the client context
and send the connector's credentials in their hello.  With authentication on, an
accepted connection's reader authenticates its hello *before* the site task sees it: the
scrypt check runs in a worker thread (a few at a time), so a login never stalls the
broker; attempts are serialised per source address and per user name, wait what earlier
failures still owe before the check and are locked out after N failures
(``node/login.py``, issue #12 defect 10); a failure is logged without the password, gets
``Error(auth_failed)`` and is closed.  Connections that authenticated to us get a
``security.Guard`` that screens each frame (subscribe, send, stat, advisory, forward)
before the Site, against permissions and, on tree child links, the child's scope.
Links we dialed are not screened: we chose the peer, and TLS verified it.

Memory (issue #12, defect 8).  The inbox is bounded in message-body bytes too
(``INBOX_BYTES``): readers wait while it is over, so a flood of big messages waits in the
sockets.  A client with more than ``max_pending_bytes_per_connection`` queued to it is
closed (``overflow``).  The core caps held message bytes (``max_memory_bytes``); with the
SQLite store, waiting persistent bodies are paged out after a commit and read back here
(``_page_in``) before the batch that sends them commits.

Containment (issue #12).  No exception raised while handling one connection's frames
ends the process: that connection gets ``internal_error`` and is closed, the failure is
logged with its traceback (``conn.failed``), the frames before it still count.  A store
failure other than "full" is retried message by message, so only the message the store
cannot take is refused.  A client's Send id gets its producer scope appended here
(``wire/ids.py``); Receipts and refusals to clients name the client's own id.  ``stat``
answers one page (``stat_pages.py``) that fits a frame.

Garbage collection.  Messages, frames and actions are freed by reference counting; the
cyclic collector finds little.  But with its default young threshold (700 allocations)
it runs every couple of hundred messages, and its older generations then rescan every
message a broker holds: at 50,000 pending that is about 2 µs a message, a fifth of the
broker's CPU.  ``serve`` raises the young threshold to ``GC_YOUNG_THRESHOLD`` (process
wide, never lowered), which leaves the collector's cost near 0.5 µs a message.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import math
import random
import secrets
import time
from collections.abc import Awaitable, Callable
from operator import attrgetter
from typing import Any

import trio

from treefed.config import BrokerConfig
from treefed.core.actions import Close, DeleteMessage, Drop, Log, Out, Pause, Resume, \
    StoreMessage
from treefed.core.actions import PageIn
from treefed.core.broker import Broker
from treefed.core.paging import paged_key
from treefed.errors import FrameError, RemoteError, StoreError, TreefedError
from treefed.federation.settings import LinkSettings
from treefed.federation.drops import SUMMARY_EVENT, DropDigest
from treefed.federation.handshake import listener_settings
from treefed.federation.sharing import Sharing
from treefed.federation.site import Site
from treefed.log import get_logger
from treefed.persistence import MemoryStore
from treefed.node.acksync import HELD_SYNC_NOW, AckSyncer
from treefed.node.threads import in_thread
from treefed.node.gcwatch import statistics as gc_statistics
from treefed.node.login import LoginGate
from treefed.security.guard import Guard
from treefed.transport.backoff import backoff_for
from treefed.transport.framed import FramedStream
from treefed.transport.idlepoll import IdlePoller
from treefed.node.late_writer import ConnTasks, LateStart, LateWriter
from treefed.transport.memory import FrameEnd, aclose_forcefully
from treefed.transport.streams import connect_with_retry, open_tcp, peer_address, serve_tcp
from treefed.transport.tls import peer_identity, serve_tls
from treefed.transport.uri import Endpoint, Failover, Static, parse_uri
from treefed.node import stat_pages
from treefed.security.guard import STAT_REF
from treefed.wire.codec import check_hello, encode
from treefed.wire.ids import SCOPE_SEP, destination_scope, original, producer_scope
from treefed.wire.frames import (PROTOCOL_VERSION, Admin, Bye, Deliver, Error, Forward,
                                 ForwardAck, Hello, Ping, Pong, Receipt, Send, StatReply,
                                 StatRequest)

__all__ = ["BrokerNode", "Dialer", "CLIENT_HIGH_WATER", "LINK_HIGH_WATER",
           "GC_YOUNG_THRESHOLD"]

#: Outgoing frames a connection may have queued before it is closed as too slow.  A
#: well-behaved consumer never gets near: prefetch credit bounds its deliveries.
CLIENT_HIGH_WATER = 50_000
LINK_HIGH_WATER = 200_000
#: Inbox capacity in reader pushes (each push is one received chunk's frames).
INBOX_SIZE = 256
#: Message body bytes the inbox may hold (read, not yet handled): past it the readers
#: wait, so a flood of big messages stays in the sockets (TCP pushes back), not in RAM
#: (issue #12, defect 8).  One chunk may pass it (a frame is read whole).
INBOX_BYTES = 16 * 1024 * 1024
#: Most inbox items folded into one batch, so one huge burst cannot starve the timers.
MAX_BATCH = 512
#: Seconds a closing connection may take to flush and to be closed by its peer.
LINGER = 2.0
#: Seconds per window of the refused-advisory digest (``federation/drops.py``).
DROP_LOG_INTERVAL = 10.0
#: Events written once per advisory frame: debug level in a broker's own log (a deployed
#: broker's info log must not grow with a peer's advisory rate; engines get them all).
_PER_ADVISORY = frozenset(("advisory.sent", "advisory.received"))
#: +/- fraction applied to reconnect delays of dialed links.
RECONNECT_JITTER = 0.1
#: Allocations between young collections of the cyclic GC while a broker serves
#: (Python's default is 700; see "Garbage collection" above).
GC_YOUNG_THRESHOLD = 10_000
#: Password checks (scrypt: ~16 MiB and ~0.1 s each) running at once, so a flood of
#: logins costs bounded memory and leaves CPU for the traffic.
AUTH_THREADS = 4
#: Accepted links remembered after they went down (``lost_links``), oldest dropped first.
LOST_LINKS = 10_000
#: A batch's commit runs on the site task itself, not in a worker thread, while commits
#: have been taking less than this (moving average, seconds) and the batch is small: a
#: fast disk's fsync costs less than waking a worker thread and coming back (issue #14).
#: One slow commit (a disk stall) sends the next ones back to the thread.
INLINE_COMMIT_S = 0.0003
INLINE_MAX_ROWS = 64
#: A commit of at most ``INLINE_SMALL_ROWS`` rows (stored messages + deletes: one
#: synchronous send, perhaps with one consumer's ack) runs on the site task while commits
#: take less than this on average, however slow the fsync: batches are serial anyway (the
#: batch lock), so running it in a thread frees the loop only for socket reads and writes,
#: and the hand-off itself -- waking a worker, and its wake-up of the loop -- cost more
#: CPU than that saved on a disk whose fsync takes a few hundred µs (issue #14, session
#: 10: ~250 µs of the broker's CPU per lone synchronous send).  A disk stall (an average
#: past this) still sends every commit back to the thread.
INLINE_SMALL_COMMIT_S = 0.002
INLINE_SMALL_ROWS = 2
#: A reader runs its chunk as a batch itself only when no batch ended within this many
#: seconds: chunks that arrive together (several readers woken by one poll) go to the
#: site task and share one commit (group commit), while a lone sender's next message,
#: a round trip after its receipt, costs no task hand-off (issue #14).
INLINE_GAP_S = 0.00004
#: A chunk of more frames than this (a pipelining client) goes to the site task, which
#: groups it with what the other readers bring (one commit, acks included).
INLINE_MAX_FRAMES = 8
#: A link's ForwardAcks are held up to this many seconds (or ``ACK_HOLD_IDS`` ids) and
#: go in one frame (issue #14): every ForwardAck frame wakes the broker it goes to, and at
#: 1,000 msgs/s one frame per message made each hop wake twice per message (the Forward,
#: then its ack) — on 2 cores the upstream's ack wake-up takes the core the message's
#: next hop needs.  Held ids leave at once with any other frame for that connection,
#: at a batch that finds them due, or at the site task's timer; never before the commit
#: (they are taken after it, as before).  A lost ack is a re-forward the receiver drops
#: as a duplicate, as before: holding only widens that window by this much.
ACK_HOLD_S = 0.005
ACK_HOLD_IDS = 256
#: Once chunks were seen arriving together (within ``INLINE_GAP_S`` of a batch's end, or
#: while the site task was busy), every chunk goes to the site task for this many seconds
#: (renewed while it goes on): concurrent senders keep their group commit.
CROWDED_S = 0.01
#: Concurrent store and dispatch (issue #14, session 11).  A batch whose every stored
#: message goes to a local client consumer (a synchronous producer's send, say) has those
#: Delivers written at once, before the commit, and its commit held for that consumer's
#: ack: an ack that comes in time takes the message's insert and delete out of the
#: transaction together, so a message consumed at once never touches the disk and its
#: receipt says "consumed" instead of "committed" -- what ActiveMQ's
#: concurrentStoreAndDispatchQueues does.  The held batch is committed, whatever is left
#: of it, with the next batch or at its deadline, ``EARLY_HOLD_FACTOR`` insert-commit times
#: (a moving average; trio's timer rounds it up to a millisecond).  Its other Outs (the
#: receipts) stay behind the commit, so a receipt means "committed or consumed".  Batches
#: are held while the acks' own delay (a moving average) is under that deadline: where a
#: consumer's ack takes about as long as a commit (a loopback round trip through two
#: Python processes against one fsync), waiting for it costs no latency and saves the
#: insert, the delete and a quarter of the broker's CPU.  A consumer whose acks come
#: later is not waited for; one held batch per ``EARLY_PROBE_S`` tries again.
EARLY_PROBE_S = 1.0
EARLY_HOLD_FACTOR = 2.0
#: Held messages committed before their acks came are remembered (the newest this many)
#: until those acks come: the delay the acks really took feeds the acks' average.
LATE_ACKS_MAX = 256
#: The ids of messages consumed before their commit are remembered as consumed (duplicate
#: detection after a restart, as every consumed id) in the next commit, or on their own
#: this many seconds after the first of them, or once ``CONSUMED_LATER_IDS`` wait: a
#: transaction of its own per message cost more broker CPU than the commit saved.  Such a
#: commit has no fsync anyway (ack-only, ``ack_sync``).
CONSUMED_LATER_S = 0.01
CONSUMED_LATER_IDS = 256

_EOF = object()          # inbox marker: the peer closed or the socket broke
_PENDING, _CLIENT, _LINK = "pending", "client", "link"
_SOCKET_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
#: destinations whose persistent messages are never stored (no store_full refusal)
_UNSTORED = ("topic://", "temp-")
#: seconds between ``store.room()`` checks while persistent input is refused
SPACE_PROBE = 0.5
_STORE_FULL = StoreError("the message store is full (max_store_bytes or the disk): "
                         "persistent message refused, retry later", code="store_full")


#: the frame types of a chunk that ``_handle_frames`` hands over as one run of forwards
_ONLY_FORWARDS = {Forward}


#: the frame types of a chunk whose bodies ``_body_bytes`` sums without a loop
_ONLY_SENDS = {Send}
_BODY = attrgetter("body")


def _scope_ids(c: Any, sends: Any) -> None:
    """Each Send's id becomes its producer's own on its destination: no one can squat it,
    and the same id elsewhere is another message (wire/ids.py).  ``c``: the client's
    ``_Conn``; its scope cache holds at most 4,096 destinations."""
    scopes = c.scopes
    for frame in sends:
        scope = scopes.get(frame.dst)
        if scope is None:
            if len(scopes) >= 4096:
                scopes.clear()
            scope = scopes[frame.dst] = destination_scope(c.producer, frame.dst)
        frame.id = f"{frame.id}{SCOPE_SEP}{scope}"


def _body_bytes(frames: list) -> int:
    """Message body bytes in one received chunk (Send / Forward frames)."""
    kinds = set(map(type, frames))
    if kinds == _ONLY_FORWARDS or kinds == _ONLY_SENDS:
        # a decoded frame's body is bytes: summed without a bytecode per frame (#14)
        return sum(map(len, map(_BODY, frames)))
    n = 0
    for f in frames:
        kind = type(f)
        if kind is Send or kind is Forward:
            body = f.body
            if type(body) is bytes:
                n += len(body)
    return n


def _client_ids(fields: dict) -> dict:
    """Message events name a message by its producer's id (scope stripped), as the
    producer and consumers know it."""
    msg = fields.get("msg")
    if type(msg) is str and SCOPE_SEP in msg:
        fields = {**fields, "msg": original(msg)}
    return fields


def _client_log(a: Log) -> Log:
    """``a`` with its message named as ``_client_ids`` names it.  Changed in place: the
    core makes a message event's fields for that one Log, and the shell is their last
    reader (no new Log and dict per event, issue #14)."""
    fields = a.fields
    msg = fields.get("msg")
    if type(msg) is str and SCOPE_SEP in msg:
        fields["msg"] = msg.rpartition(SCOPE_SEP)[0]   # wire.ids.original, inlined
    return a


#: frames answering a client's request by its id (the id the client chose is shown)
_ANSWERS = frozenset((Receipt, Error))


def _unscoped(frame: Any) -> Any:
    if type(frame) is Receipt:
        return Receipt(original(frame.id)) if SCOPE_SEP in frame.id else frame
    if frame.ref is not None and SCOPE_SEP in frame.ref:
        return Error(frame.code, frame.message, original(frame.ref))
    return frame


def _forwards_only(stores: list, deferred: list) -> bool:
    """Every message the batch stores came in a Forward it acks, and it answers no
    client's send: such a commit may skip its fsync while the ForwardAcks wait for one
    (issue #14, "Forwards synced in groups")."""
    acked: set = set()
    for a in deferred:
        if type(a) is Out:
            kind = type(a.frame)
            if kind is Receipt:
                return False
            if kind is ForwardAck:
                acked.update(a.frame.ids)
    return all(m.id in acked for m in stores)


@dataclasses.dataclass(slots=True)
class _Early:
    """A batch whose Delivers left before its commit, held for its consumers' acks
    (``EARLY_PROBE_S``): the store work and the Outs still to come, when it was held
    (``perf_counter``) and when it must be committed at the latest (epoch seconds)."""

    stores: list
    deletes: list
    consumed: list
    deferred: list
    at: float
    due: float


def _early_delivers(stores: list, deferred: list, conns: dict) -> tuple[list, list] | None:
    """Split a batch's Outs into the Delivers of its stored messages to local client
    consumers and the rest, or None when the batch is not one to deliver before its
    commit: it stores a message that no local client gets, or answers anything but with
    a Receipt or a Deliver (a forward, a link's ack, a close) -- or one of those
    Delivers would overtake an Out the core queued before it to the same connection
    (each connection gets its frames in the core's order: a consumer re-subscribing in
    the batch that brings the next message must get the queue's older message first)."""
    ids = {m.id for m in stores}
    early: list = []
    rest: list = []
    later: set = set()   # connections with an Out kept for after the commit
    for a in deferred:
        if type(a) is not Out:
            return None
        kind = type(a.frame)
        if kind is Deliver and a.frame.msg in ids:
            c = conns.get(a.conn)
            if c is None or c.kind is not _CLIENT or a.conn in later:
                return None
            early.append(a)
        elif kind is Receipt or kind is Deliver:
            rest.append(a)
            later.add(a.conn)
        else:
            return None
    if len({a.frame.msg for a in early}) != len(ids):
        return None
    return early, rest


class _Conn:
    """One connection's shell-side state.  ``out`` is only appended to by the site task
    (and heartbeats); the writer swaps it for a fresh list when it wakes."""

    __slots__ = ("id", "kind", "framed", "out", "wake", "high_water", "paused", "resume",
                 "closing", "dead", "writer_done", "hello", "dialer", "peer",
                 "remote", "opened", "last_rx", "pinged", "user", "guard", "scope", "rtt",
                 "out_bytes", "producer", "scopes", "acks", "acks_at")

    def __init__(self, conn_id: str, framed: FramedStream, remote: str,
                 dialer: Dialer | None) -> None:
        self.id = conn_id
        self.kind = _PENDING
        self.framed = framed
        self.out: list = []                 # frames waiting for the writer
        self.out_bytes = 0                  # message bodies in ``out`` (clients only)
        self.wake = trio.Event()            # set when out gained frames or closing began
        self.high_water = CLIENT_HIGH_WATER
        self.paused = False                 # producer flow control: reader holds off
        self.resume = trio.Event()
        self.closing = False                # flush, half-close, then end
        self.dead = False                   # the Site has forgotten it
        self.writer_done = trio.Event()
        self.hello: Hello | None = None     # the peer's hello
        self.dialer = dialer                # set on links we dialed
        self.peer: str | None = None        # broker id of a link's peer
        self.remote = remote                # "host:port" of the peer, for stat
        self.opened = time.time()
        self.last_rx = trio.current_time()  # heartbeats: when we last heard from it
        self.pinged: float | None = None    # heartbeats: when we last pinged it
        self.user: str | None = None        # who authenticated (None: nobody / auth off)
        self.guard: Guard | None = None     # frame screen; None = nothing to check
        self.scope: trio.CancelScope | None = None  # its tasks: a dead peer is cut off
        #                                     at once (a half-open socket never drains)
        self.rtt: float | None = None       # seconds from our last ping to its pong
        self.producer: str | None = None    # a client's producer scope: appended to the
        #                                     ids it sends (wire/ids.py, issue #12)
        self.scopes: dict[str, str] = {}    # destination text -> its scope (a cache)
        self.acks: list = []                # ForwardAck ids held (ACK_HOLD_S)
        self.acks_at = 0.0                  # epoch seconds when the first was held

    def queue(self, frame: Any) -> None:
        self.out.append(frame)
        self.wake.set()


@dataclasses.dataclass(eq=False)
class Dialer:
    """One outgoing broker link (a tree connector, or one endpoint of a network
    connector) and what ``stat`` shows about it."""

    settings: LinkSettings
    target: Failover | Static       # with the reconnect options the link uses
    uri: str
    state: str = "waiting"          # waiting | connecting | operational | failed (as
    #                                 qpid-route shows links): failed = gave up
    endpoint: str | None = None     # where the current/last attempt went
    peer: str | None = None
    conn: str | None = None
    attempts: int = 0
    connects: int = 0
    last_error: str | None = None
    username: str | None = None     # credentials for our hello (None: none / certificate)
    password: str | None = None
    removed: bool = False           # an operator deleted it: stop dialing (node/admin.py)
    scope: Any = None               # cancels its dial loop while it waits to reconnect

    def status(self) -> dict:
        return {"connector": self.settings.kind, "name": self.settings.name,
                "uri": self.uri, "state": self.state, "endpoint": self.endpoint,
                "peer": self.peer, "conn": self.conn, "attempts": self.attempts,
                "connects": self.connects, "last_error": self.last_error}


def _producer_scope(hello: Hello, user: str | None) -> str:
    """A client's producer scope: from the secret key its hello carries (stable across
    its reconnects, so a resend after failover is still a duplicate), else random."""
    key = hello.options.get("producer_key")
    if type(key) is not str or not 16 <= len(key) <= 256:
        key = secrets.token_urlsafe(16)
    return producer_scope(key, user)


def _dial_targets(uri: str, key: str) -> list[tuple[Failover | Static, str]]:
    """A connector URI -> (reconnecting target, what stat calls it) per link.  ``static:``
    lists become one link per endpoint (as in ActiveMQ); a bare endpoint reconnects with
    the static agent's defaults, since a broker link must come back after its peer
    restarts."""
    target = parse_uri(uri, key=key)
    if isinstance(target, Endpoint):
        return [(Static((target,)), uri)]
    if isinstance(target, Static):
        return [(dataclasses.replace(target, endpoints=(ep,)), str(ep))
                for ep in target.endpoints]
    return [(target, uri)]


class BrokerNode:
    """One site's broker: listeners, dialed links, the site task (see module doc)."""

    def __init__(self, config: BrokerConfig, *, store: Any = None,
                 rng: random.Random | None = None,
                 event_sink: Callable[[str, dict], None] | None = None,
                 open_stream: Callable[[Endpoint], Awaitable[trio.abc.Stream]] | None = None,
                 sharing: Sharing | None = None,
                 event_logs: Callable[[list], None] | None = None) -> None:
        # Hooks for the scenario engines (scenario/engines/live.py): ``event_sink(event,
        # fields)`` receives every Log action instead of structlog; ``open_stream(endpoint)``
        # dials broker links instead of TCP (in-memory links, cut links).  ``event_logs(logs)``,
        # if given, takes the place of ``event_sink``: the Log actions of one step at once,
        # in order, refused advisories as their Log, message ids unscoped (issue #14).
        self._event_sink = event_sink
        self._event_logs = event_logs
        self._open_stream = open_stream
        b = config.broker
        self.config = config
        self.broker_id = b.id
        self.store = store if store is not None else MemoryStore()
        self._threaded_store = not isinstance(self.store, MemoryStore)
        tc = config.tree_connector
        broker = Broker(b.id, config.policy_set(), max_redeliveries=b.max_redeliveries,
                        dlq=b.dlq, log_messages=config.logging.message_events,
                        replay_delay=tc.replay_delay if tc is not None else 0.0,
                        max_subscriptions_per_conn=b.max_subscriptions_per_connection,
                        max_inflight_per_conn=b.max_inflight_per_connection,
                        max_memory_bytes=b.max_memory_bytes,
                        idle_destination_seconds=b.idle_destination_seconds)
        # persistent bodies may leave memory when the store can read them back (defect 8)
        self._pageable = bool(b.max_memory_bytes) and self._threaded_store \
            and hasattr(self.store, "load_bodies")
        broker.pageable = self._pageable
        if self._threaded_store and hasattr(self.store, "load_page"):
            broker.page_size = b.max_page_messages   # the store cursor (core/broker.py)
        broker.queue_memory_bytes = b.max_queue_memory_bytes   # producer flow control
        tree = config.tree_connector.tree_settings() if config.tree_connector else None
        self.site = Site(b.id, broker=broker, tree=tree,
                         accept_tree_children=b.accept_tree_children, log_advisories=True,
                         sharing=sharing)   # an engine's Sites may share these tables
        self.log = get_logger(broker=b.id)
        # refused advisories: first per (link, reason) and interval at info, the rest
        # counted into one summary line (a hostile peer cannot flood the log)
        self._drops = DropDigest(DROP_LOG_INTERVAL)
        self._message_events = config.logging.message_events
        self._advisory_events = config.logging.advisory_events
        self._rng = rng or random.Random()
        self._conns: dict[str, _Conn] = {}
        self._next_conn = 0
        self._inbox_send, self._inbox = trio.open_memory_channel[tuple](INBOX_SIZE)
        self._inbox_bytes = 0               # message body bytes in the inbox
        self._inbox_room = trio.Event()     # set when they fell below INBOX_BYTES
        self.addresses: list[tuple[str, int]] = []
        self._schemes: list[str] = []   # per address: "tcp" or "ssl"
        self.dialers: list[Dialer] = []
        for settings, uri, key, (user, password) in self._connectors():
            for target, name in _dial_targets(uri, key):
                self.dialers.append(Dialer(settings, target, name, username=user or None,
                                           password=password or None))
        # security: contexts are built (files read) now, so a bad path fails at start
        sec = config.security
        self._auth = sec.authenticator() if sec.authentication else None
        self._login = LoginGate(self._auth, AUTH_THREADS) if self._auth is not None else None
        self._authz = sec.authorizer()
        self._tree_scope = sec.tree.tree_scope(temp_destinations=sec.temp_destinations)
        self._server_ssl = (sec.tls.server_context()
                            if any(u.lower().startswith(("ssl:", "stomp+ssl:"))
                                   for u in b.listen) else None)
        self._client_ssl = (sec.tls.client_context()
                            if any(e.scheme == "ssl" for d in self.dialers
                                   for e in d.target.endpoints) else None)
        self._stopping = False
        self._stopped = trio.Event()
        self._batch_lock = trio.Lock()  # held while a batch is handled and committed
        self._batch_end = 0.0       # perf_counter() when the last batch ended
        self._crowded = 0.0         # perf_counter() until which chunks go to the site task
        self._held: dict = {}       # connections holding ForwardAck ids (ACK_HOLD_S)
        self._site_wait: trio.CancelScope | None = None  # the site task's idle wait
        self._site_due: float | None = None   # the deadline that wait was set for
        self.batches = 0            # site-task batches handled (stat, tests)
        self.commits = 0            # store transactions
        self.store_full = False     # the last commit found the store full: persistent
        #                             sends are refused at the door until store.room()
        self._space_wanted = trio.Event()   # set with store_full: wakes _watch_space
        self._unsaved: tuple[list, list] = ([], [])  # deletes/consumed a full store refused
        # ack-only commits are fsynced within ACK_SYNC_S, off the receipt path (#14)
        self._ack_syncer = (AckSyncer(self.store, self.log, on_synced=self._release_held)
                            if getattr(self.store, "deferred_sync", False) else None)
        # [broker] idle_poll_us: poll after reads instead of sleeping (opt-in, #14)
        self._poller = (IdlePoller(config.broker.idle_poll_us)
                        if config.broker.idle_poll_us else None)
        # received forwards are committed without an fsync and their ForwardAcks held
        # until the syncer's group fsync covers them (#14, "Forwards synced in groups")
        self._group_forwards = self._ack_syncer is not None
        self._sync_held: list = []  # (stores mark, conn, ForwardAck) waiting for an fsync
        self._sync_held_ids = 0     # message ids in ``_sync_held``
        self.commit_seconds = 1.0   # moving average of commit durations (starts "slow")
        self.inline_commits = 0     # commits run on the site task (stat, tests)
        # concurrent store and dispatch (EARLY_PROBE_S): the batch held for its acks,
        # the acks' moving delay, an insert commit's moving time, the last held batch
        self._early: _Early | None = None
        self._ack_wait = 0.0
        self._late_acks: dict = {}  # id -> when held, of held messages committed unacked
        self._insert_seconds = INLINE_SMALL_COMMIT_S
        self._early_probe = 0.0
        self.early_held = 0         # batches held for their consumers' acks (stat, tests)
        self.early_cancelled = 0    # messages whose ack came first: never written
        self._later: list = []      # their consumed ids, for a later commit
        self._later_due = 0.0       # when they are committed at the latest (epoch s)
        self.started = time.time()  # monitoring: uptime
        self.heartbeat_misses = 0   # connections torn down for an unanswered ping
        self.monitor: Any = None    # treefed.monitor.Monitor when [monitor] listen is set
        # accepted links that went down and have not come back (peer -> what we knew):
        # the peer dialed us, so nothing else here remembers it; `treefed map` shows it cut
        self.lost_links: dict[str, dict] = {}
        self._nursery: trio.Nursery | None = None   # serve's: dial loops started later

    def _connectors(self) -> list[tuple[LinkSettings, str, str, tuple[str, str]]]:
        out = []
        tc = self.config.tree_connector
        build = self.site.sharing.new_settings   # equal settings: one validation (#14)
        if tc is not None:
            out.append((tc.link_settings(build), tc.uri, "tree_connector.uri",
                        (tc.username, tc.password)))
        for i, nc in enumerate(self.config.network_connectors):
            out.append((nc.link_settings(build), nc.uri, f"network_connector[{i}].uri",
                        (nc.username, nc.password)))
        return out

    # ------------------------------------------------------------------ lifecycle
    def restore(self) -> int:
        """Put the store's messages back on their queues (call before ``serve``).
        Returns how many were loaded."""
        messages = self.store.load()
        consumed = self.store.load_consumed()
        actions = self.site.broker.restore(messages, time.time(), consumed)
        deletes = [(a.msg_id, a.dst) for a in actions if type(a) is DeleteMessage]
        if deletes:
            self.store.apply([], deletes)
        if self._pageable:   # every restored message is in the store: bodies may go
            self.site.broker.page_out()
        self.log.info("broker.restored", messages=len(messages), discarded=len(deletes),
                      consumed=len(consumed))
        if not self.store.room():
            self.store_full = True
            self._space_wanted.set()
            self.log.warning("store.full", refused=0, at="start")
        return len(messages)

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Listen, dial, run the site task until cancelled (or ``shutdown``).
        ``task_status.started`` gets the bound ``[(host, port), ...]``."""
        b = self.config.broker
        young, *older = gc.get_threshold()
        if 0 < young < GC_YOUNG_THRESHOLD:   # 0: someone turned it off on purpose
            gc.set_threshold(GC_YOUNG_THRESHOLD, *older)
        self.log.info("broker.info", role=self.site.node_type,
                      node_type=self.site.node_type,
                      parent=self.config.tree_connector.uri if self.config.tree_connector
                      else None)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._site_loop)
            for i, text in enumerate(b.listen):
                ep = parse_uri(text, key=f"broker.listen[{i}]", listen=True)
                accept = (functools.partial(self._accept, protocol="stomp")
                          if ep.scheme.startswith("stomp") else self._accept)
                if ep.scheme in ("ssl", "stomp+ssl"):
                    serve = functools.partial(
                        serve_tls, accept, ep.host, ep.port, self._server_ssl,
                        handshake_timeout=self.config.security.tls.handshake_timeout,
                        log=self.log)
                else:
                    serve = functools.partial(serve_tcp, accept, ep.host, ep.port)
                port = await nursery.start(serve)
                self.addresses.append((ep.host, port))
                self._schemes.append(ep.scheme)
                self.log.info("broker.listening", uri=f"{ep.scheme}://{ep.host}:{port}")
            for dialer in self.dialers:
                if dialer.password and any(e.scheme != "ssl"
                                           for e in dialer.target.endpoints):
                    self.log.warning("security.plaintext_password", link=dialer.uri,
                                     hint="use an ssl:// connector URI")
            self._nursery = nursery
            for dialer in self.dialers:
                self._start_dialer(dialer)
            if self.config.monitor.listen:
                from treefed.monitor import Monitor

                self.monitor = Monitor(self)
                await nursery.start(self.monitor.serve)
            if b.heartbeat_interval > 0:
                nursery.start_soon(self._heartbeats, b.heartbeat_interval)
            if self.store_full:   # restore found it full
                nursery.start_soon(self._watch_space)
            else:   # started when a commit first finds the store full (issue #14)
                self._space_wanted = LateStart(
                    functools.partial(self._start_watch_space, nursery))
            if self._ack_syncer is not None:
                nursery.start_soon(self._ack_syncer.run)
            if self._poller is not None:
                nursery.start_soon(self._poller.run)
            task_status.started(list(self.addresses))
            await self._stopped.wait()
            nursery.cancel_scope.cancel()

    async def shutdown(self, timeout: float = 5.0) -> None:
        """Graceful stop: no new connections or dials, ``bye`` to everyone, flush, close.
        ``serve`` returns afterwards (listeners and tasks are cancelled then)."""
        if self._stopping:
            return
        self._stopping = True
        self.log.info("broker.stopping", connections=len(self._conns))
        with trio.move_on_after(timeout):
            # let the batch in hand commit and queue its receipts, then start no other
            await self._batch_lock.acquire()
            if self._early is not None:   # one held for its acks: committed now
                await self._perform([], time.time())
            if self._later:   # consumed ids not recorded yet (CONSUMED_LATER_S)
                await self._commit([], [], [])
            for c in list(self._conns.values()):
                if not c.closing:
                    c.queue(Bye("broker shutting down"))
                    c.closing = True
                    c.resume.set()
                    c.wake.set()   # a frame link's LateWriter: now closing (#14)
            for c in list(self._conns.values()):
                await c.writer_done.wait()
        self._stopped.set()
        await trio.lowlevel.checkpoint()

    # ------------------------------------------------------------------ connections
    def _new_id(self, prefix: str = "c") -> str:
        self._next_conn += 1
        return f"{prefix}{self._next_conn}"

    async def _accept(self, stream: trio.abc.Stream, protocol: str = "treefed") -> None:
        if self._stopping:
            return
        await self._run_conn(stream, None, protocol)

    async def serve_stream(self, stream: trio.abc.Stream) -> None:
        """Serve one already-connected stream as an accepted connection (an in-memory
        listener), closing it at the end.  Run it in a nursery the node's life bounds."""
        try:
            await self._accept(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, RemoteError):
            pass
        finally:
            await aclose_forcefully(stream)   # a frame link: closed at once (#14)

    async def _run_conn(self, stream: trio.abc.Stream, dialer: Dialer | None,
                        protocol: str = "treefed") -> None:
        remote = peer_address(stream) or "?"
        if protocol == "stomp":   # imported when used: idle broker RSS (issue #14)
            from treefed.node.stomp_conn import StompStream as framed_cls
        else:
            framed_cls = FramedStream
        # an in-process frame link (transport/memory.py) carries frames already
        if type(stream) is FrameEnd:
            framed = stream
        else:
            framed = framed_cls(stream, self.config.broker.max_frame_bytes)
            framed.poller = self._poller
        c = _Conn(self._new_id(), framed, remote, dialer)
        if dialer is not None:
            hello = self.site.hello(dialer.settings)
            if dialer.username is not None:
                hello.username, hello.password = dialer.username, dialer.password
            if self.addresses:   # where the peer (and `treefed map`) can reach us
                hello.options = {**hello.options, "listen": self.listen_uris()}
            c.queue(hello)
        self._conns[c.id] = c
        try:
            # a frame link's connection has no writer task most of its life: a cancel
            # scope serves as its nursery (node/late_writer.py, issue #14)
            async with (ConnTasks(self._nursery) if framed is stream and self._nursery
                        is not None else trio.open_nursery()) as nursery:
                c.scope = nursery.cancel_scope
                if protocol == "stomp":   # its own heart-beats; auto acks via the inbox
                    c.framed.start(nursery, functools.partial(self._inject, c))
                if framed is stream:   # a frame link: its writer only once closing (#14)
                    c.wake = LateWriter(self, c, nursery)
                    c.wake.set()      # a dialed link's hello
                else:
                    nursery.start_soon(self._writer, c, nursery)
                await self._reader(c)
                with trio.move_on_after(LINGER):
                    await c.writer_done.wait()
                nursery.cancel_scope.cancel()
        finally:
            if type(c.wake) is LateWriter:
                c.wake.nursery = None   # ended: nothing more to write
            if self._conns.get(c.id) is c and c.dead:
                del self._conns[c.id]
            c.writer_done.set()

    async def _reader(self, c: _Conn) -> None:
        framed, inbox = c.framed, self._inbox_send
        try:
            # a peer that connects and never says hello must not hold a socket forever
            timeout = self.config.broker.hello_timeout
            if type(framed) is FrameEnd and framed.receive_ready():
                frames = framed.take_frames()   # here already: no timer, no wait (#14)
            else:
                with trio.move_on_after(timeout) as hello_wait:
                    frames = await framed.receive_frames()
                if hello_wait.cancelled_caught:
                    raise FrameError(f"no hello within {timeout:g} s",
                                     code="hello_timeout")
            c.last_rx = trio.current_time()
            # with authentication on, an accepted peer reaches the site task only once
            # its hello passed; a refused one has its error queued and is drained below
            if (self._auth is None or c.dialer is not None
                    or await self._authenticate(c, frames[0])):
                self._inbox_bytes += _body_bytes(frames)
                if type(framed) is not FrameEnd:
                    await inbox.send((c, frames))
                else:   # no checkpoint here: the wait below is the reader's (#14)
                    try:
                        inbox.send_nowait((c, frames))
                    except trio.WouldBlock:
                        await inbox.send((c, frames))
            while not c.closing:
                if c.paused:
                    await c.resume.wait()
                    continue
                while self._inbox_bytes >= INBOX_BYTES:
                    await self._inbox_room.wait()   # message bodies wait in the socket
                frames = await framed.receive_frames()
                c.last_rx = trio.current_time()
                self._inbox_bytes += _body_bytes(frames)
                if inbox.statistics().tasks_waiting_receive:
                    # the site task waits on an empty inbox: this chunk may be alone (#14)
                    now = time.perf_counter()
                    if now - self._batch_end <= INLINE_GAP_S:
                        self._crowded = now + CROWDED_S   # chunks arrive together
                    elif len(frames) > INLINE_MAX_FRAMES:
                        self._crowded = now + CROWDED_S   # a pipelining client's flood
                    elif now > self._crowded and not self._batch_lock.locked():
                        await self._inline_batch(c, frames)   # no task hand-off at all
                        continue
                    # no extra pass; the site task no longer waits, so this reader's
                    # next chunk goes below
                    inbox.send_nowait((c, frames))
                    continue
                self._crowded = time.perf_counter() + CROWDED_S   # the site task is busy
                # a checkpoint per chunk: the site task's batch stays one chunk's worth
                # per reader, so a pipelining client's answers cannot outgrow the
                # connection's high water within one batch (send_nowait here overflowed
                # a 100,000-subscription flood: tests/security/test_conn_limits.py)
                await inbox.send((c, frames))
        except FrameError as exc:
            await inbox.send((c, exc))
        except (trio.EndOfChannel, *_SOCKET_ERRORS):
            await inbox.send((c, _EOF))
            return
        # Closing (our decision or malformed input): read and discard until the peer
        # closes, so the kernel does not answer its unread bytes with a reset that would
        # destroy our error frame in flight.  The writer's linger bounds this.
        try:
            while await framed.stream.receive_some(65536):
                pass
        except _SOCKET_ERRORS:
            pass

    async def _inline_batch(self, c: _Conn, frames: list) -> None:
        """A reader handles its own chunk as a batch (see "Inline batches" above): the
        site task waits on an empty inbox, the batch lock is free, no batch ended within
        ``INLINE_GAP_S``.  The lock serialises it with the site task's batches."""
        self._batch_lock.acquire_nowait()
        try:
            # Not shielded, yet never cut half-way (closing ``c`` cancels its reader's
            # nursery): a batch awaits only ``in_thread``, which cannot be cancelled,
            # so a cancellation lands at the reader's next read.  A shield scope per batch
            # was ~6 µs of a lone synchronous send (issue #14).
            await self._handle_batch([(c, frames)], None)
        except Exception as exc:   # as in _site_loop: log it, keep serving (#12)
            self.log.error("site.batch_failed", error=repr(exc), exc_info=exc,
                           conns=[c.id])
        finally:
            self._batch_lock.release()
            self._batch_end = time.perf_counter()
        waiting = self._site_wait
        if waiting is not None:   # timers: the site task sleeps until the old deadline
            # set to the deadline as it is now: earlier when this batch made a timer, later
            # when it sent the held acks the site task would have woken for (ACK_HOLD_S);
            # left alone when it did not change (a lone send's batch, most often: the
            # deadline setter re-sorts trio's timers)
            due = self._next_deadline()
            if due != self._site_due:
                self._site_due = due
                waiting.deadline = (math.inf if due is None else
                                    trio.current_time() + max(due - time.time(), 0.0))

    async def _inject(self, c: _Conn, frames: list) -> None:
        """Frames a connection's protocol adapter adds as if the peer had sent them."""
        await self._inbox_send.send((c, frames))

    async def _authenticate(self, c: _Conn, hello: Any) -> bool:
        """Check an accepted connection's hello (before the site task sees it).  On
        failure: log (no password), wait the delay, queue Error(auth_failed), close."""
        if type(hello) is not Hello:
            return True  # not a hello at all: the site task refuses it as such
        identity = peer_identity(c.framed.stream)
        # serialised per source and user, delayed before the check, locked out after N
        # failures (node/login.py, issue #12 defect 10); a failure's delay is waited there
        result = await self._login.login(hello, identity, c.remote.rpartition(":")[0])
        fields = result.log_fields()
        if result.ok:
            c.user = result.user
            self.log.info("auth.ok", conn=c.id, remote=c.remote, role=hello.role, **fields)
            return True
        self.log.warning("auth.failed", conn=c.id, remote=c.remote, role=hello.role,
                         **fields)
        c.dead = True   # the Site never learnt of it
        c.closing = True
        c.queue(result.error_frame())
        return False

    async def _writer(self, c: _Conn, nursery: trio.Nursery) -> None:
        framed = c.framed
        try:
            while True:
                await c.wake.wait()
                c.wake = trio.Event()
                if c.out or getattr(framed, "pending", None):   # pending: see _perform
                    frames, c.out = c.out, []
                    c.out_bytes = 0
                    await framed.send_frames(frames)
                    if c.out:
                        continue
                if c.closing:
                    break
            try:
                await framed.stream.send_eof()
            except (AttributeError, *_SOCKET_ERRORS):
                pass
        except _SOCKET_ERRORS:
            pass
        finally:
            c.writer_done.set()
        await trio.sleep(LINGER)
        nursery.cancel_scope.cancel()

    # ------------------------------------------------------------------ dialing
    async def _dial_loop(self, dialer: Dialer) -> None:
        # jitter spreads the reconnects of thousands of stores after a parent restarts
        backoff = backoff_for(dialer.target, jitter=RECONNECT_JITTER)

        async def open_stream(endpoint: Endpoint, *, connect_timeout: float | None,
                              ) -> trio.abc.Stream:
            dialer.state = "connecting"
            dialer.endpoint = str(endpoint)
            if self._open_stream is not None:
                return await self._open_stream(endpoint)
            return await open_tcp(endpoint, connect_timeout=connect_timeout,
                                  ssl_context=self._client_ssl)

        def on_attempt(endpoint: Endpoint, attempt: int, error: RemoteError | None) -> None:
            dialer.attempts += 1
            if error is not None:
                dialer.state = "waiting"
                dialer.last_error = error.message
                self.log.info("link.dial_failed", link=dialer.settings.name,
                              endpoint=str(endpoint), error=error.message)

        while not self._stopping and not dialer.removed:
            try:
                stream, _ = await connect_with_retry(dialer.target, backoff, self._rng,
                                                     on_attempt=on_attempt,
                                                     open_stream=open_stream)
            except RemoteError as exc:
                dialer.state = "failed"
                dialer.last_error = exc.message
                self.log.warning("link.gave_up", link=dialer.settings.name,
                                 uri=dialer.uri, error=exc.message)
                return
            try:
                await self._run_conn(stream, dialer)   # hello, then operational
            finally:
                await aclose_forcefully(stream)   # a frame link: at once (#14)
                dialer.state = "waiting"
                dialer.conn = None
            backoff.disconnected(trio.current_time())

    async def _heartbeats(self, interval: float) -> None:
        """Ping idle connections (links and clients; both answer pings) and tear down
        one silent for 2 intervals: a peer that half-opened and vanished.  A paused
        producer is exempt: we are the ones not reading it."""
        while True:
            await trio.sleep(interval)
            now = trio.current_time()
            for c in list(self._conns.values()):
                if c.paused and not c.closing and c.framed.protocol == "treefed":
                    # we do not read it, so its pings go unanswered: a ping from us each
                    # interval tells its client we are alive (producer flow control)
                    c.queue(Ping(0))
                    continue
                if c.kind is _PENDING or c.closing or c.paused \
                        or c.framed.protocol != "treefed":   # STOMP: its own heart-beats
                    continue
                silent = now - c.last_rx
                if c.pinged is not None and c.last_rx < c.pinged:
                    # dead only after a ping went unanswered for an interval, so a late
                    # tick of this loop cannot condemn a peer we never pinged
                    if now - c.pinged >= interval:
                        self.log.warning("conn.dead", conn=c.id, remote=c.remote,
                                         silent=round(silent, 3))
                        self.heartbeat_misses += 1
                        if c.dialer is not None:
                            c.dialer.last_error = f"peer silent for {silent:.1f} s " \
                                                  "(heartbeat)"
                        c.closing = True
                        c.wake.set()
                        await self._inbox_send.send((c, _EOF))
                        if c.scope is not None:
                            c.scope.cancel()   # no flush, no linger: nobody is there
                elif silent >= interval:
                    c.pinged = now
                    c.queue(Ping(0))

    def _start_watch_space(self, nursery: trio.Nursery) -> None:
        """``_space_wanted`` was set for the first time: start ``_watch_space`` (an
        in-process estate's thousands of nodes never fill their stores, issue #14)."""
        wanted = self._space_wanted = trio.Event()
        wanted.set()
        nursery.start_soon(self._watch_space)

    async def _watch_space(self) -> None:
        """While persistent input is refused (``store_full``), ask the store every
        ``SPACE_PROBE`` seconds whether it has room again; between batches, since the
        store serves one thread at a time."""
        while True:
            if not self.store_full:
                # asleep until a commit finds the store full: thousands of idle nodes in
                # one process (memory engine) must not each wake twice a second (#14)
                await self._space_wanted.wait()
                self._space_wanted = trio.Event()
                continue
            await trio.sleep(SPACE_PROBE)
            if not self.store_full:
                continue
            async with self._batch_lock:
                if await self._room() and self.store_full:
                    self.store_full = False
                    self.log.info("store.space", deletes=0)

    # ------------------------------------------------------------------ the site task
    async def _site_loop(self) -> None:
        """The one task that owns the Site: wait for input (or the next timer), take
        everything else already queued, handle it as one batch."""
        inbox = self._inbox
        while True:
            deadline = self._next_deadline()
            batch: list = []
            # a reader's inline batch may bring the deadline forward (``_inline_batch``)
            with trio.CancelScope() as waiting:
                if deadline is not None:
                    waiting.deadline = trio.current_time() + max(deadline - time.time(),
                                                                 0.0)
                self._site_wait = waiting
                self._site_due = deadline   # what ``waiting`` was set for (epoch s)
                batch.append(await inbox.receive())
            self._site_wait = None
            try:
                while len(batch) < MAX_BATCH:
                    batch.append(inbox.receive_nowait())
            except trio.WouldBlock:
                pass
            # a free lock is taken without the scheduler pass ``acquire`` always costs
            # (one per batch: a lone message's batch is all passes, issue #14)
            try:
                self._batch_lock.acquire_nowait()
            except trio.WouldBlock:
                await self._batch_lock.acquire()
            try:
                await self._handle_batch(batch, deadline)
            except Exception as exc:   # last resort: log it, keep serving (#12)
                self.log.error("site.batch_failed", error=repr(exc), exc_info=exc,
                               conns=sorted({c.id for c, _ in batch}))
            finally:
                self._batch_lock.release()
                self._batch_end = time.perf_counter()

    def _next_deadline(self) -> float | None:
        """When the site task must wake without input: the Site's timers, or a drop
        summary to write (epoch seconds; None: never)."""
        deadline = self.site.next_deadline()
        drops_due = self._drops.next_deadline()
        if drops_due is not None and (deadline is None or drops_due < deadline):
            deadline = drops_due   # a drop summary to write
        if self._held:   # held ForwardAcks to send (ACK_HOLD_S)
            acks_due = min(c.acks_at for c in self._held) + ACK_HOLD_S
            if deadline is None or acks_due < deadline:
                deadline = acks_due
        if self._early is not None and (deadline is None or self._early.due < deadline):
            deadline = self._early.due   # a batch held for its acks (EARLY_PROBE_S)
        if self._later and (deadline is None or self._later_due < deadline):
            deadline = self._later_due   # consumed ids to record (CONSUMED_LATER_S)
        return deadline

    async def _handle_batch(self, batch: list, deadline: float | None) -> None:
        """Feed one batch to the Site, then perform all it asked for (one commit)."""
        now = time.time()
        actions: list = []
        for c, payload in batch:
            if type(payload) is list:
                self._inbox_bytes -= _body_bytes(payload)
                if not c.dead:
                    try:
                        self._handle_frames(c, payload, now, actions)
                    except Exception as exc:
                        self._failed(c, exc, now, actions)
            elif payload is _EOF:
                self._forget(c, now, actions)
            else:
                self._malformed(c, payload, now, actions)
        if deadline is not None and now >= deadline:
            actions += self.site.handle_timer(now)
        if self._inbox_bytes < INBOX_BYTES:
            self._inbox_room.set()
            self._inbox_room = trio.Event()
        if actions or (self._early is not None and now >= self._early.due) \
                or (self._later and now >= self._later_due):
            await self._perform(actions, now)
        if self._held:
            self._acks_due(now)
        for fields in self._drops.due(now):
            self.log.info(SUMMARY_EVENT, **fields)
        self.batches += 1

    def _handle_frames(self, c: _Conn, frames: list, now: float, actions: list) -> None:
        site = self.site
        cid = c.id
        if c.kind is _LINK and c.guard is None and not self.store_full \
                and set(map(type, frames)) == _ONLY_FORWARDS:
            # a chunk of forwards from a link (a relaying broker's whole input under
            # load): one core call for the run, one ForwardAck for it (issue #14)
            site.handle_forwards(cid, frames, now, actions)
            return
        if c.kind is _CLIENT and c.guard is None and not self.store_full \
                and set(map(type, frames)) == _ONLY_SENDS:
            # a chunk of a producer's sends: each id scoped as below, then one core call
            # for the run (issue #14)
            _scope_ids(c, frames)
            site.handle_sends(cid, frames, now, actions)
            return
        for frame in frames:
            kind = type(frame)
            if c.kind is _PENDING:
                self._on_hello(c, frame, now, actions)
                if c.kind is _PENDING:
                    return  # refused: the Close is queued, ignore the rest
                cid = c.id
            elif kind is StatRequest:
                if c.guard is None or c.guard.screen(cid, frame, actions):
                    actions.append(Out(cid, self._stat_reply(frame)))
            elif kind is Admin:
                if c.guard is None or c.guard.screen(cid, frame, actions):
                    actions.append(Out(cid, self._admin(frame, now, actions)))
            elif kind is Bye:
                self.log.info("conn.bye", conn=cid, peer=c.peer, reason=frame.reason)
                actions.append(Close(cid))
                return
            elif kind is Pong:
                if c.pinged is not None:
                    c.rtt = c.last_rx - c.pinged
            elif kind is Hello:
                actions.append(Out(cid, Error("bad_frame", "hello was already exchanged")))
            else:
                if kind is Error and c.kind is _LINK:
                    self._link_error(c, frame)
                    if frame.ref is not None:
                        # the peer refused one request of ours (a forward it would not
                        # take, an advisory it may not hear): logged, the link stays up
                        continue
                if kind is Send and c.kind is _CLIENT:
                    _scope_ids(c, (frame,))
                guard = c.guard
                if guard is not None and not guard.screen(cid, frame, actions):
                    continue
                if self.store_full and (kind is Send or kind is Forward) \
                        and frame.persistent and not frame.dst.startswith(_UNSTORED):
                    if self._refuse_when_full(c, frame, actions):
                        return
                    continue
                actions += site.handle_frame(cid, frame, now)

    def _stat_reply(self, request: StatRequest) -> StatReply | Error:
        """One page of statistics (``node.stat_pages``), sized to fit a frame: a page
        whose encoding would pass ``max_frame_bytes`` is asked again, smaller."""
        stats = self.statistics()
        limit = request.limit
        while True:
            try:
                page = stat_pages.select(stats, request.what, match=request.match,
                                         offset=request.offset, limit=limit)
            except RemoteError as exc:
                return Error(exc.code, exc.message, STAT_REF)
            reply = StatReply(page)
            returned = max((p["returned"] for p in page["pages"].values()), default=0)
            if returned <= 1 or len(encode(reply)) <= self.config.broker.max_frame_bytes:
                return reply
            limit = max(1, returned // 4)

    def _refuse_when_full(self, c: _Conn, frame: Any, actions: list) -> bool:
        """The store is full: a producer's persistent send is refused (it may retry); a
        peer's persistent forward closes the link, so the peer keeps its copy and
        forwards it again after its back-off.  True when the connection is closing."""
        if type(frame) is Send:
            actions.append(Out(c.id, Error(_STORE_FULL.code, _STORE_FULL.message, frame.id)))
            return False
        self.log.warning("store.full_link", conn=c.id, peer=c.peer)
        actions.append(Close(c.id, Error(_STORE_FULL.code, _STORE_FULL.message)))
        return True

    def _on_hello(self, c: _Conn, frame: Any, now: float, actions: list) -> None:
        if type(frame) is Error and c.dialer is not None:   # the peer refused our hello
            self._link_error(c, frame)
            self._refuse(c, None, f"peer refused the link: {frame.message}", actions)
            return
        try:
            hello = check_hello(frame, PROTOCOL_VERSION)
        except FrameError as exc:
            self._refuse(c, exc, exc.message, actions)
            return
        c.hello = hello
        if hello.role == "client":
            if c.dialer is not None:
                self._refuse(c, FrameError("a client answered a broker link",
                                           code="bad_role"), "client on a link", actions)
                return
            c.kind = _CLIENT
            if self._authz is not None:
                c.guard = Guard(c.user, self._authz)
            hb = self.config.broker.heartbeat_interval
            actions.append(Out(c.id, Hello(PROTOCOL_VERSION, "broker",
                                           broker_id=self.broker_id,
                                           name=self.config.broker.name,
                                           options={"heartbeat_interval": hb} if hb else {})))
            c.producer = _producer_scope(hello, c.user)
            actions += self.site.client_connected(c.id, now)
            return
        # a broker link
        peer = hello.broker_id or "?"
        if c.dialer is None and hello.connector == "tree" and not self._may_be_child(c):
            self._refuse(c, RemoteError(f"user {c.user} has no broker role",
                                        code="not_authorized"), "no broker role", actions)
            return
        if c.dialer is not None:
            settings = c.dialer.settings
        else:
            settings = listener_settings(hello, accept_mesh=self.config.broker.accept_mesh,
                                         sharing=self.site.sharing)   # validated once (#14)
            if type(settings) is str:
                self._refuse(c, RemoteError(settings, code="link_refused"), "mesh refused",
                             actions)
                return
        self._rename(c, f"L:{settings.name}:{peer}")
        c.kind = _LINK
        c.peer = peer
        c.high_water = LINK_HIGH_WATER
        if c.dialer is None:
            actions.append(Out(c.id, self.site.hello(reply_to=hello)))
        else:
            c.dialer.peer, c.dialer.conn = peer, c.id
        result = self.site.link_up(c.id, settings, hello, now, dialed=c.dialer is not None)
        refusal = next((a.frame for a in result
                        if type(a) is Out and type(a.frame) is Error), None)
        if refusal is not None:
            c.kind = _PENDING   # the Site did not take it (and logs link.refused)
            if c.dialer is not None:
                c.dialer.last_error = f"{refusal.code}: {refusal.message}"
        elif c.dialer is not None:
            c.dialer.state = "operational"
            c.dialer.connects += 1
            c.dialer.last_error = None
        else:
            c.guard = self._link_guard(c, hello)
            self.lost_links.pop(peer, None)
        actions += result

    def _remember_lost(self, c: _Conn, now: float) -> None:
        bridge = self.site.bridge(c.id)
        listen = c.hello.options.get("listen") if c.hello is not None else None
        self.lost_links.pop(c.peer, None)
        if len(self.lost_links) >= LOST_LINKS:
            del self.lost_links[next(iter(self.lost_links))]
        self.lost_links[c.peer] = {
            "peer": c.peer, "link": bridge.name if bridge is not None else None,
            "lane": bridge.lane if bridge is not None else None, "remote": c.remote,
            "listen": [u for u in listen if isinstance(u, str)][:8]
            if isinstance(listen, list) else [], "since": round(now, 3)}
    def _may_be_child(self, c: _Conn) -> bool:
        """``[security.tree] child_groups``: only users in one of them may attach as a
        tree child (a client user must not take a place in the tree)."""
        wanted = self.config.security.tree.child_groups
        if not wanted or self._auth is None:
            return True
        user = self._auth.user(c.user) if c.user is not None else None
        return user is not None and not set(wanted).isdisjoint(user.groups)

    def _link_guard(self, c: _Conn, hello: Hello) -> Guard | None:
        """The screen of an accepted link: the peer user's permissions and, for a tree
        child, its scope (a leaf's subtree is itself; a branch's grows with the brokers
        the Site lets it claim)."""
        bridge = self.site.bridge(c.id)
        scope = None
        if self._tree_scope is not None and bridge is not None and bridge.lane == "child":
            scope = self._tree_scope.for_child(c.peer, leaf=hello.node_type == "leaf")
            # a delta resync re-admitted the child's subtree without advisories to screen
            scope.add_subtree(bridge.owned)
        if scope is None and self._authz is None:
            return None
        site = self.site

        def claimable(broker_id: str) -> bool:
            return site.subtree_owner(broker_id) in (None, bridge)

        return Guard(c.user, self._authz, scope=scope, claimable=claimable,
                     link=bridge.name if bridge is not None else None, peer=c.peer,
                     dropped=site.dropped)

    def _rename(self, c: _Conn, wanted: str) -> None:
        new, n = wanted, 1
        while new in self._conns:
            n += 1
            new = f"{wanted}#{n}"
        del self._conns[c.id]
        c.id = new
        self._conns[new] = c

    def _link_error(self, c: _Conn, frame: Error) -> None:
        if c.dialer is not None:
            c.dialer.last_error = f"{frame.code}: {frame.message}"
        self.log.warning("link.error", conn=c.id, code=frame.code, error=frame.message)

    def _refuse(self, c: _Conn, exc: TreefedError | None, why: str, actions: list) -> None:
        """Refuse a connection before its hello was accepted."""
        self.log.warning("conn.refused", conn=c.id, remote=c.remote, reason=why)
        error = Error(exc.code, exc.message) if exc is not None else None
        actions.append(Close(c.id, error))

    def _malformed(self, c: _Conn, exc: FrameError, now: float, actions: list) -> None:
        self.log.warning("conn.malformed", conn=c.id, remote=c.remote, code=exc.code,
                         error=exc.message)
        if not c.dead:
            actions.append(Close(c.id, Error(exc.code, exc.message)))

    def _failed(self, c: _Conn, exc: Exception, now: float, actions: list) -> None:
        """Handling a frame of ``c`` raised (a bug, or input no check foresaw): only
        that connection pays -- it gets ``internal_error`` and is closed, the failure is
        logged with its traceback; the actions of its earlier frames still happen."""
        self.log.error("conn.failed", conn=c.id, remote=c.remote, error=repr(exc),
                       exc_info=exc)
        if not c.dead:
            actions.append(Close(c.id, Error("internal_error",
                                             f"the broker could not handle a frame: "
                                             f"{type(exc).__name__}")))

    def _forget(self, c: _Conn, now: float, actions: list) -> None:
        """The Site forgets ``c`` (once); its writer flushes and ends."""
        if c.acks:   # what it took is acked before it closes
            self._release_acks(c)
        if not c.closing:
            c.closing = True
            c.wake.set()
            c.resume.set()
        if c.dead:
            return
        c.dead = True
        if c.dialer is not None and c.dialer.conn == c.id:
            c.dialer.state = "waiting"      # as soon as the link is gone, not after linger
        if c.kind is _CLIENT:
            actions += self.site.client_closed(c.id, now)
        elif c.kind is _LINK:
            if c.dialer is None and not self._stopping:
                self._remember_lost(c, now)
            actions += self.site.link_down(c.id, now)
        if c.writer_done.is_set() and self._conns.get(c.id) is c:
            del self._conns[c.id]

    def _overflow(self, c: _Conn, why: str, now: float, more: list) -> None:
        """``c`` does not read what we send: drop its queue, tell it why, close it."""
        self.log.warning("conn.overflow", conn=c.id, queued=len(c.out),
                         queued_bytes=c.out_bytes)
        c.out.clear()
        c.out_bytes = 0
        c.out.append(Error("overflow", why))
        self._forget(c, now, more)
        c.wake.set()

    async def _perform(self, actions: list, now: float) -> None:
        """Do what the Site asked, committing the batch's store work before any Out."""
        conns = self._conns
        pending_cap = self.config.broker.max_pending_bytes_per_connection
        touched: dict = {}   # connections that got frames, in order
        first = True
        while actions or (first and self._early is not None):
            stores: list = []
            deletes: list = []
            consumed: list = []
            deferred: list = []
            pages: list = []
            logs = [] if self._event_logs is not None else None   # one call per step
            for a in actions:
                kind = type(a)
                if kind is Out or kind is Close:
                    deferred.append(a)
                elif kind is StoreMessage:
                    stores.append(a.msg)
                elif kind is DeleteMessage:
                    deletes.append((a.msg_id, a.dst))
                    if a.consumed:
                        consumed.append(a.msg_id)
                elif kind is Log:
                    if logs is None:
                        self._log_event(a)
                    else:
                        logs.append(_client_log(a) if a.event.startswith("message.") else a)
                elif kind is Drop:
                    if logs is None:
                        self._log_drop(a, now)
                    else:
                        logs.append(a.log())
                elif kind is Pause:
                    c = conns.get(a.conn)
                    if c is not None:
                        c.paused = True
                elif kind is Resume:
                    c = conns.get(a.conn)
                    if c is not None and c.paused:
                        c.paused = False
                        c.resume.set()
                        c.resume = trio.Event()
                elif kind is PageIn:
                    pages.append(a)
            if logs:
                self._event_logs(logs)
            if deletes and self._late_acks:
                self._late_acked(deletes)
            if first:
                first = False
                if self._early is not None:   # the held batch goes first (its acks?)
                    stores, deletes, consumed, deferred = self._unhold(
                        stores, deletes, consumed, deferred, now)
                if stores and not pages and self._may_hold():
                    split = _early_delivers(stores, deferred, conns)
                    if split is not None:
                        # the Delivers now, the commit and the rest when the acks came
                        deferred, rest = split
                        self.early_held += 1
                        began = time.perf_counter()
                        self._early = _Early(stores, deletes, consumed, rest, began,
                                             now + EARLY_HOLD_FACTOR * self._insert_seconds)
                        stores, deletes, consumed = [], [], []
            refused = None
            if self._pageable:
                await self._page_in(stores, deferred)
            if stores or deletes:
                lazy = self._group_forwards and bool(stores) \
                    and _forwards_only(stores, deferred)
                refused = await self._commit(stores, deletes, consumed, durable=not lazy)
                if refused is None and self._pageable:
                    self.site.broker.page_out()
            elif consumed:
                # only the ids of messages consumed before their commit (EARLY_PROBE_S):
                # nothing for the receipts to wait for (CONSUMED_LATER_S)
                if not self._later:
                    self._later_due = now + CONSUMED_LATER_S
                self._later += consumed
            more: list = []
            if refused is not None:
                deferred = self._take_back(refused, stores, deferred, now, more)
            for a in pages:   # after the commit: every spilled message is in the store
                more += await self._page_in_rows(a, now)
            hold = 0   # > 0: the stores mark ForwardAcks wait for (see _release_held)
            if self._group_forwards:
                mark = self.store.stores_mark()
                if not self.store.synced_past(mark):
                    deferred = await self._sync_for_receipts(deferred)
                    if not self.store.synced_past(mark):
                        hold = mark
            for a in deferred:
                c = conns.get(a.conn)
                if c is None or c.closing:
                    continue
                if type(a) is Out:
                    frame = a.frame
                    if hold and type(frame) is ForwardAck:
                        # the forwards it acks are not fsynced yet: the upstream keeps
                        # its copies until the syncer's group fsync covers them
                        self._sync_held.append((hold, c, frame))
                        self._sync_held_ids += len(frame.ids)
                        continue
                    if c.producer is not None and type(frame) in _ANSWERS:
                        frame = _unscoped(frame)   # a client hears its own ids back
                    if type(frame) is ForwardAck:
                        # held, then one frame for many forwards (ACK_HOLD_S, issue #14)
                        if not c.acks:
                            c.acks_at = now
                            self._held[c] = None
                        c.acks.extend(frame.ids)
                        touched[c] = None
                        continue
                    if c.acks:   # held acks keep their place before a later frame
                        self._release_acks(c)
                    c.out.append(frame)
                    if type(frame) is Deliver and c.kind is _CLIENT and pending_cap:
                        c.out_bytes += len(frame.body) + 64
                        if c.out_bytes > pending_cap:
                            self._overflow(c, f"more than {pending_cap} bytes of messages "
                                              "queued: the connection does not keep up "
                                              "(max_pending_bytes_per_connection)",
                                           now, more)
                            continue
                    if len(c.out) > c.high_water:
                        self.log.warning("conn.overflow", conn=c.id, queued=len(c.out))
                        c.out.clear()
                        c.out.append(Error("overflow", f"more than {c.high_water} frames "
                                                       "queued: the connection does not "
                                                       "keep up"))
                        self._forget(c, now, more)
                    touched[c] = None
                else:
                    if a.error is not None:
                        c.out.append(a.error)
                    self._forget(c, now, more)
            actions = more
        if self._sync_held:
            if self.store.synced_past(self._sync_held[-1][0]):
                self._release_held()   # a storing commit's fsync covered them
            else:
                self._ack_syncer.poke(urgent=True, now=self._sync_held_ids >= HELD_SYNC_NOW)
        for c in touched:   # a batch takes held acks along from half their hold on,
            #                 so that under steady traffic the site task's timer never fires
            if c.acks and (c.out or len(c.acks) >= ACK_HOLD_IDS
                           or now - c.acks_at >= ACK_HOLD_S / 2):
                self._release_acks(c)
        # A connection whose only frame is a ForwardAck is written after the others
        # (issue #14): a relaying broker's hop is "read the Forward, write it on", and
        # writing the upstream's ack first put one more loopback write — which also wakes
        # the upstream broker, on 2 cores the core the next hop needs — in front of every
        # forwarded message.  Per-connection order is unchanged.
        acks_only: list = []
        for c in touched:   # written now when possible: no writer wake-up (issue #14)
            out = c.out
            if len(out) == 1 and type(out[0]) is ForwardAck:
                acks_only.append(c)
            elif out and (c.closing or not self._write_now(c)):
                c.wake.set()
        for c in acks_only:
            if c.closing or not self._write_now(c):
                c.wake.set()
        if self._later and (now >= self._later_due
                            or len(self._later) >= CONSUMED_LATER_IDS):
            await self._commit([], [], [])   # it takes them along
        if self._threaded_store and self._checkpoint_due():
            # the receipts are queued: the writers send them while the WAL is copied
            await in_thread(self.store.checkpoint)

    def _may_hold(self) -> bool:
        """Whether a batch may deliver before its commit and wait for the acks
        (``EARLY_PROBE_S``): a real store with room, and acks that have been coming
        within ``EARLY_HOLD_FACTOR`` insert commits -- or a probe, once per
        EARLY_PROBE_S.  (Paging is no obstacle: a body is paged out, and a page read
        back, only after a commit, and every commit takes the held batch along first.)"""
        if not self._threaded_store or self.store_full or self._stopping:
            return False
        if self._ack_wait < EARLY_HOLD_FACTOR * self._insert_seconds:
            return True
        t = time.perf_counter()
        if t - self._early_probe < EARLY_PROBE_S:
            return False
        self._early_probe = t
        return True

    def _unhold(self, stores: list, deletes: list, consumed: list, deferred: list,
                now: float) -> tuple[list, list, list, list]:
        """Merge the held batch in front of this one: a delete of a message it holds
        (its consumer's ack came first) takes the insert out with it -- neither reaches
        the store; the consumed id still does -- and the acks' delay feeds the average
        that decides whether to hold again."""
        e = self._early
        self._early = None
        held = {m.id: m for m in e.stores}
        waited = time.perf_counter() - e.at
        kept = []
        for d in deletes:
            m = held.get(d[0])
            if m is not None and m.dst == d[1]:
                del held[d[0]]
                self._ack_wait += (waited - self._ack_wait) * 0.1
            else:
                kept.append(d)
        if len(held) < len(e.stores):
            self.early_cancelled += len(e.stores) - len(held)
            e.stores = [m for m in e.stores if m.id in held]
        if held and now >= e.due:   # the deadline came first: a late ack
            self._ack_wait += (max(waited, 2 * EARLY_HOLD_FACTOR * self._insert_seconds)
                               - self._ack_wait) * 0.1
        if held:   # committed without their acks: their real delay counts when they come
            late = self._late_acks
            for msg_id in held:
                late[msg_id] = e.at
            while len(late) > LATE_ACKS_MAX:
                del late[next(iter(late))]
        return (e.stores + stores, e.deletes + kept, e.consumed + list(consumed),
                e.deferred + deferred)

    def _late_acked(self, deletes: list) -> None:
        """Acks of held messages that were committed before their acks came: the
        delay they really took feeds the acks' average (LATE_ACKS_MAX).  The deadline
        only says an ack took longer than it; a consumer whose acks take ten commits
        must not be waited for again as soon as a commit or two run slow."""
        late = self._late_acks
        t = time.perf_counter()
        for msg_id, _dst in deletes:
            at = late.pop(msg_id, None)
            if at is not None:
                self._ack_wait += (t - at - self._ack_wait) * 0.1

    def _release_acks(self, c: _Conn) -> None:
        """Queue ``c``'s held ForwardAck ids as one frame (ACK_HOLD_S)."""
        c.out.append(ForwardAck(c.acks))
        c.acks = []
        self._held.pop(c, None)

    def _acks_due(self, now: float) -> None:
        """Send the held ForwardAcks whose time came (the site task's timer), and with
        them any held for half their time (see ``_perform``)."""
        for c in [c for c in self._held if now - c.acks_at >= ACK_HOLD_S / 2]:
            self._release_acks(c)
            if c.closing or not self._write_now(c):
                c.wake.set()

    async def _sync_for_receipts(self, deferred: list) -> list:
        """Receipts are never held: when forwards committed without an fsync are not
        yet synced and this batch answers a client (a duplicate send, say), the WAL is
        fsynced first; if that fails the receipts become errors."""
        if not any(type(a) is Out and type(a.frame) is Receipt for a in deferred):
            return deferred
        try:
            await in_thread(self.store.sync)
        except StoreError as exc:
            self.log.error("store.sync_failed", code=exc.code, error=exc.message)
            return [Out(a.conn, Error(exc.code, exc.message, a.frame.id))
                    if type(a) is Out and type(a.frame) is Receipt else a
                    for a in deferred]
        return deferred

    def _release_held(self) -> None:
        """Send the held ForwardAcks that an fsync of the WAL now covers (one frame per
        connection); those of a connection gone meanwhile are dropped — its peer
        re-forwards, and the duplicate is acked then."""
        held = self._sync_held
        if not held:
            return
        store = self.store
        ids: dict = {}
        keep = []
        for item in held:
            mark, c, frame = item
            if not store.synced_past(mark):
                keep.append(item)
            elif not (c.closing or c.dead) and self._conns.get(c.id) is c:
                ids.setdefault(c, []).extend(frame.ids)
        self._sync_held = keep
        self._sync_held_ids = sum(len(frame.ids) for _, _, frame in keep)
        for c, acked in ids.items():
            c.out.append(ForwardAck(acked))
            if not self._write_now(c):
                c.wake.set()
        if keep and self._ack_syncer is not None:
            self._ack_syncer.poke(urgent=True)

    @staticmethod
    def _write_now(c: _Conn) -> bool:
        """Write ``c.out`` from this task when the socket takes it at once
        (``FramedStream.send_now``: plain TCP, writer idle); False: wake the writer
        (it sends the frames, or what the kernel did not take of them)."""
        send_now = getattr(c.framed, "send_now", None)   # STOMP: its own encoder
        if send_now is None or not send_now(c.out):
            return False
        c.out = []
        c.out_bytes = 0
        return not c.framed.pending

    def _checkpoint_due(self) -> bool:
        due = getattr(self.store, "checkpoint_due", None)
        return due is not None and due()

    async def _page_in(self, stores: list, deferred: list) -> None:
        """Read back from the store the bodies the core paged out (core/paging.py) that
        this batch sends or stores again -- before its commit, which may delete their
        rows (an ack, a dead-lettered copy)."""
        if not self.site.broker._paged:
            return   # nothing is paged out (a body is paged only with its bytes counted)
        wanted: dict = {}
        for m in stores:
            key = paged_key(m.body)
            if key is not None:
                wanted[key] = None
        frames = []
        for a in deferred:
            if type(a) is Out:
                frame = a.frame
                kind = type(frame)
                if kind is Deliver or kind is Forward:
                    key = paged_key(frame.body)
                    if key is not None:
                        wanted[key] = None
                        frames.append(frame)
        if not wanted:
            return
        # in_thread, not trio.to_thread: no cancellation point inside a batch (see
        # ``_inline_batch``)
        bodies = await in_thread(self.store.load_bodies, list(wanted))
        missing = [k for k in wanted if k not in bodies]
        if missing:
            self.log.error("store.body_missing", messages=len(missing), first=missing[0])
        for m in stores:
            key = paged_key(m.body)
            if key is not None:
                m.body = bodies.get(key, b"")
        for frame in frames:
            frame.body = bodies.get(frame.body.key, b"")

    async def _page_in_rows(self, a: PageIn, now: float) -> list:
        """Read the next page of queue ``a.dst`` from the store for the core's store
        cursor (core/broker.py).  A failed read leaves the backlog in the store; the core
        asks again when its page next runs low."""
        try:
            msgs, cursor, exhausted = await in_thread(   # uncancellable: as _page_in
                self.store.load_page, a.dst, a.after, a.n, a.exclude, a.first)
        except StoreError as exc:
            self.log.error("store.page_failed", dst=a.dst, error=exc.message)
            msgs, cursor, exhausted = [], 0, False
        return self.site.broker.page_in(a.dst, msgs, cursor, exhausted, now)

    def _take_back(self, refused: dict, stores: list, deferred: list, now: float,
                   more: list) -> list:
        """The batch's stores were not committed: withdraw those messages from the core
        (``more`` gets what that frees) and rewrite the batch's Outs — no Deliver or
        Forward of them leaves, their receipts become errors, and a link that forwarded
        one is closed instead of acked (the peer keeps its copy: store-and-forward)."""
        broker = self.site.broker
        stores = [m for m in stores if m.id in refused]   # the others were committed
        for m in stores:
            more += broker.withdraw(m.id, m.dst, now, msg=m)
        gone = {(m.id, m.dst) for m in stores}
        kept: list = []
        for a in deferred:
            frame = a.frame if type(a) is Out else None
            kind = type(frame)
            if kind is Deliver and (frame.msg, frame.dst) in gone:
                continue
            if kind is Forward and (frame.id, frame.dst) in gone:
                continue
            if kind is Receipt and frame.id in refused:
                exc = refused[frame.id]
                a = Out(a.conn, Error(exc.code, exc.message, frame.id))
            elif kind is ForwardAck and any(i in refused for i in frame.ids):
                exc = refused[next(i for i in frame.ids if i in refused)]
                a = Close(a.conn, Error(exc.code, exc.message))
            kept.append(a)
        return kept

    async def _commit(self, stores: list, deletes: list, consumed: list = (),
                      durable: bool = True) -> dict | None:
        """One transaction for the batch.  On failure the broker keeps running: the
        messages it could not store are refused (see ``_take_back``).  A full store
        still commits the batch's deletes (with their consumed ids) on their own — an
        acked message must not come back after a restart — and refuses persistent input
        at the door until a later commit succeeds (deletes make room)."""
        self.commits += 1
        if self._later:   # consumed before their commit (CONSUMED_LATER_S): ride along
            consumed = self._later + list(consumed)
            self._later = []
        unsaved_deletes, unsaved_consumed = self._unsaved
        if unsaved_deletes or unsaved_consumed:   # refused earlier: retried first
            deletes = unsaved_deletes + list(deletes)
            consumed = unsaved_consumed + list(consumed)
            self._unsaved = ([], [])
        try:
            await self._apply(stores, deletes, consumed, durable)
        except Exception as exc:   # containment (issue #12): no store failure ends us
            if not isinstance(exc, StoreError):
                self.log.error("store.bug", error=repr(exc), exc_info=exc)
                exc = StoreError(f"the message store failed: {exc!r}", code="store_failed")
            self.log.error("store.failed", code=exc.code, error=exc.message,
                           stores=len(stores), deletes=len(deletes))
            if exc.code != "store_full" and len(stores) > 1:
                return await self._commit_apart(stores, deletes, consumed)
            if exc.code == "store_full":
                if not self.store_full:
                    self.log.warning("store.full", refused=len(stores))
                self.store_full = True
                self._space_wanted.set()
                exc = _STORE_FULL
            if stores and (deletes or consumed):
                try:
                    await self._apply([], deletes, consumed)
                except StoreError as again:
                    self.log.error("store.failed", code=again.code,
                                   error=again.message, deletes=len(deletes))
                    self._unsaved = (list(deletes), list(consumed))
            elif deletes or consumed:
                self._unsaved = (list(deletes), list(consumed))
            return {m.id: exc for m in stores}
        # an insert committed, or the deletes made room: open the door again
        if self.store_full and (stores or await self._room()):
            self.store_full = False
            self.log.info("store.space", deletes=len(deletes))
        return None

    async def _commit_apart(self, stores: list, deletes: list, consumed: list) -> dict:
        """A batch failed for a reason other than space (one message the store cannot
        take): commit the deletes, then every message on its own, so only the culprit
        is refused and the other producers' messages are stored and confirmed."""
        refused: dict = {}
        for part in ([], *([m] for m in stores)):
            try:
                await self._apply(part, [] if part else deletes, [] if part else consumed)
            except Exception as exc:
                if not isinstance(exc, StoreError):
                    exc = StoreError(f"the message store failed: {exc!r}",
                                     code="store_failed")
                for m in part or stores:
                    refused.setdefault(m.id, exc)
                self.log.error("store.refused", code=exc.code, error=exc.message,
                               msg=part[0].id if part else None)
                if not part:
                    return {m.id: exc for m in stores}   # not even the deletes: give up
        return refused or None

    async def _room(self) -> bool:
        try:
            if self._threaded_store:
                return await in_thread(self.store.room)
            return self.store.room()
        except StoreError as exc:
            self.log.error("store.failed", code=exc.code, error=exc.message, doing="room")
            return False

    async def _apply(self, stores: list, deletes: list, consumed: list = (),
                     durable: bool = True) -> None:
        # ``consumed`` only when there are some: a store written before it existed (a
        # test double) keeps working for everything else.
        args = (stores, deletes, (), consumed) if consumed else (stores, deletes)
        # (a commit without an fsync still goes to a worker thread while commits are
        # slow: on a disk busy writing back, even a page-cache write may block)
        nosync = self._ack_syncer is not None and (not stores or not durable)
        if not self._threaded_store:
            self.store.apply(*args)
        elif ((self.commit_seconds < INLINE_COMMIT_S
               and len(stores) + len(deletes) + len(consumed) <= INLINE_MAX_ROWS)
              or (self.commit_seconds < INLINE_SMALL_COMMIT_S
                  and len(stores) + len(deletes) <= INLINE_SMALL_ROWS)):
            self.inline_commits += 1
            self._timed_apply(args, durable)
        else:
            await in_thread(self._timed_apply, args, durable)
        if nosync:
            self._ack_syncer.poke()   # written, not fsynced: synced within ACK_SYNC_S

    def _timed_apply(self, args: tuple, durable: bool = True) -> None:
        """``store.apply(*args)``, its duration folded into ``commit_seconds``."""
        began = time.perf_counter()
        try:
            if durable:
                self.store.apply(*args)
            else:
                self.store.apply(*args, durable=False)
        finally:
            took = time.perf_counter() - began
            self.commit_seconds += (took - self.commit_seconds) * 0.2
            if durable and args[0]:   # an insert's fsync: what a held batch would wait
                self._insert_seconds += (took - self._insert_seconds) * 0.2

    def _log_event(self, a: Log) -> None:
        if self._event_sink is not None:
            fields = a.fields
            self._event_sink(a.event, _client_ids(fields) if a.event.startswith("message.")
                             else fields)
            return
        event = a.event
        if event.startswith("message."):
            if self._message_events:
                self.log.info(event, **_client_ids(a.fields))
        elif event in _PER_ADVISORY and not self._advisory_events:
            self.log.debug(event, **a.fields)   # one line per frame: debug only
        else:
            self.log.info(event, **a.fields)

    # ------------------------------------------------------------------ runtime changes
    def _admin(self, frame: Admin, now: float, actions: list) -> Any:
        """Run an operator's command (node/admin.py); the reply, or an Error."""
        from treefed.node import admin

        try:
            if frame.command == "link.list":
                return StatReply(admin.link_list(self))
            if frame.command == "link.add":
                return StatReply(admin.link_add(self, frame.args))
            if frame.command == "link.del":
                return StatReply(admin.link_del(self, frame.args.get("name"), now, actions))
            if frame.command == "reload":
                return StatReply(admin.reload(self, now, actions))
            if frame.command == "explain":
                from treefed.ops.explain import explain_view

                return StatReply(explain_view(self, str(frame.args.get("dst", ""))))
            raise TreefedError(f"unknown admin command {frame.command!r} (link.add, "
                               "link.del, link.list, reload)", code="bad_request")
        except TreefedError as exc:
            self.log.warning("admin.refused", command=frame.command, error=exc.message)
            return Error(exc.code, exc.message, "stat")

    async def reload(self) -> dict:
        """Re-read the config file (SIGHUP), between two batches of the site task.
        Raises TreefedError (nothing changed) when it cannot be applied."""
        from treefed.node import admin

        async with self._batch_lock:
            now = time.time()
            actions: list = []
            result = admin.reload(self, now, actions)
            await self._perform(actions, now)
        return result

    def _start_dialer(self, dialer: Dialer) -> None:
        async def run() -> None:
            with trio.CancelScope() as scope:
                dialer.scope = scope
                await self._dial_loop(dialer)

        self._nursery.start_soon(run)

    def add_connector(self, nc: Any) -> list[Dialer]:
        """Start dialing a new network connector (validated config)."""
        if self._nursery is None:
            raise TreefedError("the broker is not serving yet: no link can be started",
                               code="bad_request")
        added = []
        for target, name in _dial_targets(nc.uri, "network_connector.uri"):
            d = Dialer(nc.link_settings(), target, name, username=nc.username or None,
                       password=nc.password or None)
            if self._client_ssl is None and any(e.scheme == "ssl"
                                                for e in target.endpoints):
                self._client_ssl = self.config.security.tls.client_context()
            self.dialers.append(d)
            added.append(d)
            self._start_dialer(d)
        self.config = dataclasses.replace(
            self.config, network_connectors=(*self.config.network_connectors, nc))
        return added

    def remove_connector(self, name: str, now: float, actions: list) -> list[dict]:
        """Stop a network connector: no more dialing; its live link says bye and goes
        down (its unacked forwards are requeued by the Site, as for any lost link)."""
        removed = []
        for d in [d for d in self.dialers if d.settings.name == name
                  and d.settings.kind == "mesh"]:
            d.removed = True
            c = self._conns.get(d.conn) if d.conn is not None else None
            if c is not None and not c.dead:
                actions.append(Close(c.id, Bye("link removed by an operator")))
            elif d.scope is not None:
                d.scope.cancel()     # waiting to (re)connect: nothing to close
            self.dialers.remove(d)
            removed.append(d.status())
        self.config = dataclasses.replace(self.config, network_connectors=tuple(
            nc for nc in self.config.network_connectors if nc.name != name))
        return removed

    def set_security(self, sec: Any) -> None:
        """New users / permissions (a reload): new logins and every open connection's
        screen use them from now on."""
        old = self._login
        self._auth = sec.authenticator() if sec.authentication else None
        if self._auth is None:
            self._login = None
        else:
            if old is not None:   # failures and lockouts outlive a reload
                self._auth.throttle = old.throttle
            self._login = LoginGate(self._auth, AUTH_THREADS)
        self._authz = sec.authorizer()
        for c in self._conns.values():
            if c.guard is not None:
                c.guard.authz = self._authz

    def set_logging(self, logging: Any) -> None:
        from treefed.log import set_level

        set_level(logging.level)
        self.log = get_logger(broker=self.broker_id)
        self._message_events = logging.message_events
        self.site.broker.log_messages = logging.message_events
    def _log_drop(self, a: Drop, now: float) -> None:
        """A refused advisory: every one to an engine's event sink; to the log, the first
        per (link, peer, reason) and interval at info, the rest at debug and counted into
        one ``advisory.dropped.summary`` line (``DropDigest``)."""
        if self._event_sink is not None:
            self._event_sink("advisory.dropped", a.fields())
        elif self._advisory_events or self._drops.add(a, now):
            self.log.info("advisory.dropped", **a.fields())
        else:
            self.log.debug("advisory.dropped", **a.fields())

    # ------------------------------------------------------------------ statistics
    def listen_uris(self) -> list[str]:
        return [f"{scheme}://{h}:{p}" for scheme, (h, p) in zip(self._schemes, self.addresses)]

    def connections(self) -> list[dict]:
        """One dict per live connection (stat's ``conns``, the monitor's /connz).  A
        link also shows the listeners its peer announced (``listen``) and the last
        ping's round trip (``rtt``)."""
        out = []
        for c in self._conns.values():
            if c.dead:
                continue
            info = {"conn": c.id, "kind": c.kind, "protocol": c.framed.protocol,
                    "remote": c.remote, "peer": c.peer,
                    "queued": len(c.out), "paused": c.paused, "since": round(c.opened, 3)}
            if c.kind is _LINK:
                info["rtt"] = round(c.rtt, 6) if c.rtt is not None else None
                info["dialed"] = c.dialer is not None
                listen = c.hello.options.get("listen") if c.hello is not None else None
                if isinstance(listen, list):
                    info["listen"] = [u for u in listen if isinstance(u, str)][:8]
            if c.user is not None:
                info["user"] = c.user
            out.append(info)
        return out

    def link_bridges(self, conns: list[dict] | None = None) -> list[tuple[dict, Any]]:
        """``(connection info, Bridge)`` for every live link that has its bridge, in
        connection order (the monitor's views and metrics, ``treefed explain``);
        ``conns``: a ``connections()`` the caller already has."""
        site = self.site
        return [(c, b) for c in (self.connections() if conns is None else conns)
                if c["kind"] == "link" and (b := site.bridge(c["conn"])) is not None]

    def statistics_idle_poll(self) -> dict | None:
        """``[broker] idle_poll_us``'s poller: window, hits, misses; None when off."""
        return None if self._poller is None else self._poller.statistics()

    def statistics(self) -> dict:
        """The Site's statistics plus the node's own: listeners, connectors, connections."""
        stats = self.site.statistics()
        stats["name"] = self.config.broker.name
        stats["node_type"] = self.site.node_type
        stats["listeners"] = self.listen_uris()
        stats["connectors"] = [d.status() for d in self.dialers]
        stats["conns"] = self.connections()
        stats["lost_links"] = list(self.lost_links.values())
        stats["batches"] = self.batches
        stats["commits"] = self.commits
        stats["inline_commits"] = self.inline_commits
        stats["early_held"] = self.early_held             # concurrent store and dispatch
        stats["early_cancelled"] = self.early_cancelled   # consumed before their commit
        stats["store_full"] = self.store_full
        poll = self.statistics_idle_poll()
        if poll is not None:
            stats["idle_poll"] = poll
        stats["gc"] = gc_statistics()   # the process's collector (node/gcwatch.py)
        if self._auth is not None or self._tree_scope is not None:
            stats["security"] = {
                "authentication": self._auth is not None,
                "tree_scope": self._tree_scope is not None,
                "denied": sum(c.guard.denied for c in self._conns.values()
                              if c.guard is not None and not c.dead),
                "authz_cache": self._authz.statistics() if self._authz else None}
        return stats
