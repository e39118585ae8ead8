"""Tests for treefed.security.auth: password and certificate logins, delays, log safety."""

from __future__ import annotations

import pytest

from treefed.security.auth import (AUTH_FAILED, Authenticator, PeerIdentity, User,
                                   identity_from_cert, safe_name)
from treefed.security.passwords import hash_password
from treefed.wire.frames import PROTOCOL_VERSION, Hello

FAST = {"n": 2 ** 6, "r": 8, "p": 1}
USERS = [
    User("alice", hash_password("wonderland", **FAST), ("staff",)),
    User("store-1", hash_password("till-pw", **FAST), ("stores",)),
    User("region-uk", hash_password("region-pw", **FAST), brokers=("region-uk-standby",)),
    User("certonly", "", ("stores",)),
    User("broken", "scrypt$not-a-hash"),
]


def client(username=None, password=None) -> Hello:
    return Hello(PROTOCOL_VERSION, "client", username=username, password=password)


def broker(broker_id, username=None, password=None) -> Hello:
    return Hello(PROTOCOL_VERSION, "broker", broker_id=broker_id, username=username,
                 password=password)


@pytest.fixture
def auth() -> Authenticator:
    return Authenticator(USERS, failure_delay=0.5, max_failure_delay=4.0,
                         failure_window=60.0)


class TestPasswordLogin:
    def test_right_password(self, auth):
        """A configured user with the right password is authenticated, no delay."""
        result = auth.authenticate(client("alice", "wonderland"), 0.0, source="10.0.0.1")
        assert (result.ok, result.user, result.method, result.delay) == \
            (True, "alice", "password", 0.0)

    @pytest.mark.parametrize("hello,reason", [
        (client("alice", "wrong"), "wrong password"),
        (client("alice"), "no password given"),
        (client("mallory", "x"), "unknown user"),
        (client(None, "x"), "password without a username"),
        (client(), "no credentials"),
        (client("certonly", "x"), "certificate only"),
        (client("broken", "x"), "no usable password hash"),
    ])
    def test_each_failure_has_its_reason(self, auth, hello, reason):
        """Every refused hello fails with a reason saying why (for the log)."""
        result = auth.authenticate(hello, 0.0)
        assert not result.ok and result.user is None and reason in result.reason

    def test_peer_is_told_nothing_specific(self, auth):
        """Unknown user and wrong password give the peer the same Error frame."""
        a = auth.authenticate(client("mallory", "x"), 0.0).error_frame()
        b = auth.authenticate(client("alice", "x"), 0.0).error_frame()
        assert a == b and a.code == AUTH_FAILED and a.ref is None

    def test_log_fields_never_hold_the_password(self, auth):
        """The log description names user and reason, never the password."""
        result = auth.authenticate(client("alice", "hunter2-secret"), 0.0, source="h")
        fields = result.log_fields()
        assert fields["user"] == "alice" and fields["reason"] == "wrong password"
        assert "hunter2" not in repr(fields) and "hunter2" not in repr(result)

    def test_hostile_user_name_is_escaped_and_shortened(self, auth):
        """A user name with control characters or huge length is made log-safe."""
        result = auth.authenticate(client("evil\n{\"x\":1}" + "A" * 500, "x"), 0.0)
        assert "\n" not in result.claimed and len(result.claimed) < 100

    def test_authentication_off_is_anonymous(self):
        """required=False accepts any hello as anonymous (user None)."""
        result = Authenticator(USERS, required=False).authenticate(client("x", "y"), 0.0)
        assert (result.ok, result.user, result.method) == (True, None, "anonymous")


class TestBrokerIdentity:
    def test_broker_must_claim_its_own_id(self, auth):
        """A broker link authenticates only under a broker id its user may claim."""
        assert auth.authenticate(broker("store-1", "store-1", "till-pw"), 0.0).ok
        spoof = auth.authenticate(broker("store-2", "store-1", "till-pw"), 0.0)
        assert not spoof.ok and "may not act as broker store-2" in spoof.reason
        assert spoof.log_fields()["claimed_broker"] == "store-2"

    def test_extra_broker_ids(self, auth):
        """User.brokers lists further ids (a standby) the user may claim."""
        assert auth.authenticate(broker("region-uk-standby", "region-uk", "region-pw"),
                                 0.0).ok


