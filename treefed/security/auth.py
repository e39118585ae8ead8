"""Authentication of a connection's Hello: password or TLS client-certificate identity.

Theory of operation
-------------------
``Authenticator.authenticate(hello, now, peer=, source=)`` decides who a new connection
is, in two steps the shell may split across threads:

1. ``check(hello, peer)`` — stateless and CPU-bound (scrypt): safe in a worker thread.
   With a username the password must verify; without one, a verified client certificate
   (``peer``, see ``identity_from_cert``) names the user by its subject CN, then its
   subjectAltNames.  A broker link must also claim a broker id its user may speak for
   (its own name, or one of ``User.brokers``): a tree link's permissions follow the
   child's id, so the id must be bound to the credentials.
2. ``settle(result, now, source)`` — cheap bookkeeping on the event loop, kept by a
   ``throttle.LoginThrottle`` (``self.throttle``): a failure returns ``delay`` seconds for
   the shell to wait before answering, doubling per recent failure from the same source
   or against the same user name (up to ``max_failure_delay``, forgotten after
   ``failure_window``), so guessing is slow even across reconnects; a success clears its
   user's counter, never its source's (issue #12, defect 10).  The shell also serialises
   attempts per key, waits what earlier failures still owe *before* the check, and
   refuses without a check once a key reached ``lockout_failures`` (see throttle.py).

An unknown user costs the same scrypt as a known one (a dummy hash), so response time
does not reveal which user names exist; the Error frame says only "authentication
failed", the log line (``AuthResult.log_fields``) says why.  With ``required=False``
every hello is accepted anonymously (``user=None``).

Never: stores, logs or returns a password; reads a clock (``now`` is an argument); does
I/O.  User names from the wire are shortened and escaped before they reach a log line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from treefed.security.passwords import (DEFAULT_N, DEFAULT_P, DEFAULT_R, PasswordHash,
                                        parse_password_hash, verify_password)
from treefed.security.throttle import LoginThrottle, throttle_keys
from treefed.wire.frames import Error, Hello

__all__ = ["User", "PeerIdentity", "AuthResult", "Authenticator", "identity_from_cert",
           "AUTH_FAILED", "safe_name"]

#: Error frame code sent before closing a connection that failed authentication.
AUTH_FAILED = "auth_failed"
_MAX_NAME = 64


def safe_name(text: Any) -> str:
    """A peer-supplied name made fit for a log line: printable, at most 64 characters."""
    if not isinstance(text, str):
        return repr(type(text).__name__)
    if len(text) > _MAX_NAME:
        text = text[:_MAX_NAME] + "…"
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


@dataclass(frozen=True, slots=True)
class User:
    """A configured user (``[[security.user]]``)."""

    name: str
    password_hash: str = ""           # "" = certificate only, no password login
    groups: tuple[str, ...] = ()
    brokers: tuple[str, ...] = ()     # broker ids it may claim besides its own name


@dataclass(frozen=True, slots=True)
class PeerIdentity:
    """Who a *verified* TLS client certificate says the peer is."""

    common_name: str | None
    dns_names: tuple[str, ...] = ()
    emails: tuple[str, ...] = ()
    uris: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """Candidate user names, most specific first: CN, then subjectAltNames."""
        first = (self.common_name,) if self.common_name else ()
        return tuple(dict.fromkeys(first + self.dns_names + self.emails + self.uris))

    def __str__(self) -> str:
        return self.common_name or (self.names[0] if self.names else "<no name>")


def identity_from_cert(cert: Mapping[str, Any] | None) -> PeerIdentity | None:
    """Build a PeerIdentity from ``SSLObject.getpeercert()``; None when there is no
    verified certificate (``getpeercert`` returns ``{}`` for an unverified one)."""
    if not cert:
        return None
    cn = None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                cn = value
    found: dict[str, list[str]] = {"DNS": [], "email": [], "URI": []}
    for kind, value in cert.get("subjectAltName", ()):
        if kind in found:
            found[kind].append(value)
    return PeerIdentity(cn, tuple(found["DNS"]), tuple(found["email"]), tuple(found["URI"]))


@dataclass(frozen=True, slots=True)
class AuthResult:
    """The verdict on one hello."""

    ok: bool
    user: str | None                 # authenticated user; None = anonymous or refused
    method: str                      # password | certificate | anonymous | none
    reason: str = ""                 # why it failed, log-safe (never a password)
    claimed: str | None = None       # the user name the peer claimed, log-safe
    broker_id: str | None = None     # the broker id a broker link claimed, log-safe
    delay: float = 0.0               # seconds to wait before answering a failure
    known_user: bool = False         # the claimed name is a configured user

    def error_frame(self) -> Error:
        """What the peer is told: nothing that helps guessing."""
        return Error(AUTH_FAILED, "authentication failed")

    def log_fields(self) -> dict[str, Any]:
        """Fields for the shell's log line (``auth.failed`` / ``auth.ok``)."""
        out: dict[str, Any] = {"user": self.user or self.claimed, "method": self.method}
        if self.broker_id is not None:
            out["claimed_broker"] = self.broker_id
        if not self.ok:
            out["reason"] = self.reason
            out["delay"] = self.delay
        return out


