"""The forecast's view of the configs' ``[security]``: which links log in, what they may carry.

Theory of operation
-------------------
A broker that accepts a link screens it exactly as ``treefed broker`` does (node.py):

1. **login** -- the dialer's hello is checked by the acceptor's own ``Authenticator``
   (``security.auth``): the connector's ``username``/``password``, or -- when the
   acceptor verifies client certificates (``[security.tls] ca``) and the dialer has a
   certificate -- the names in the dialer's certificate (read with ``cryptography``).  The
   user must be allowed to act as the dialing broker, and a tree child must be in one of
   ``[security.tree] child_groups``.  A refused login means no link at all.
2. **frames** -- every frame the dialer sends on an accepted link passes the real
   ``security.Guard`` built from the acceptor's permissions and tree confinement: an
   advisory (interest) needs ``read`` on its destination and the child's tree scope, a
   forwarded message ``write`` and the scope.  A refused advisory creates no demand, a
   refused forward is answered and dropped -- the route is refused.

``GuardedEstate`` is ``federation.testing.Estate`` with those screens in front of the
acceptors' Sites, so the forecast's "current" run routes what the secured estate routes.
What it does not model: workload clients (they are assumed to hold the permissions they
use -- the forecast is about routing between brokers), the certificate chain (a
certificate is taken as verified when the acceptor has a CA: the procs engine and
``estate start`` check real handshakes), and the login throttle.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from treefed.config import BrokerConfig
from treefed.federation.testing import Estate, NotQuiet
from treefed.security.auth import PeerIdentity
from treefed.security.guard import Guard
from treefed.wire.frames import PROTOCOL_VERSION, Hello

__all__ = ["secured", "GuardedEstate", "LinkLogin", "login"]


def secured(configs: dict[str, BrokerConfig]) -> bool:
    """Does any config authenticate links or confine tree children?"""
    return any(c.security.authentication or c.security.tree.confine_children
               for c in configs.values())


@lru_cache(maxsize=4096)
def _identity(cert_path: str) -> PeerIdentity | None:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    try:
        with open(cert_path, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
    except (OSError, ValueError):
        return None
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = tuple(san.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        dns = ()
    return PeerIdentity(str(cns[0].value) if cns else None, dns)


class LinkLogin:
    __slots__ = ("ok", "user", "method", "reason")

    def __init__(self, ok: bool, user: str | None, method: str, reason: str = "") -> None:
        self.ok, self.user, self.method, self.reason = ok, user, method, reason


def login(dialer: BrokerConfig, acceptor: BrokerConfig, connector: Any,
          kind: str, authenticators: dict) -> LinkLogin:
    """How ``dialer``'s ``connector`` (tree or network connector config) logs in at
    ``acceptor`` (see the module docstring, step 1)."""
    sec = acceptor.security
    if not sec.authentication:
        return LinkLogin(True, None, "anonymous")
    auth = authenticators.get(acceptor.broker.id)
    if auth is None:
        auth = authenticators[acceptor.broker.id] = sec.authenticator()
    hello = Hello(PROTOCOL_VERSION, "broker", broker_id=dialer.broker.id,
                  username=connector.username or None, password=connector.password or None)
    peer = None
    if sec.tls.ca and dialer.security.tls.cert and connector.uri.lower().find("ssl://") >= 0:
        peer = _identity(dialer.security.tls.cert)
    result = auth.check(hello, peer)
    if not result.ok:
        return LinkLogin(False, result.claimed, result.method, result.reason)
    wanted = sec.tree.child_groups
    if kind == "tree" and wanted:
        user = auth.user(result.user)
        if user is None or set(wanted).isdisjoint(user.groups):
            return LinkLogin(False, result.user, result.method,
                             f"user {result.user} has no broker role (not in "
                             f"{', '.join(wanted)})")
    return LinkLogin(True, result.user, result.method)


class GuardedEstate(Estate):
    """An Estate whose accepted links are screened by ``security.Guard`` s."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.guards: dict[tuple[str, str], Guard] = {}     # (acceptor, its conn) -> guard

    def guard(self, acceptor: str, dialer: str, name: str, config: BrokerConfig,
              user: str | None, *, tree_child: bool, leaf: bool) -> None:
        """Screen what ``dialer`` sends on its link ``name`` to ``acceptor``."""
        sec = config.security
        authz = sec.authorizer()
        tree_scope = sec.tree.tree_scope(temp_destinations=sec.temp_destinations)
        scope = tree_scope.for_child(dialer, leaf=leaf) if tree_scope and tree_child \
            else None
        if authz is None and scope is None:
            return
        site = self.sites[acceptor]
        conn = self.conn_to(acceptor, dialer, name)
        bridge = site.bridge(conn)

        def claimable(broker_id: str) -> bool:
            return site.subtree_owner(broker_id) in (None, bridge)

        self.guards[(acceptor, conn)] = Guard(user, authz, scope=scope, claimable=claimable,
                                              link=name, peer=dialer, dropped=site.dropped)

    def run_until_quiet(self, max_rounds: int = 10_000) -> int:
        """``Estate.run_until_quiet`` with every guarded link's frames screened first."""
        moved = rounds = 0
        guards = self.guards
        while self._queue:
            rounds += 1
            if rounds > max_rounds:
                raise NotQuiet(f"{len(self._queue)} frames still queued after {max_rounds}")
            batch, self._queue = self._queue, type(self._queue)()
            for site, conn, frame, serial in batch:
                if serial and self._wires.get((site, conn), (None, None, -1))[2] != serial:
                    continue
                moved += 1
                guard = guards.get((site, conn))
                if guard is not None:
                    out: list = []
                    if not guard.screen(conn, frame, out):
                        self._perform(site, out)
                        continue
                self._perform(site, self.sites[site].handle_frame(conn, frame, self.now))
        return moved
