"""Test helpers shared by tests/node, tests/client and tests/test_cli.py: broker configs,
in-process BrokerNodes on 127.0.0.1 port 0, a raw-socket peer, a `treefed broker`
subprocess, and polling with a deadline (never fixed sleeps)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import trio

import treefed
from treefed.config import BrokerConfig, parse_config
from treefed.node import BrokerNode
from treefed.transport.framed import FramedStream
from treefed.wire.codec import encode
from treefed.wire.frames import PROTOCOL_VERSION, Error, Hello

REPO_ROOT = Path(treefed.__file__).resolve().parents[1]


def make_config(data_dir: Path | str, broker_id: str = "t1", *, policies: list | None = None,
                tree: dict | None = None, mesh: list | None = None,
                message_events: bool = False, **broker: Any) -> BrokerConfig:
    """A broker config listening on 127.0.0.1 port 0."""
    section = {"id": broker_id, "data_dir": str(data_dir), "listen": ["tcp://127.0.0.1:0"],
               "heartbeat_interval": 0.0, **broker}
    doc: dict = {"broker": section, "logging": {"level": "warning",
                                                "message_events": message_events}}
    if policies:
        doc["policy"] = policies
    if tree:
        doc["tree_connector"] = tree
    if mesh:
        doc["network_connector"] = mesh
    return parse_config(doc)


async def start_node(nursery: trio.Nursery, config: BrokerConfig, *, store: Any = None,
                     ) -> tuple[BrokerNode, str]:
    """Start a BrokerNode in ``nursery``; returns it and its tcp:// URI."""
    node = BrokerNode(config, store=store)
    addresses = await nursery.start(node.serve)
    host, port = addresses[0]
    return node, f"tcp://{host}:{port}"


async def wait_for(predicate: Callable[[], Any], timeout: float = 5.0,
                   interval: float = 0.005) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    with trio.fail_after(timeout):
        while True:
            value = predicate()
            if value:
                return value
            await trio.sleep(interval)


def port_of(uri: str) -> int:
    return int(uri.rsplit(":", 1)[1])


class RawPeer:
    """A hand-driven peer: writes arbitrary bytes, reads frames until EOF."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.framed = FramedStream(stream)

    @classmethod
    async def open(cls, uri: str, *, hello: bool = True) -> RawPeer:
        peer = cls(await trio.open_tcp_stream("127.0.0.1", port_of(uri)))
        if hello:
            await peer.send_raw(encode(Hello(PROTOCOL_VERSION, "client")))
            frames = await peer.framed.receive_frames()
            assert type(frames[0]) is Hello
        return peer

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def frames_until_eof(self, timeout: float = 5.0) -> list:
        """Every frame the broker sends until it closes the connection."""
        got: list = []
        with trio.fail_after(timeout):
            while True:
                try:
                    got += await self.framed.receive_frames()
                except (trio.EndOfChannel, trio.BrokenResourceError):
                    return got

    async def error_and_close(self, timeout: float = 5.0) -> Error:
        """The single Error frame the broker sends before closing on us."""
        frames = await self.frames_until_eof(timeout)
        errors = [f for f in frames if type(f) is Error]
        assert errors, f"no error frame before close, got {frames!r}"
        return errors[-1]

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def write_config(path: Path, broker_id: str, data_dir: Path, *, port: int = 0) -> Path:
    path.write_text(
        f'[broker]\nid = "{broker_id}"\ndata_dir = "{data_dir}"\n'
        f'listen = ["tcp://127.0.0.1:{port}"]\nheartbeat_interval = 0.0\n'
        '[logging]\nlevel = "info"\n', encoding="utf-8")
    return path


class BrokerProcess:
    """``python -m treefed.cli broker --config F`` as a child process; its JSON log goes
    to a file, from which ``uri`` (the bound listener) is read."""

    def __init__(self, config_path: Path, log_path: Path) -> None:
        self.config_path = config_path
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.uri: str | None = None

    def start(self, timeout: float = 20.0) -> str:
        self.log_path.write_text("")
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "treefed.cli", "broker", "--config",
                 str(self.config_path)],
                stdout=log, stderr=log, env=child_env(), cwd=str(REPO_ROOT))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log_path.read_text().splitlines():
                if '"broker.listening"' in line:
                    self.uri = json.loads(line)["uri"]
                    return self.uri
            if self.proc.poll() is not None:
                raise AssertionError(f"broker exited {self.proc.returncode}: "
                                     f"{self.log_path.read_text()}")
            time.sleep(0.02)
        raise AssertionError(f"broker did not start: {self.log_path.read_text()}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 10.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class TaskSteps(trio.abc.Instrument):
    """Counts trio task steps by task name while ``on`` (the step-count tests of issue #14:
    each step is a scheduler pass)."""

    def __init__(self) -> None:
        self.by_name: dict[str, int] = {}
        self.on = False

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.on:
            self.by_name[task.name] = self.by_name.get(task.name, 0) + 1

    def count(self, part: str) -> int:
        """Steps of the tasks whose name contains ``part``."""
        return sum(n for name, n in self.by_name.items() if part in name)

    def broker(self) -> int:
        """Steps of the broker's tasks: site task, readers (serve_tcp's handlers), writers."""
        return sum(n for name, n in self.by_name.items()
                   if "BrokerNode" in name or "_run_handler" in name)
