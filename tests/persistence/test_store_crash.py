"""SqliteStore durability: a confirmed batch survives kill -9 of the writing process."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import trio

from treefed.persistence import SqliteStore

BATCH = 50
REPORTED_BEFORE_KILL = 25

# The child commits batches of BATCH messages with consecutive ids forever, printing the
# last id of each batch only after apply() returned, i.e. after the commit was confirmed.
CHILD = """
import sys
from treefed.core.message import Message
from treefed.persistence import SqliteStore
store = SqliteStore(sys.argv[1], synchronous=sys.argv[2])
batch, n = int(sys.argv[3]), 0
while True:
    store.apply([Message(f"m{i}", "queue://Q", headers={"n": i}, body=bytes(200),
                         persistent=True) for i in range(n, n + batch)], [])
    n += batch
    sys.stdout.write(f"{n - 1}\\n")
    sys.stdout.flush()
"""


class TestKillDurability:
    @pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
    async def test_every_reported_batch_survives_sigkill(self, tmp_path, child_env, synchronous):
        """After SIGKILL mid-write every confirmed id is stored and no batch is partial."""
        data_dir = tmp_path / "data"
        with open(tmp_path / "stderr", "wb") as err, trio.fail_after(30):
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-c", CHILD, str(data_dir), synchronous, str(BATCH)],
                stdout=subprocess.PIPE, stderr=err, env=child_env,
            )
            out = b""
            try:
                while out.count(b"\n") < REPORTED_BEFORE_KILL:
                    chunk = await proc.stdout.receive_some()
                    assert chunk, (tmp_path / "stderr").read_text()  # child died early
                    out += chunk
            finally:
                proc.kill()  # SIGKILL: no atexit, no close(), no checkpoint
                await proc.wait()
            # Lines already in the pipe were printed after a confirmed commit: they count too.
            while chunk := await proc.stdout.receive_some():
                out += chunk
            await proc.stdout.aclose()
        assert proc.returncode == -signal.SIGKILL
        reported = [int(line) for line in out.decode().splitlines()]
        assert reported == [BATCH * (k + 1) - 1 for k in range(len(reported))]

        with SqliteStore(data_dir) as store:
            loaded = [int(m.id[1:]) for m in store.load()]
        # Whole batches only, in order, at least every confirmed one; at most one more batch
        # may have committed between its COMMIT and the print the kill interrupted.
        assert loaded == list(range(len(loaded)))
        assert len(loaded) % BATCH == 0
        assert reported[-1] + 1 <= len(loaded) <= reported[-1] + 1 + BATCH
