"""Certificates made on the fly with trustme, written to a temporary folder."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
import trustme


class Pki:
    """A test CA (and a second, untrusted one) issuing certificates as PEM files."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ca = trustme.CA(organization_name="treefed test CA")
        self.other_ca = trustme.CA(organization_name="somebody else")
        self.ca_path = str(folder / "ca.pem")
        self.ca.cert_pem.write_to_path(self.ca_path)
        self._n = 0

    def leaf(self, *identities: str, common_name: str | None = None,
             ca: trustme.CA | None = None, expired: bool = False) -> tuple[str, str]:
        """Issue a certificate; returns (cert chain path, key path)."""
        kwargs = {}
        if expired:
            now = datetime.datetime.now(datetime.timezone.utc)
            kwargs = {"not_before": now - datetime.timedelta(days=2),
                      "not_after": now - datetime.timedelta(days=1)}
        cert = (ca or self.ca).issue_cert(*(identities or ("127.0.0.1",)),
                                          common_name=common_name, **kwargs)
        self._n += 1
        cert_path = self.folder / f"leaf{self._n}.pem"
        key_path = self.folder / f"leaf{self._n}.key"
        cert_path.write_bytes(b"".join(p.bytes() for p in cert.cert_chain_pems))
        cert.private_key_pem.write_to_path(str(key_path))
        return str(cert_path), str(key_path)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)
