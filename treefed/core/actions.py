"""Actions: what the pure layers (core/, federation/) ask the shell to do.

Every pure entry point returns ``list[Action]``.  The shell (node/, or the scenario
engines) performs them *in order*, with one batching guarantee that the core relies on:

    All StoreMessage / DeleteMessage actions produced while handling one batch of input
    are committed to the message store before any Out action of that batch is written.

That is what makes a ``Receipt`` (an Out) mean "committed", and lets many messages
share one SQLite transaction (group commit).  One exception, which the core never
notices: the broker shell may write the ``Deliver`` of a message stored in the batch to a
*local client* consumer before the commit and hold the commit for that consumer's ack
(node/node.py, ``EARLY_PROBE_S``); an ack that comes first cancels the message's
StoreMessage and DeleteMessage together, and the batch's other Outs (its receipts) still
wait — a Receipt then means "committed, or already consumed".

A ``DeleteMessage(consumed=True)`` also asks the shell to remember the id as consumed, in
that same commit (duplicate detection across restarts, see core/broker.py; for a message
consumed before its commit, in the shell's next commit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from treefed.wire.frames import Error, Frame

__all__ = ["Action", "Out", "Close", "StoreMessage", "DeleteMessage", "Log", "SharedFields",
           "Pause", "Resume", "Drop", "PageIn"]


class Action:
    __slots__ = ()


@dataclass(slots=True)
class Out(Action):
    """Write ``frame`` to connection (client or broker link) ``conn``."""

    conn: str
    frame: Frame


@dataclass(slots=True)
class Close(Action):
    """Flush, send ``error`` if given, then close connection ``conn``."""

    conn: str
    error: Error | None = None


@dataclass(slots=True)
class StoreMessage(Action):
    """Persist ``msg`` (a core.message.Message) durably before this batch's Outs."""

    msg: Any


@dataclass(slots=True)
class DeleteMessage(Action):
    """Remove the persisted copy of message ``msg_id`` held for destination ``dst``.

    ``consumed``: the delete settles a queue message a *local* consumer acknowledged; the
    shell records the id durably in the same commit (``store.apply(..., consumed=)``) so
    that after a restart a late re-forwarded copy is still known as a duplicate."""

    msg_id: str
    dst: str
    consumed: bool = False


@dataclass(slots=True)
class PageIn(Action):
    """Read back from the store, after this batch's commit, up to ``n`` messages of
    queue ``dst`` that live there only (core/broker.py): rows after store seq ``after``,
    oldest first, leaving out the ids in ``exclude`` (held in memory); hand them to
    ``Broker.page_in``.  ``first`` (with ``after`` 0): the id of the spell's first
    stored-only message -- rows from its row on need no ``exclude``."""

    dst: str
    n: int
    after: int
    exclude: frozenset = frozenset()
    first: str | None = None


class SharedFields(dict):
    """``Log`` fields that several Log actions share, and that nobody changes after they
    are made: one advisory fanned out to a thousand sites is logged the same way at
    each, so the pure layers hand every one of them the same dict, and a writer may
    render it once (``log.EventWriter`` does, by identity)."""

    __slots__ = ()


@dataclass(slots=True)
class Log(Action):
    """One event-log line: ``event`` is a name from events.EVENTS."""

    event: str
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Pause(Action):
    """Producer flow control: stop reading frames from ``conn`` (destination full)."""

    conn: str
    dst: str


@dataclass(slots=True)
class Resume(Action):
    """Producer flow control: read from ``conn`` again."""

    conn: str


@dataclass(slots=True)
class Drop(Action):
    """An advisory refused by the federation layer (``federation/``): the shell renders
    it as one ``advisory.dropped`` line (``log()``), and may aggregate repeated ones.

    ``reason`` is a name from events.DROP_REASONS; ``link`` / ``peer`` the link it came
    over (or was to be sent on); the rest describe the advisory."""

    reason: str
    link: str
    peer: str
    consumer: str
    dst: str
    origin: str
    kind: str = "add"

    def fields(self) -> dict[str, Any]:
        return {"link": self.link, "peer": self.peer, "consumer": self.consumer,
                "dst": self.dst, "origin": self.origin, "kind": self.kind,
                "reason": self.reason}

    def log(self) -> Log:
        """The ``advisory.dropped`` line this stands for."""
        return Log("advisory.dropped", self.fields())
