"""Full-disk scenario against a real broker process (issue #12, defect 4).

Run by ``test_full_disk.py`` INSIDE a private mount namespace (``unshare -Urm``) whose
``DIR`` is a small tmpfs, so the filesystem really fills up.  Prints one JSON line with
what it saw and exits 0; any broken expectation is an AssertionError (exit 1) naming it.

1. A broker whose data directory is on the tmpfs; a filler file leaves a few MiB free.
2. Persistent sends until the broker refuses one with ``store_full``.
3. Half of the confirmed messages are consumed and acked; a stat round trip proves the
   acks were handled.
4. kill -9, restart: the remaining confirmed messages come back, each once; no acked one
   is ever delivered again.
5. Fill again, kill -9 and restart on the full disk: the broker starts, refuses producers
   (``store_full``), and once the filler is removed (space returns, no ack at all) it
   accepts persistent sends within a few seconds; every confirmed message is then
   delivered once, in order.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import trio

from treefed.client import connect
from treefed.errors import RemoteError, TreefedError
from treefed.transport.ports import free_port

REPO = Path(__file__).resolve().parents[2]
BODY = b"x" * 16 * 1024
QUEUE = "queue://disk.q"


class Broker:
    def __init__(self, root: Path, data: Path) -> None:
        self.port = free_port()
        self.uri = f"tcp://127.0.0.1:{self.port}"
        self.config = root / "broker.toml"
        self.config.write_text(
            f'[broker]\nid = "disk1"\ndata_dir = "{data}"\n'
            f'listen = ["tcp://127.0.0.1:{self.port}"]\nheartbeat_interval = 0.0\n'
            '[logging]\nlevel = "info"\n')
        self.log = root / "broker.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "treefed.cli", "broker", "--config", str(self.config)],
                stdout=log, stderr=log, env=env, cwd=str(REPO))

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    async def stat(self) -> dict:
        deadline = time.monotonic() + 20
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"broker exited {self.proc.returncode}:\n"
                                     f"{self.log.read_text()[-3000:]}")
            try:
                with trio.fail_after(2):
                    async with connect(self.uri, client_id="stat") as conn:
                        return await conn.stat()
            except (TreefedError, OSError, trio.TooSlowError):
                if time.monotonic() > deadline:
                    raise
                await trio.sleep(0.1)


async def fill(uri: str, prefix: str) -> list[str]:
    """Persistent sends one at a time until one is refused with store_full."""
    confirmed: list[str] = []
    async with connect(uri, client_id=f"fill-{prefix}") as conn:
        for n in range(100_000):
            try:
                await conn.send(QUEUE, BODY, persistent=True, headers={"n": f"{prefix}{n}"})
            except RemoteError as exc:
                assert exc.code == "store_full", exc
                return confirmed
            confirmed.append(f"{prefix}{n}")
    raise AssertionError("the disk never filled up")


async def receive(uri: str, count: int, *, ack: bool, timeout: float = 10.0) -> list[str]:
    got: list[str] = []
    async with connect(uri, client_id="drain") as conn:
        sub = await conn.subscribe(QUEUE, prefetch=50 if ack else max(1, count))
        with trio.move_on_after(timeout):
            while len(got) < count:
                msg = await sub.receive()
                got.append(msg.headers["n"])
                if ack:
                    await msg.ack()
        await conn.stat()   # the acks went before the stat: they are handled
    return got


async def main(root: Path) -> dict:
    data = root / "data"
    # leave ~6 MiB for the store beyond what the broker takes at start (its reserve)
    broker = Broker(root, data)
    broker.start()
    await broker.stat()
    st = os.statvfs(root)
    filler = root / "filler"
    with open(filler, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, max(0, st.f_bavail * st.f_frsize - 6 * 2**20))

    first = await fill(broker.uri, "a")
    assert len(first) > 20, f"only {len(first)} messages fit"
    assert (await broker.stat())["store_full"] is True
    half = len(first) // 2
    acked = await receive(broker.uri, half, ack=True)
    assert acked == first[:half], "the first half did not come back in order"

    broker.kill()
    broker.start()
    await broker.stat()
    after_restart = await receive(broker.uri, len(first) - half, ack=False, timeout=5)
    again = sorted(set(after_restart) & set(acked))
    assert not again, f"{len(again)} acked messages delivered again after restart: {again[:5]}"
    assert after_restart == first[half:], (
        f"after the restart {len(after_restart)} of {len(first) - half} unacked messages came "
        "back (or out of order)")

    # fill again (deletes freed pages inside the database, but the disk stays full), then
    # kill -9 and restart on the full disk: it must start, serve and refuse producers
    second = await fill(broker.uri, "b")
    broker.kill()
    broker.start()
    await broker.stat()
    third = await fill(broker.uri, "c")
    stat = await broker.stat()
    assert stat["store_full"] is True, "a refused send did not close the door"

    os.unlink(filler)   # space returns: no ack, no restart
    began = time.monotonic()
    while (await broker.stat())["store_full"]:
        assert time.monotonic() - began < 10, "store_full did not clear when space returned"
        await trio.sleep(0.1)
    cleared_after = time.monotonic() - began
    async with connect(broker.uri, client_id="after") as conn:
        await conn.send(QUEUE, b"ok", persistent=True, headers={"n": "after"})
    expected = first[half:] + second + third + ["after"]
    rest = await receive(broker.uri, len(expected), ack=True)
    assert rest == expected, f"after space returned got {len(rest)} of {len(expected)}"
    broker.kill()
    return {"first": len(first), "acked": half, "second": len(second), "third": len(third),
            "cleared_after_s": round(cleared_after, 2)}


if __name__ == "__main__":
    from tests.worker_ports import keep_ports_to_this_worker

    keep_ports_to_this_worker()       # run from a pytest-xdist worker: its share of ports
    print(json.dumps(trio.run(main, Path(sys.argv[1]))))
