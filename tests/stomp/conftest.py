"""The test PKI (trustme) of tests/security, for the stomp+ssl:// tests."""

from tests.security.conftest import Pki, pki  # noqa: F401