class TestCertificateLogin:
    def test_common_name_names_the_user(self, auth):
        """Without a username, a verified certificate's CN selects the user."""
        result = auth.authenticate(broker("store-1"), 0.0, peer=PeerIdentity("store-1"))
        assert (result.ok, result.user, result.method) == (True, "store-1", "certificate")

    def test_subject_alt_name_is_tried_after_cn(self, auth):
        """A CN that names no user falls back to the subjectAltNames."""
        peer = PeerIdentity("Store One", dns_names=("certonly",))
        assert auth.authenticate(client(), 0.0, peer=peer).user == "certonly"

    def test_unknown_certificate_identity(self, auth):
        """A verified certificate naming no configured user is refused."""
        result = auth.authenticate(client(), 0.0, peer=PeerIdentity("intruder"))
        assert not result.ok and "names no configured user" in result.reason

    def test_certificate_broker_binding(self, auth):
        """A certificate for store-1 cannot bring up a link as store-2."""
        result = auth.authenticate(broker("store-2"), 0.0, peer=PeerIdentity("store-1"))
        assert not result.ok and "may not act as broker" in result.reason

    def test_password_takes_precedence_over_certificate(self, auth):
        """A username in the hello is checked by password even with a certificate."""
        result = auth.authenticate(client("alice", "bad"), 0.0, peer=PeerIdentity("alice"))
        assert not result.ok and result.method == "password"


class TestFailureDelay:
    def test_delay_doubles_per_failure_and_is_capped(self, auth):
        """Repeated failures from one source wait 0.5, 1, 2, 4, 4 seconds."""
        delays = [auth.authenticate(client("alice", "x"), float(i), source="1.2.3.4").delay
                  for i in range(5)]
        assert delays == [0.5, 1.0, 2.0, 4.0, 4.0]

    def test_failures_against_one_user_count_across_sources(self, auth):
        """Guessing one user's password from many addresses is slowed too."""
        delays = [auth.authenticate(client("alice", "x"), 0.0, source=f"10.0.0.{i}").delay
                  for i in range(3)]
        assert delays == [0.5, 1.0, 2.0]

    def test_unknown_user_names_are_tracked_like_known_ones(self, auth):
        """Names that are no user are counted per name too (issue #12, defect 10): a
        lockout that only known names reach would tell which names exist.  Memory stays
        bounded by max_tracked (test_tracking_is_bounded)."""
        for i in range(3):
            auth.authenticate(client(f"guess{i}", "x"), 0.0, source="s")
        assert auth.failures("src:s") == 3 and auth.failures("user:guess0") == 1

    def test_success_clears_its_user_only_and_window_forgets(self, auth):
        """A success resets its user's counter but not its source's (a guesser with an
        account of its own cannot reset its address, issue #12 defect 10); failures
        older than the window are forgotten."""
        auth.authenticate(client("alice", "x"), 0.0, source="s")
        auth.authenticate(client("alice", "x"), 1.0, source="s")
        assert auth.authenticate(client("alice", "wonderland"), 2.0, source="s").ok
        assert auth.failures("src:s") == 2 and auth.failures("user:alice") == 0
        auth.authenticate(client("alice", "x"), 3.0, source="s")
        assert auth.authenticate(client("alice", "x"), 400.0, source="s").delay == 0.5

    def test_tracking_is_bounded(self):
        """Failures from endless sources do not grow memory without bound."""
        auth = Authenticator(USERS, max_tracked=50)
        for i in range(500):
            auth.authenticate(client("nobody", "x"), 0.0, source=f"h{i}")
        assert len(auth.throttle._state) <= 51

    def test_check_and_settle_split(self, auth):
        """check() has no side effects (thread-safe); settle() records and sets delay."""
        verdict = auth.check(client("alice", "x"))
        assert verdict.delay == 0.0 and auth.failures("user:alice") == 0
        assert auth.settle(verdict, 0.0, "s").delay == 0.5
        assert auth.failures("user:alice") == 1


class TestIdentityFromCert:
    def test_parses_getpeercert_dict(self):
        """CN from the subject; DNS, email and URI subjectAltNames, in order."""
        cert = {"subject": ((("organizationName", "Acme"),), (("commonName", "store-1"),)),
                "subjectAltName": (("DNS", "s1.example"), ("IP Address", "10.0.0.1"),
                                   ("email", "ops@example"), ("URI", "spiffe://x/s1"))}
        identity = identity_from_cert(cert)
        assert identity == PeerIdentity("store-1", ("s1.example",), ("ops@example",),
                                        ("spiffe://x/s1",))
        assert identity.names == ("store-1", "s1.example", "ops@example", "spiffe://x/s1")

    def test_unverified_certificate_is_no_identity(self):
        """getpeercert() returns {} for an unverified certificate: no identity."""
        assert identity_from_cert({}) is None and identity_from_cert(None) is None


class TestSafeName:
    def test_printable_kept_others_escaped(self):
        """Printable names pass unchanged; control characters are escaped."""
        assert safe_name("store-1") == "store-1"
        assert safe_name("a\x1b[31mb") == "a\\x1b[31mb"
        assert safe_name(42) == "'int'"
