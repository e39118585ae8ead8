"""Dispatch: the one place that decides which consumer gets a message.

Theory of operation
-------------------
A destination (``Dest``, core/records.py) keeps its matching consumers sorted by priority
(highest first) and rotated within a level, so no decision here consults an index.

* ``eligible(c, m, d, now)``: may consumer ``c`` be given ``m`` at all (credit aside)?
  Its selector matches; a local consumer does not already hold a copy (an Ack names the
  id); a network consumer (``c.peer``) is never given a message of a ``local_only``
  destination it is not cleared for, nor one whose path holds its peer (never back to a
  broker the message left -- unless it is a tree replay consumer and the message rested
  here: at once for demand, after ``replay_at`` for a fallback), nor one whose path is
  already ``message_ttl`` long, nor a second copy on the same link (a ForwardAck names
  ids only).
* ``pick(d, m, now)`` (queues): the index of the first eligible regular consumer with
  credit -- i.e. the highest priority level with credit, round-robin within it; if no
  regular consumer is eligible at all, the first eligible fallback (route_unknown_up)
  with credit.  Otherwise ``WAIT`` (an eligible regular consumer exists, only credit is
  missing: the message waits here) or ``NOBODY`` (no consumer here could ever take it:
  the broker lets it *rest*, after which a replay consumer may take it back up its path).
* ``take(d, i)``: consumer ``i`` was picked: it moves to the end of its priority level
  (the round robin) and is returned.
* ``fanout(d, m, now)`` (topics): the subscriptions that get a copy, in order -- every
  eligible regular one, then every eligible fallback, one per network connection.

The broker (core/broker.py) acts on these answers: it gives (Deliver / Forward frames,
in-flight books), queues topic copies for subscribers without credit, keeps messages
pending, rests them, and drains pending messages again whenever credit returns.

Public surface: ``NOBODY``, ``WAIT``, ``eligible``, ``pick``, ``take``, ``fanout``.
Pure: reads the records (``take`` only reorders ``d.consumers``); no I/O, no clock (``now``
is an argument), no module state.
"""

from __future__ import annotations

from typing import Iterator

from treefed.core.message import Message
from treefed.core.records import Consumer, Dest

__all__ = ["NOBODY", "WAIT", "eligible", "pick", "take", "fanout"]

#: ``pick``: no consumer here could ever take the message (credit aside)
NOBODY = -1
#: ``pick``: an eligible regular consumer exists, but none has credit now
WAIT = -2


def eligible(c: Consumer, m: Message, d: Dest, now: float) -> bool:
    """Consumer ``c`` may be given ``m`` of destination ``d`` (credit aside)."""
    if c.peer is not None:
        if d.local_only and not c.local_only_ok:
            return False
        path = m.path
        if c.peer in path and not (c.replay and m.rested and (
                not c.fallback or m.replay_at <= now)):
            return False   # never back to a broker the message has left
        if c.message_ttl >= 0 and len(path) >= c.message_ttl:
            return False
        if m.id in c.cs.forwarded:
            return False   # one copy per link: a ForwardAck names ids only
    elif m.id in c.inflight:
        return False       # an Ack names the id: two in flight would be ambiguous
    sel = c.selector
    return sel is None or sel.matches(m.headers, message=m)


def pick(d: Dest, m: Message, now: float) -> int:
    """Index in ``d.consumers`` of the queue consumer to give ``m`` to, or ``WAIT`` /
    ``NOBODY`` (see the module docstring)."""
    cons = d.consumers
    regular = False
    for i, c in enumerate(cons):
        if c.fallback:
            continue
        if c.peer is None and c.selector is None:
            if m.id in c.inflight:   # eligible's answer for a plain local consumer,
                continue             # without the call: this is per message
        elif not eligible(c, m, d, now):
            continue
        if len(c.inflight) < c.prefetch:
            return i   # sorted by priority: the first with credit is the top level
        regular = True
    if regular:
        return WAIT
    if not d.fallbacks:
        return NOBODY
    for i, c in enumerate(cons):
        if c.fallback and len(c.inflight) < c.prefetch and eligible(c, m, d, now):
            return i
    return NOBODY


def take(d: Dest, i: int) -> Consumer:
    """Consumer ``i`` gets the next message: move it to the end of its level."""
    cons = d.consumers
    c = cons[i]
    j = i + 1
    n = len(cons)
    if j == n:
        return c   # already last (a lone consumer): nothing to move
    p = c.priority
    while j < n and cons[j].priority == p:
        j += 1
    if j - 1 > i:
        del cons[i]
        cons.insert(j - 1, c)
    return c


def fanout(d: Dest, m: Message, now: float) -> Iterator[Consumer]:
    """Topic: the subscriptions that get a copy of ``m``, in order -- eligible regular
    ones, then eligible fallbacks -- one per network connection.  Lazy: the broker gives
    each copy before the next is chosen."""
    links: set[str] | None = None
    for fallback_pass in (False, True):
        for c in d.consumers:
            if c.fallback is not fallback_pass or not eligible(c, m, d, now):
                continue
            if c.peer is not None:
                if links is None:
                    links = {c.conn}
                elif c.conn in links:
                    continue
                else:
                    links.add(c.conn)
            yield c
        if not d.fallbacks:
            break
