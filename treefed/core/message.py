"""The broker's in-memory message record.

A Message is created once when a producer's Send (or a link's Forward) is accepted and
then shared by reference: queues hold it, topic subscriptions each get the same object,
deliveries are frames built from it.  ``path`` is the tuple of broker ids the message has
left, in order (empty for a message produced here).  Times are epoch seconds taken from
the ``now`` the shell passed in; ``expires == 0`` means never.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Message"]


@dataclass(slots=True, eq=False)
class Message:
    id: str                      # producer-assigned, unique across the estate (dup detection)
    dst: str                     # canonical destination, e.g. "queue://Store1.Incoming"
    headers: dict[str, Any] = field(default_factory=dict)
    body: bytes = b""
    persistent: bool = False
    priority: int = 4            # JMS priority 0..9; informational for dispatch order
    timestamp: float = 0.0       # when the first broker accepted it
    expires: float = 0.0         # absolute expiry time, 0 = never
    reply_to: str | None = None
    path: tuple[str, ...] = ()   # brokers this message has left, oldest first
    redelivered: int = 0         # deliveries that were nacked or lost with their consumer
    rested: bool = False         # it once found no eligible consumer here and waited: a
                                 # "replay" consumer (tree) may then take it back along its path
    replay_at: float = 0.0       # when it rested + the broker's replay_delay: before that it
                                 # waits for a local consumer to return rather than go back up
    nbytes: int = -1             # ``records.msg_size`` once computed (-1: not yet): the
                                 # memory and limit books add and subtract the same figure
    spilled: bool = False        # past its queue's page: it lives in the store only
                                 # (core/broker.py); the core keeps no reference to it

    @property
    def size(self) -> int:
        """Bytes counted against max_bytes / max_message_bytes limits."""
        return len(self.body) + 64 + sum(len(k) + 16 for k in self.headers)

    def expired(self, now: float) -> bool:
        return self.expires != 0 and now >= self.expires
