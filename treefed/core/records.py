"""The broker's state records: connections, consumers, destinations.

Theory of operation
-------------------
``Broker`` (broker.py) owns one ``Conn`` per connection, one ``Consumer`` per
subscription or network demand entry, and one ``Dest`` per live destination; the other
parts of the core (dispatch.py, flow.py) read and update them but never own them.  They
are plain slotted records: every invariant between them is kept by ``Broker``'s entry
points (see broker.py).  ``ConsumerInfo`` is the read-only snapshot callers outside the
core get (``info``); ``msg_size`` is a message's byte count for the memory and limit books.

Public surface: ``Conn``, ``Consumer``, ``Dest``, ``ConsumerInfo``, ``info``, ``msg_size``,
``NO_MESSAGES`` / ``NO_DESTS`` / ``NO_PENDING`` (the shared empties below), ``INF``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from treefed.core.message import Message

__all__ = ["Conn", "Consumer", "Dest", "ConsumerInfo", "info", "msg_size", "NO_MESSAGES",
           "NO_DESTS", "NO_PENDING", "INF"]

INF = float("inf")

# Shared empties (memory: a mesh estate holds millions of network consumers, most of
# which never carry a message).  Never mutated: every insertion site swaps in a fresh
# container first (``_give``, ``_attach``, ``_new_dest``, ``_push_pending``,
# ``_requeue_front``); reads, ``pop``, ``clear`` and ``del`` of a present key are safe.
NO_MESSAGES: dict = {}      # Consumer.inflight until its first message
NO_DESTS: dict = {}         # Consumer.dests until it is attached to a destination
NO_PENDING: deque = deque()  # Dest.pending until a message waits (an empty deque: 760 B)


def msg_size(m: Message) -> int:
    """``Message.size`` without a generator per message (hot path), computed once per
    message and kept in ``m.nbytes``: admission, settle and the limit books each ask for
    it (issue #14), and they then add and subtract the very same figure.  A ``Paged``
    body has the body's length, so paging does not change it."""
    n = m.nbytes
    if n < 0:
        h = m.headers
        n = len(m.body) + 64 if not h else len(m.body) + 64 + 16 * len(h) + sum(map(len, h))
        m.nbytes = n
    return n


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    """A read-only snapshot of one consumer (for federation and statistics)."""

    conn: str
    sub_id: str
    dst: str                    # canonical pattern, wildcards allowed
    selector: str | None
    prefetch: int
    priority: int
    peer: str | None            # broker id when this is network demand
    message_ttl: int
    fallback: bool
    local_only_ok: bool
    inflight: int               # delivered / forwarded, not yet acked
    queued: int                 # topic messages waiting for this subscriber's credit
    delivered: int              # messages given to it so far


class Conn:
    __slots__ = ("name", "consumers", "forwarded", "parked", "blocked_on", "temps", "revisit",
                 "credit")

    def __init__(self, name: str) -> None:
        self.name = name
        self.credit = 0                               # local consumers' prefetch, summed:
        #                                               the most it may have in flight
        self.consumers: dict[str, Consumer] = {}     # sub_id -> consumer
        self.forwarded: dict[str, Consumer] = {}     # msg id -> network consumer holding it,
        #                                              so a ForwardAck (ids only) finds it
        self.parked: deque | None = None              # Send/Forward frames waiting (paused)
        self.blocked_on: Dest | None = None          # the full destination we wait for
        self.temps: list[str] = []                    # temp destinations this conn owns
        self.revisit = False                          # tree link: a replayed message may
                                                      # come back to a broker on its path


class Consumer:
    __slots__ = ("conn", "cs", "sub_id", "pattern", "selector", "prefetch", "priority", "peer",
                 "message_ttl", "fallback", "local_only_ok", "replay", "topic", "inflight", "dests",
                 "backlog", "gid", "seq", "delivered")

    def __init__(self, cs: Conn, sub_id: str, pattern: str, selector: Any, prefetch: int,
                 priority: int, peer: str | None, message_ttl: int, fallback: bool,
                 local_only_ok: bool, gid: str, seq: int, replay: bool = False) -> None:
        self.conn = cs.name
        self.cs = cs
        self.sub_id = sub_id
        self.pattern = pattern
        self.selector = selector              # object with .matches(headers, message=), or None
        self.prefetch = prefetch              # credit: most messages in flight at once
        self.priority = priority
        self.peer = peer                      # not None: network demand toward that broker
        self.message_ttl = message_ttl        # network only: max path length offered, -1 = any
        self.fallback = bool(fallback)        # route_unknown_up: last resort for queues
        self.local_only_ok = local_only_ok    # network demand allowed to see local_only dsts
        self.replay = replay                  # tree: a rested message may go back along its path
        self.topic = pattern.startswith("topic://") or pattern.startswith("temp-topic://")
        self.inflight: dict[str, Message] = NO_MESSAGES  # msg id -> message, in delivery
        #                                                   order (shared empty until used)
        self.dests: dict[Dest, None] = NO_DESTS  # destinations it is attached to (ordered
        #                                            set; shared empty until attached)
        self.backlog: deque | None = None        # topics: messages waiting for credit
        self.gid = gid                           # "<broker>/<conn>/<sub_id>" for events
        #                                          (local consumers only; None for demand)
        self.seq = seq                           # creation order: tie-break within a level
        self.delivered = 0


class Dest:
    __slots__ = ("name", "topic", "temp", "stored", "policy", "local_only", "limited",
                 "consumers", "fallbacks", "replayers", "pending", "inflight", "bytes", "enqueued",
                 "dequeued", "expiring", "next_expiry", "blocked", "roomy", "owner", "alive",
                 "replay_timer", "touched", "spilled", "spilled_bytes", "spill_cursor",
                 "spill_paging", "spill_first")

    def __init__(self, name: str, policy: Any) -> None:
        self.name = name
        self.topic = name.startswith("topic://") or name.startswith("temp-topic://")
        self.temp = name.startswith("temp-")
        self.stored = not self.topic and not self.temp   # persistent messages hit the store
        self.policy = policy
        self.local_only = policy.local_only
        self.limited = policy.limited
        self.consumers: list[Consumer] = []   # priority desc; rotated within a level
        self.fallbacks = 0                     # how many of them are fallback consumers
        self.replayers = 0                     # how many may take a rested message back
        self.pending: deque[Message] = NO_PENDING  # queues: waiting for an eligible
        #                                              consumer (shared empty until used)
        self.inflight = 0                      # given to consumers, not yet acked
        self.bytes = 0                         # queues: size of pending + in-flight
        self.enqueued = 0
        self.dequeued = 0
        self.expiring = 0                      # pending messages that carry an expiry
        self.next_expiry = INF                # <= earliest expiry among pending
        self.blocked: list[Conn] = []         # conns whose parked send waits for room here
        self.roomy = False                     # already listed in Broker._room
        self.owner: str | None = None          # temp destinations: owning conn
        self.alive = True
        self.replay_timer = 0.0                # latest replay timer scheduled for it
        self.touched = -1.0                    # last message admitted (idle collection;
        #                                        -1: none yet)
        # persistent messages past the page, in the store only (core/broker.py)
        self.spilled = 0                       # how many
        self.spilled_bytes = 0                 # their msg_size sum (counted in ``bytes``)
        self.spill_cursor = 0                  # store seq of the last one paged back in
        self.spill_paging = False              # a PageIn for it is out
        self.spill_first: str | None = None    # id of the first one of this spell


def info(c: Consumer) -> ConsumerInfo:
    return ConsumerInfo(c.conn, c.sub_id, c.pattern, getattr(c.selector, "text", None),
                        c.prefetch, c.priority, c.peer, c.message_ttl, c.fallback,
                        c.local_only_ok, len(c.inflight), len(c.backlog) if c.backlog else 0,
                        c.delivered)
