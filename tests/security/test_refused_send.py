"""Issue #12, defect 6: a refused persistent send is never reported as confirmed.

When the last pipelined persistent send was refused, ``Connection.wait_confirmed()``
swallowed the error (its own waiter took it) and ``treefed send --persistent`` exited 0.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import trio

from treefed.client import connect
from treefed.errors import LimitError

from tests.node.helpers import REPO_ROOT, child_env, make_config, start_node

#: one message fits; the next is refused (reject_newest), so the last send is refused
FULL_QUEUE = [{"pattern": "queue://full.>", "max_messages": 1,
               "limit_behaviour": "reject_newest"}]


def run_cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "treefed.cli", *args],
                          capture_output=True, text=True, timeout=timeout, env=child_env(),
                          cwd=str(REPO_ROOT))


class TestRefusedPipelinedSend:
    async def test_wait_confirmed_raises_when_the_last_send_is_refused(self, nursery,
                                                                       tmp_path):
        """Two pipelined persistent sends, the second (the last) refused by the
        destination's limit: wait_confirmed raises that refusal."""
        _, uri = await start_node(nursery, make_config(tmp_path / "d", policies=FULL_QUEUE))
        with trio.fail_after(10):
            async with connect(uri) as conn:
                await conn.send("queue://full.a", b"1", persistent=True, confirm=False)
                await conn.send("queue://full.a", b"2", persistent=True, confirm=False)
                with pytest.raises(LimitError):
                    await conn.wait_confirmed()
                assert conn.unconfirmed() == []
                await conn.wait_confirmed()     # reported once, then clean again

    async def test_wait_confirmed_reports_an_earlier_refusal_first(self, nursery, tmp_path):
        """A refused send followed by a confirmed one: the refusal is still raised."""
        _, uri = await start_node(nursery, make_config(tmp_path / "d", policies=FULL_QUEUE))
        with trio.fail_after(10):
            async with connect(uri) as conn:
                await conn.send("queue://full.a", b"1", persistent=True)
                await conn.send("queue://full.a", b"2", persistent=True, confirm=False)
                await conn.send("queue://other", b"3", persistent=True, confirm=False)
                with pytest.raises(LimitError):
                    await conn.wait_confirmed()

    async def test_cli_send_persistent_exits_non_zero_when_refused(self, nursery, tmp_path):
        """`treefed send --persistent --count 2` into a queue that takes one: exit 1,
        the refusal on stderr, no "sent" report on stdout."""
        _, uri = await start_node(nursery, make_config(tmp_path / "d", policies=FULL_QUEUE))
        done = await trio.to_thread.run_sync(
            lambda: run_cli("send", uri, "queue://full.cli", "x", "--persistent",
                            "--count", "2"))
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert "[limit" in done.stderr and done.stdout == ""
