"""Message ids scoped by producer (issue #12, defect 2: message-id squatting).

Theory of operation
-------------------
The core de-duplicates persistent messages by id: a copy of a message it holds, or
one a local consumer acked, is dropped -- that is what makes a producer's resend after
a failover and a link's re-forward after a reconnect or restart harmless.  But ids are
chosen by producers, so a client that saw one id could pre-send the next ones, and the
victim's sends were confirmed and then dropped as duplicates; two applications that
chose the same id collided the same way.

So the id a broker works with is never the bare client id.  The broker a client is
attached to appends the client's *producer scope*: ``<client id> SEP <scope>``, where
``scope = H(H(user, producer key), destination)``.  The producer key is a random secret the client
library makes once per Connection and sends in every hello (reconnects included); the
broker only ever shows its hash, so nobody else can produce a message in that scope --
not even one who read the qualified ids of delivered messages.  A client without a key
gets a fresh random scope per connection.  Everything downstream (forwards, stores,
acks, duplicate checks) uses the qualified id unchanged, so:

* one producer can never suppress another's message (their ids differ in the scope);
* the same producer's resend after a failover carries the same qualified id (same
  key), and a link's re-forward carries the id as forwarded: both still duplicates.

Clients see their own ids: receipts, refusals and delivered messages are shown with
the scope stripped (``original``).  Pure: hashing only.
"""

from __future__ import annotations

import base64
import hashlib

__all__ = ["SCOPE_SEP", "SCOPE_ID_ROOM", "producer_scope", "destination_scope", "qualify",
           "original"]

#: Separates a client's id from its producer scope (ASCII unit separator).
SCOPE_SEP = "\x1f"
#: Characters a qualified id adds (the separator and an 11-character scope), with room.
SCOPE_ID_ROOM = 64


def producer_scope(key: str, user: str | None = None) -> str:
    """The public scope of producer ``key`` (secret) for authenticated ``user``."""
    digest = hashlib.blake2b(f"{user or ''}\0{key}".encode(), digest_size=8,
                             person=b"treefed-prod").digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def destination_scope(producer: str, dst: str) -> str:
    """The scope of a producer's ids on one destination (the same id on two
    destinations is two messages)."""
    digest = hashlib.blake2b(f"{producer}\0{dst}".encode(), digest_size=8,
                             person=b"treefed-dest").digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def qualify(msg_id: str, scope: str) -> str:
    return f"{msg_id}{SCOPE_SEP}{scope}"


def original(msg_id: str) -> str:
    """The client's own id of a qualified id (unchanged when it is not qualified)."""
    return msg_id.rpartition(SCOPE_SEP)[0] if SCOPE_SEP in msg_id else msg_id
