"""Password hashes: salted scrypt in one self-describing string.

Theory of operation
-------------------
A stored hash is ``scrypt$<n>$<r>$<p>$<salt>$<hash>`` (salt and hash in unpadded
base64), so the cost parameters travel with the hash: raising the defaults later leaves
every existing hash verifiable.  scrypt is deliberately slow and memory-hard (~16 MiB and
tens of milliseconds at the defaults) so a stolen config file does not give up its
passwords to a GPU; the shell runs verification in a worker thread.

``verify_password`` compares digests in constant time and returns False, never raises,
for a malformed stored string, so a bad entry can only refuse a login.  Parameters are
bounded on both sides (``parse_password_hash``): a hash written into a config file by
hand cannot make verification allocate gigabytes or spin for minutes.

Never: logs, stores or returns a password, or reads a clock.  The only randomness is the
salt, from ``os.urandom``; pass ``salt=`` for reproducible hashes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from dataclasses import dataclass

__all__ = ["hash_password", "verify_password", "parse_password_hash", "PasswordHash",
           "DEFAULT_N", "DEFAULT_R", "DEFAULT_P"]

DEFAULT_N = 2 ** 14   # CPU/memory cost; 128 * n * r bytes = 16 MiB at n=2**14, r=8
DEFAULT_R = 8
DEFAULT_P = 1
_SALT_BYTES = 16
_HASH_BYTES = 32
_MAX_MEMORY = 256 * 1024 * 1024   # refuse parameters needing more than this
_MIN_N, _MAX_N = 2 ** 4, 2 ** 20  # 2**4: test-speed hashes; 2**20: ~1 GiB at r=8 (refused)


@dataclass(frozen=True, slots=True)
class PasswordHash:
    """A parsed stored hash."""

    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes

    def __str__(self) -> str:
        return f"scrypt${self.n}${self.r}${self.p}${_b64(self.salt)}${_b64(self.digest)}"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def _memory(n: int, r: int, p: int) -> int:
    return 128 * r * (n + p + 2)


def _check_params(n: int, r: int, p: int) -> None:
    if not _MIN_N <= n <= _MAX_N or n & (n - 1):
        raise ValueError(f"n must be a power of two in {_MIN_N}..{_MAX_N}, got {n}")
    if not 1 <= r <= 64:
        raise ValueError(f"r must be 1..64, got {r}")
    if not 1 <= p <= 16:
        raise ValueError(f"p must be 1..16, got {p}")
    if _memory(n, r, p) > _MAX_MEMORY:
        raise ValueError(f"n={n}, r={r} needs more than {_MAX_MEMORY >> 20} MiB")


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int, size: int) -> bytes:
    return hashlib.scrypt(password.encode("utf-8"), salt=salt, n=n, r=r, p=p,
                          maxmem=_memory(n, r, p) + 1024 * 1024, dklen=size)


def hash_password(password: str, *, salt: bytes | None = None, n: int = DEFAULT_N,
                  r: int = DEFAULT_R, p: int = DEFAULT_P) -> str:
    """The stored form of ``password``: ``scrypt$n$r$p$salt$hash``.  Raises ValueError
    for parameters outside the accepted bounds."""
    if not isinstance(password, str):
        raise TypeError("password must be a str")
    _check_params(n, r, p)
    if salt is None:
        salt = os.urandom(_SALT_BYTES)
    elif len(salt) < 8:
        raise ValueError("salt must be at least 8 bytes")
    return str(PasswordHash(n, r, p, salt, _scrypt(password, salt, n, r, p, _HASH_BYTES)))


def parse_password_hash(stored: str) -> PasswordHash:
    """Parse and bound-check a stored hash; raises ValueError saying what is wrong
    (the message never contains the hash itself)."""
    if not isinstance(stored, str):
        raise ValueError("not a string")
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise ValueError("expected scrypt$n$r$p$salt$hash (make one with "
                         "`treefed passwd`)")
    try:
        n, r, p = (int(x) for x in parts[1:4])
    except ValueError:
        raise ValueError("n, r and p must be integers") from None
    _check_params(n, r, p)
    try:
        salt, digest = _unb64(parts[4]), _unb64(parts[5])
    except (binascii.Error, ValueError):
        raise ValueError("salt and hash must be base64") from None
    if len(salt) < 8 or len(digest) < 16:
        raise ValueError("salt or hash is too short")
    return PasswordHash(n, r, p, salt, digest)


def verify_password(password: str, stored: str | PasswordHash) -> bool:
    """True when ``password`` matches ``stored``; False for a mismatch or a malformed
    stored value.  The digest comparison takes the same time wherever they differ."""
    if not isinstance(password, str):
        return False
    try:
        parsed = stored if isinstance(stored, PasswordHash) else parse_password_hash(stored)
    except ValueError:
        return False
    candidate = _scrypt(password, parsed.salt, parsed.n, parsed.r, parsed.p,
                        len(parsed.digest))
    return hmac.compare_digest(candidate, parsed.digest)