class Authenticator:
    """See the module docstring."""

    __slots__ = ("required", "failure_delay", "max_failure_delay", "failure_window",
                 "max_tracked", "_users", "_hashes", "_dummy", "throttle")

    def __init__(self, users: Iterable[User] = (), *, required: bool = True,
                 failure_delay: float = 1.0, max_failure_delay: float = 30.0,
                 failure_window: float = 300.0, max_tracked: int = 10_000,
                 lockout_failures: int = 10) -> None:
        self.required = required
        self.failure_delay = failure_delay
        self.max_failure_delay = max_failure_delay
        self.failure_window = failure_window
        self.max_tracked = max_tracked
        self.throttle = LoginThrottle(failure_delay=failure_delay,
                                      max_failure_delay=max_failure_delay,
                                      failure_window=failure_window,
                                      lockout_failures=lockout_failures,
                                      max_tracked=max_tracked)
        self._users = {u.name: u for u in users}
        # parsed once: a malformed hash refuses its user's logins, it cannot crash them
        self._hashes: dict[str, PasswordHash | None] = {}
        for user in self._users.values():
            try:
                self._hashes[user.name] = (parse_password_hash(user.password_hash)
                                           if user.password_hash else None)
            except ValueError:
                self._hashes[user.name] = None
        # Same cost as a typical real hash, never matches (all-zero digest).
        typical = next((h for h in self._hashes.values() if h is not None), None)
        n, r, p = (typical.n, typical.r, typical.p) if typical else \
            (DEFAULT_N, DEFAULT_R, DEFAULT_P)
        self._dummy = PasswordHash(n, r, p, b"treefed-no-such-user", bytes(32))

    def user(self, name: str) -> User | None:
        return self._users.get(name)

    def groups(self) -> dict[str, tuple[str, ...]]:
        """user -> groups, as ``Authorizer`` wants it."""
        return {u.name: u.groups for u in self._users.values()}

    # -- step 1: credentials (stateless, slow) ----------------------------------------
    def check(self, hello: Hello, peer: PeerIdentity | None = None) -> AuthResult:
        broker_id = safe_name(hello.broker_id) if hello.role == "broker" else None
        if not self.required:
            return AuthResult(True, None, "anonymous", broker_id=broker_id)
        if hello.username is not None:
            name = hello.username
            claimed = safe_name(name)
            user = self._users.get(name) if isinstance(name, str) else None
            stored = self._hashes.get(name) if user is not None else None
            password = hello.password if isinstance(hello.password, str) else ""
            # always pay for one scrypt, so timing does not reveal which names exist
            good = verify_password(password, stored or self._dummy)
            if user is None:
                return AuthResult(False, None, "password", "unknown user", claimed,
                                  broker_id)
            if stored is None:
                why = ("no usable password hash configured" if user.password_hash
                       else "user has no password (certificate only)")
                return AuthResult(False, None, "password", why, claimed, broker_id,
                                  known_user=True)
            if hello.password is None or not good:
                why = "no password given" if hello.password is None else "wrong password"
                return AuthResult(False, None, "password", why, claimed, broker_id,
                                  known_user=True)
            return self._bind_broker(user, "password", hello, broker_id)
        if hello.password is not None:
            return AuthResult(False, None, "password", "password without a username",
                              None, broker_id)
        if peer is None:
            return AuthResult(False, None, "none", "no credentials (no username, no "
                                                   "verified client certificate)",
                              None, broker_id)
        for name in peer.names:
            user = self._users.get(name)
            if user is not None:
                return self._bind_broker(user, "certificate", hello, broker_id)
        return AuthResult(False, None, "certificate",
                          f"certificate {safe_name(str(peer))} names no configured user",
                          safe_name(str(peer)), broker_id)

    def _bind_broker(self, user: User, method: str, hello: Hello,
                     broker_id: str | None) -> AuthResult:
        if hello.role == "broker" and hello.broker_id != user.name \
                and hello.broker_id not in user.brokers:
            return AuthResult(False, None, method,
                              f"user {user.name} may not act as broker {broker_id}",
                              user.name, broker_id, known_user=True)
        return AuthResult(True, user.name, method, claimed=user.name, broker_id=broker_id,
                          known_user=True)

    # -- step 2: bookkeeping (cheap) -------------------------------------------------
    def settle(self, result: AuthResult, now: float, source: str = "") -> AuthResult:
        """Record ``result``; a failure comes back with its ``delay`` set."""
        delay = self.throttle.record(self.keys(result, source), result.ok, now)
        return result if result.ok else replace(result, delay=delay)

    @staticmethod
    def keys(result: AuthResult, source: str = "") -> tuple[str, ...]:
        """The throttle keys of an attempt: its source address and claimed user name."""
        return throttle_keys(result.claimed, source)

    def authenticate(self, hello: Hello, now: float, *, peer: PeerIdentity | None = None,
                     source: str = "") -> AuthResult:
        """``settle(check(hello, peer), now, source)`` in one call."""
        return self.settle(self.check(hello, peer), now, source)

    def failures(self, key: str) -> int:
        """Recent failures recorded under ``src:<source>`` or ``user:<name>``."""
        return self.throttle.failures(key)
