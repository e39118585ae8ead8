"""Resync: interest kept across a short tree-link outage, and the digest that proves both
ends still agree on it (issue 18 part 3).

Theory of operation
-------------------
When a tree link drops, both ends used to forget: the parent every interest learned
from the child (its whole subtree), the child what it had advertised; on reconnect the
child re-sent everything -- one frame per consumer below it, 1,000+ for a region.

With ``resync_grace`` > 0 (the child's connector setting, sent to the parent in the
hello options) each end *holds* its side for that many seconds:

* the child: ``Held`` -- the add frames it had sent up, by interest key;
* the parent: the Interest objects learned from that child.  They are forgotten as
  before (demand removed, removals sent up), so routing during the outage is unchanged;
  they are only *remembered*, to be re-admitted without a frame from the child.

On reconnect the child's hello carries the digest (``"count:hash"``) of what it holds; the
parent compares with the digest of what it remembers for that child (same broker id,
same link name).  Equal: the parent re-admits them on the new link (demand re-created,
advertised up again as for a fresh add, but no frame crosses the flapped link) and
answers ``"delta"``; the child then sends only the difference --
adds for interest that appeared during the outage, removals for interest that left.
Otherwise (parent restarted, grace expired, anything differs) the parent drops what it
held and answers ``"full"``: the old full replay.  A child that restarted holds nothing
and always gets a full resync.

``digest`` is order-independent and stable across processes (blake2b, not ``hash()``,
which is salted per process): the XOR of one 128-bit hash per interest key, plus the
count.  Nothing here has state or does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any, Iterable

__all__ = ["Held", "digest", "OPTION", "DELTA", "FULL"]

#: Hello.options key carrying the resync offer (child) or verdict (parent)
OPTION = "resync"
DELTA = "delta"
FULL = "full"


def digest(keys: Iterable[tuple[str, tuple[str, ...]]]) -> str:
    """Order-independent digest of interest keys ``(consumer, path)``."""
    acc = 0
    n = 0
    for consumer, path in keys:
        h = blake2b(digest_size=16)
        h.update(consumer.encode())
        for broker in path:
            h.update(b"\0")
            h.update(broker.encode())
        acc ^= int.from_bytes(h.digest(), "big")
        n += 1
    return f"{n}:{acc:032x}"


@dataclass(slots=True)
class Held:
    """What the child advertised on its parent link when it dropped."""

    link: str                                       # the connector's name
    deadline: float                                 # forgotten after this
    frames: dict[tuple, Any] = field(default_factory=dict)   # key -> add Advisory

    def digest(self) -> str:
        return digest(self.frames)
