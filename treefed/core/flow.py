"""Flow control: what a broker admits now, what it refuses, what waits, and when the
waiting producers resume.

Theory of operation
-------------------
Limits are decided here and acted on by ``Broker`` (core/broker.py), which owns the
state records (core/records.py):

* a destination's policy (core/policy.py): ``limit_verdict(d, size)`` answers ADMIT,
  DROP_OLDEST (the broker drops pending messages while ``full``) or BLOCK, or raises
  LimitError for a message over ``max_message_bytes`` and for ``reject_newest``.  Held
  limits apply to queues only (topics hold nothing) and an empty destination always
  takes one message, so a limit never deadlocks;
* a client connection's share of the broker (issue #12, defect 7):
  ``check_conn_limits`` refuses a consumer past ``max_subscriptions_per_conn`` or one
  whose prefetch (credit) would pass ``max_inflight_per_conn`` summed;
* memory (defect 8): ``memory_refusal`` is the error a send or forward gets when the
  message bytes held would pass ``max_memory_bytes`` (the books: ``Broker._mem``).

Blocked producers ("block"): a Send or Forward to a full destination is parked, not
accepted, on its connection (``Conn.parked``), which is paused; its later frames queue
behind it in order.  ``Blocked`` keeps which connection waits on which destination
(``Conn.blocked_on`` / ``Dest.blocked``) and the destinations that gained room since
(``room``: whatever frees a held message calls ``note_room``); ``released()`` yields, in
order, the connections whose destination now has room, and the broker re-runs their
parked frames (``Broker._run_parked``): admitted in order, resumed when all went in.

Public surface: ``ADMIT`` / ``DROP_OLDEST`` / ``BLOCK``, ``limit_verdict``, ``full``,
``check_conn_limits``, ``memory_refusal``, ``Blocked`` (``room``, ``block``,
``note_room``, ``leave``, ``released``).  Pure: no I/O, no clock, no module state.
"""

from __future__ import annotations

from collections import deque
from typing import Iterator

from treefed.core.records import Conn, Dest
from treefed.errors import LimitError, RemoteError

__all__ = ["ADMIT", "DROP_OLDEST", "BLOCK", "limit_verdict", "full", "check_conn_limits",
           "memory_refusal", "Blocked"]

#: ``limit_verdict`` answers
ADMIT = 0          # take the message
DROP_OLDEST = 1    # take it after dropping pending messages while the destination is full
BLOCK = 2          # park it (and its connection) until the destination has room


def full(d: Dest, size: int) -> bool:
    """Queue ``d`` cannot take a ``size``-byte message under its held limits."""
    held = len(d.pending) + d.inflight + d.spilled   # spilled: in the store only
    if not held:
        return False   # an empty destination always takes one message (no deadlock)
    p = d.policy
    return bool((p.max_messages and held >= p.max_messages)
                or (p.max_bytes and d.bytes + size > p.max_bytes))


def limit_verdict(d: Dest, size: int) -> int:
    """ADMIT, DROP_OLDEST or BLOCK for a ``size``-byte message to limited ``d``; raises
    LimitError to refuse it."""
    p = d.policy
    if p.max_message_bytes and size > p.max_message_bytes:
        raise LimitError(f"message of {size} bytes exceeds max_message_bytes "
                         f"{p.max_message_bytes} of {d.name}")
    if d.topic or not (p.max_messages or p.max_bytes):
        return ADMIT   # held-message limits apply to queues; topics hold nothing
    if not full(d, size):
        return ADMIT
    behaviour = p.limit_behaviour
    if behaviour == "reject_newest":
        raise LimitError(f"{d.name} is full ({len(d.pending) + d.inflight} messages, "
                         f"{d.bytes} bytes)")
    if behaviour == "drop_oldest":
        return DROP_OLDEST
    return BLOCK


def check_conn_limits(cs: Conn, prefetch: int, max_subscriptions: int,
                      max_inflight: int) -> None:
    """One client connection's share of this broker (issue #12, defect 7): a client
    opening endless subscriptions is refused here, at its own broker, before its
    interest can fill a parent's per-child cap and starve every other consumer.
    Raises LimitError; 0 = unlimited."""
    if max_subscriptions and len(cs.consumers) >= max_subscriptions:
        raise LimitError(f"connection already has {len(cs.consumers)} subscriptions "
                         f"(max_subscriptions_per_connection {max_subscriptions})")
    if max_inflight and cs.credit + prefetch > max_inflight:
        raise LimitError(f"prefetch {prefetch} would let this connection hold "
                         f"{cs.credit + prefetch} messages in flight "
                         f"(max_inflight_per_connection {max_inflight})")


def memory_refusal(held: int, dst: str, size: int, cap: int) -> RemoteError:
    """The error for a ``size``-byte message to ``dst`` that would take the ``held``
    bytes of messages in memory past ``max_memory_bytes`` ``cap``."""
    return RemoteError(f"broker memory full: {held} bytes of messages "
                       f"held in memory, a "
                       f"{size}-byte message to {dst} would pass max_memory_bytes "
                       f"{cap}; retry later", code="memory_full")


class Blocked:
    """Connections parked on full destinations, and the destinations that gained room."""

    __slots__ = ("room",)

    def __init__(self) -> None:
        self.room: deque[Dest] = deque()   # full destinations that gained room, in order

    def block(self, cs: Conn, d: Dest) -> None:
        """``cs`` waits for room at ``d`` (its parked frames are the caller's)."""
        cs.blocked_on = d
        d.blocked.append(cs)

    def note_room(self, d: Dest) -> None:
        """``d`` may have room now (a held message left it)."""
        if not d.roomy:
            d.roomy = True
            self.room.append(d)

    def leave(self, cs: Conn) -> None:
        """``cs`` is gone: its parked frames are discarded unaccepted, it waits no more."""
        cs.parked = None
        if cs.blocked_on is not None:
            blocked = cs.blocked_on.blocked
            if cs in blocked:
                blocked.remove(cs)
            cs.blocked_on = None

    def released(self) -> Iterator[Conn]:
        """The connections to re-run, in order: those blocked on a destination that
        has room now (or was deleted: their frames are refused).  Lazy: re-running one
        may note room elsewhere, which this same iteration then serves."""
        room = self.room
        while room:
            d = room.popleft()
            d.roomy = False
            if d.alive and full(d, 0):
                continue
            blocked, d.blocked = d.blocked, []
            for cs in blocked:
                if cs.blocked_on is d:
                    cs.blocked_on = None
                    yield cs
