"""Guard: screens one connection's frames against permissions and tree scope.

Theory of operation
-------------------
The shell gives every connection whose peer authenticated to us a ``Guard`` (none at
all when authentication and tree confinement are off, so an open broker pays nothing).
``screen(conn, frame, out)`` runs before the frame reaches the Site and answers True
(pass it on) or False (refused: the refusal is appended to ``out``):

=================  =====================  ==============================================
frame              needs                  refusal
=================  =====================  ==============================================
Subscribe          read on its dst        Error(not_authorized, ref=subscription id)
Send               write on its dst       Error(not_authorized, ref=message id)
StatRequest        admin on ``>``         Error(not_authorized, ref="stat")
Advisory (add)     read + tree scope      Error(ref=consumer id), ``advisory.dropped``
                                          with reason ``forbidden``
Forward            write + tree scope     Error(ref=message id) *and* ForwardAck, so
                                          the sender does not hold it forever
=================  =====================  ==============================================

Refused means nothing happened: no consumer, no demand, no delivery, no advisory sent
on; other frames of the connection keep flowing.  Advisory removals always pass (their
add was refused or is being withdrawn).  A child's subtree grows with the brokers named
in the paths of its advisories, but only those the Site would let it claim
(``claimable``: not owned by another child), so a spoofed path cannot widen a scope.

One ``security.denied`` line is logged per (permission, destination) per connection —
a client hammering a forbidden queue cannot flood the log.  Counters are in ``denied``.
Never: does I/O, or decides anything about frames it does not list above.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from treefed.core.actions import Drop, Log, Out
from treefed.core.destinations import parse_destination
from treefed.errors import DestinationError
from treefed.security.authz import DENIED, Authorizer, denied
from treefed.security.tree_scope import ChildScope
from treefed.wire.frames import (Admin, Advisory, Error, Forward, ForwardAck, Send,
                                 StatRequest, Subscribe, Subtree)

__all__ = ["Guard", "STAT_REF"]

#: ``ref`` of the Error refusing a StatRequest (which carries no id of its own).
STAT_REF = "stat"
_MAX_LOGGED = 1000


class Guard:
    """One connection's screen; see the module docstring."""

    __slots__ = ("user", "authz", "scope", "claimable", "link", "peer", "dropped", "denied",
                 "_logged")

    def __init__(self, user: str | None, authz: Authorizer | None, *,
                 scope: ChildScope | None = None,
                 claimable: Callable[[str], bool] | None = None,
                 link: str | None = None, peer: str | None = None,
                 dropped: dict[str, int] | None = None) -> None:
        self.user = user                # authenticated user (None: authentication off)
        self.authz = authz              # None: no permission checks (authentication off)
        self.scope = scope              # a tree child's confinement, else None
        self.claimable = claimable      # may this child claim broker id X for its subtree?
        self.link = link                # link name and peer id, for advisory.dropped lines
        self.peer = peer
        self.dropped = dropped          # the Site's drop-reason counters, for stat
        self.denied = 0                 # frames refused on this connection
        self._logged: set[tuple[str, str]] = set()

    def screen(self, conn: str, frame: Any, out: list) -> bool:
        """True to pass ``frame`` on; False when refused (refusal appended to ``out``)."""
        kind = type(frame)
        if kind is Send:
            return self._allowed(conn, "write", frame.dst, frame.id, out, wildcards=False)
        if kind is Forward:
            return self._forward(conn, frame, out)
        if kind is Subscribe:
            return self._allowed(conn, "read", frame.dst, frame.id, out, wildcards=True)
        if kind is Advisory:
            return frame.kind != "add" or self._advisory(conn, frame, out)
        if kind is Subtree:
            return self._subtree(frame)
        if kind is StatRequest or kind is Admin:
            if self.authz is None or self.authz.is_admin(self.user):
                return True
            what = "read broker statistics" if kind is StatRequest else "administer the broker"
            self._refuse(conn, "admin", ">", STAT_REF, out,
                         message=f"not authorized to {what} (needs admin on >)")
            return False
        return True

    def _allowed(self, conn: str, permission: str, text: str, ref: str, out: list, *,
                 wildcards: bool) -> bool:
        authz = self.authz
        if authz is None:
            return True
        try:
            dst = parse_destination(text, allow_wildcards=wildcards)
        except DestinationError:
            return True  # the core refuses it with the precise reason
        if authz.check(self.user, permission, dst):
            return True
        self._refuse(conn, permission, dst, ref, out)
        return False

    def _advisory(self, conn: str, adv: Advisory, out: list) -> bool:
        try:
            dst = parse_destination(adv.dst, allow_wildcards=True)
        except DestinationError:
            return True  # the bridge drops it as malformed
        scope = self.scope
        if scope is not None and adv.path and not scope.leaf:
            claimable = self.claimable
            scope.add_subtree([b for b in adv.path if claimable is None or claimable(b)])
        reason = None
        if self.authz is not None and not self.authz.check(self.user, "read", dst):
            reason = f"user {self.user} may not read {dst}"
        elif scope is not None and not scope.may_advertise(dst):
            reason = f"outside the tree scope of {scope.child}"
        if reason is None:
            return True
        self._refuse(conn, "read", dst, adv.consumer, out, why=reason)
        if self.dropped is not None:
            self.dropped["forbidden"] = self.dropped.get("forbidden", 0) + 1
        out.append(Drop("forbidden", self.link, self.peer, adv.consumer, dst, adv.origin,
                        adv.kind))
        return False

    def _subtree(self, frame: Subtree) -> bool:
        """A summarising child's membership (federation/summary.py) under confinement:
        it may name itself and, if not a leaf, brokers it may claim (as an advisory's
        path); the other ids are cut from the frame and counted ``forbidden``, so a
        confined child cannot take another store's queues by naming it."""
        scope = self.scope
        if scope is None or not isinstance(frame.add, list):
            return True     # no confinement, or malformed: the Site counts it
        claimable = self.claimable
        ok = [b for b in frame.add
              if b == scope.child or (not scope.leaf and type(b) is str
                                      and (claimable is None or claimable(b)))]
        if len(ok) != len(frame.add):
            self.denied += len(frame.add) - len(ok)
            if self.dropped is not None:
                self.dropped["forbidden"] = (self.dropped.get("forbidden", 0)
                                             + len(frame.add) - len(ok))
            frame.add = ok
        scope.add_subtree(ok)
        return True

    def _forward(self, conn: str, f: Forward, out: list) -> bool:
        try:
            dst = parse_destination(f.dst)
        except DestinationError:
            return True  # the core refuses (and acks) it
        reason = None
        if self.authz is not None and not self.authz.check(self.user, "write", dst):
            reason = f"user {self.user} may not write {dst}"
        elif self.scope is not None and not self.scope.may_send(dst):
            reason = f"outside the tree scope of {self.scope.child}"
        if reason is None:
            return True
        self._refuse(conn, "write", dst, f.id, out, why=reason)
        out.append(Out(conn, ForwardAck([f.id])))
        return False

    def _refuse(self, conn: str, permission: str, dst: str, ref: str, out: list, *,
                why: str | None = None, message: str | None = None) -> None:
        self.denied += 1
        error = denied(permission, dst, ref) if message is None else \
            Error(DENIED, message, ref)
        out.append(Out(conn, error))
        key = (permission, dst)
        if key not in self._logged and len(self._logged) < _MAX_LOGGED:
            self._logged.add(key)
            out.append(Log("security.denied", {
                "conn": conn, "user": self.user, "permission": permission, "dst": dst,
                "reason": why or f"user {self.user} may not {permission} {dst}"}))
