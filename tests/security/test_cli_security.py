"""The security parts of the `treefed` command: `passwd`, and the client tools' --user /
--password / $TREEFED_PASSWORD / --ca options against a TLS broker."""

from __future__ import annotations

import json
import subprocess
import sys

import trio

from treefed.security.passwords import verify_password

from tests.node.helpers import REPO_ROOT, child_env
from tests.security.test_node_security import region_doc, start


def treefed(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "treefed.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=60, env=child_env(),
                          cwd=str(REPO_ROOT))


class TestPasswd:
    def test_stdin_password_becomes_a_verifiable_hash(self):
        """`treefed passwd --stdin` prints a scrypt hash of the line it read."""
        result = treefed("passwd", "--stdin", stdin="s3cret pass\n")
        assert result.returncode == 0
        stored = result.stdout.strip()
        assert stored.startswith("scrypt$16384$8$1$")
        assert verify_password("s3cret pass", stored) and "s3cret" not in stored

    def test_empty_password_is_refused(self):
        """An empty password exits 2 and prints no hash."""
        result = treefed("passwd", "--stdin", stdin="\n")
        assert result.returncode == 2 and result.stdout == ""


class TestClientTools:
    async def test_stat_with_credentials_over_tls(self, nursery, tmp_path, pki):
        """stat logs in with --user and $TREEFED_PASSWORD, trusting --ca; a non-admin
        user gets exit status 1 and not_authorized."""
        with trio.fail_after(30):
            _, port = await start(nursery, region_doc(tmp_path, pki))
            uri = f"ssl://127.0.0.1:{port}"

            async def stat(user: str, password: str) -> subprocess.CompletedProcess:
                env = {**child_env(), "TREEFED_PASSWORD": password}
                return await trio.run_process(
                    [sys.executable, "-m", "treefed.cli", "stat", "--user", user,
                     "--ca", pki.ca_path, uri], env=env, cwd=str(REPO_ROOT), check=False,
                    capture_stdout=True, capture_stderr=True)

            admin, refused = await stat("ops", "ops-pw"), await stat("hq-app", "hq-pw")
        assert admin.returncode == 0, admin.stderr
        assert json.loads(admin.stdout)["broker"] == "region"
        assert refused.returncode == 1 and b"not_authorized" in refused.stderr
