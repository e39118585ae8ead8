"""treefed.security (pure): password hashes, authentication, authorization, tree scope.

Nothing here does I/O or reads a clock; the trio shell performs TLS (``transport/tls.py``),
sleeps the failure delays and sends the refusals these modules decide on.
"""

from treefed.security.auth import (AUTH_FAILED, Authenticator, AuthResult, PeerIdentity,
                                   User, identity_from_cert, safe_name)
from treefed.security.authz import DENIED, PERMISSIONS, Authorizer, Rule, denied
from treefed.security.guard import STAT_REF, Guard
from treefed.security.passwords import hash_password, parse_password_hash, verify_password
from treefed.security.patterns import ANY, Pattern, compile_pattern
from treefed.security.tree_scope import ChildScope, TreeScope

__all__ = [
    "AUTH_FAILED", "Authenticator", "AuthResult", "PeerIdentity", "User",
    "identity_from_cert", "safe_name", "DENIED", "PERMISSIONS", "Authorizer", "Rule",
    "denied", "Guard", "STAT_REF", "hash_password", "parse_password_hash",
    "verify_password", "ANY", "Pattern", "compile_pattern", "ChildScope", "TreeScope",
]
