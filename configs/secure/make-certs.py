#!/usr/bin/env python3
"""Make the TLS certificates of the secure example estate (TEST USE ONLY).

Theory of operation
-------------------
One throw-away CA (trustme, a dev dependency) issues one certificate per broker of
``configs/secure/``: subject CN = the broker id, which is also the user name the broker
authenticates as under mutual TLS; subjectAltNames ``127.0.0.1`` and ``localhost`` so the
loopback estate passes host-name checks; valid for one year; usable as server and client
certificate.  One more, CN ``ops``, is a client certificate for the operator's
``treefed stat`` at the region, which requires one (``verify_peer = true``).  The CA's
private key is never written, so nobody can issue more certificates from it: run the
script again to replace the whole set.

Private keys are not committed: ``certs/`` is git-ignored.  For a real estate, issue
certificates from your own CA and point ``[security.tls]`` at them.

    .venv/bin/python configs/secure/make-certs.py [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path

import trustme

IDENTITIES = ("hq", "region-uk", "store-uk-0001", "store-uk-0002", "ops")


def make_certs(out: Path, identities: tuple[str, ...] = IDENTITIES) -> list[Path]:
    """Write ca.pem and <id>.pem / <id>.key per identity into ``out``; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="treefed example estate (test only)")
    written = [out / "ca.pem"]
    ca.cert_pem.write_to_path(str(written[0]))
    now = datetime.datetime.now(datetime.timezone.utc)
    for name in identities:
        leaf = ca.issue_cert("127.0.0.1", "localhost", f"{name}.treefed.example",
                             common_name=name, organization_name="treefed example",
                             not_before=now - datetime.timedelta(minutes=5),
                             not_after=now + datetime.timedelta(days=365))
        cert, key = out / f"{name}.pem", out / f"{name}.key"
        cert.write_bytes(b"".join(p.bytes() for p in leaf.cert_chain_pems))
        # the key is readable by its owner only, like any private key should be
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(leaf.private_key_pem.bytes())
        written += [cert, key]
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "certs",
                        help="folder to write into (default: certs/ next to this script)")
    args = parser.parse_args()
    for path in make_certs(args.out):
        print(path)


if __name__ == "__main__":
    main()
