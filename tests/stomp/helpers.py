"""STOMP test helpers: a broker with a stomp:// listener, the real stomp.py client driven
from trio through worker threads, and a raw-socket STOMP peer for malformed input."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio

stomp = pytest.importorskip("stomp", reason="stomp.py (the dev extra) is not installed")

from treefed.config import parse_config  # noqa: E402
from treefed.node import BrokerNode  # noqa: E402
from treefed.stomp.codec import SERVER_COMMANDS, StompDecoder, StompFrame, encode  # noqa: E402

from tests.node.helpers import wait_for  # noqa: E402,F401

LOCAL = "127.0.0.1"


def stomp_doc(data_dir, broker_id: str = "s1", *, listen: list | None = None,
              **broker: Any) -> dict:
    return {"broker": {"id": broker_id, "data_dir": str(data_dir),
                       "listen": listen or ["tcp://127.0.0.1:0", "stomp://127.0.0.1:0"],
                       "heartbeat_interval": 0.0, **broker},
            "logging": {"level": "warning"}}


async def start_stomp_node(nursery, doc: dict, **kw) -> tuple[BrokerNode, str, int]:
    """Start a node from ``doc``; returns it, its tcp:// URI and its STOMP port."""
    node = BrokerNode(parse_config(doc), **kw)
    addresses = await nursery.start(node.serve)
    schemes = node.statistics()["listeners"]
    tcp = next(u for u in schemes if u.startswith("tcp://"))
    stomp_port = next(p for u, (_, p) in zip(schemes, addresses) if u.startswith("stomp"))
    return node, tcp, stomp_port


class Recorder(stomp.ConnectionListener):
    """Collects what the broker sends a stomp.py connection (on its receiver thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.messages: list = []
        self.errors: list = []
        self.receipts: list[str] = []
        self.heartbeats = 0
        self.disconnected = False

    def on_message(self, frame) -> None:
        with self.lock:
            self.messages.append(frame)

    def on_error(self, frame) -> None:
        with self.lock:
            self.errors.append(frame)

    def on_receipt(self, frame) -> None:
        with self.lock:
            self.receipts.append(frame.headers["receipt-id"])

    def on_heartbeat(self) -> None:
        self.heartbeats += 1

    def on_disconnected(self) -> None:
        self.disconnected = True

    def bodies(self) -> list[str]:
        with self.lock:
            return [m.body for m in self.messages]


class Client:
    """A stomp.py connection used from trio: blocking calls run in a worker thread."""

    def __init__(self, port: int, *, version: str = "1.2", heartbeats=(0, 0),
                 ssl: dict | None = None, timeout: float = 5.0) -> None:
        cls = {"1.0": stomp.Connection10, "1.1": stomp.Connection11,
               "1.2": stomp.Connection12}[version]
        kw = {} if version == "1.0" else {"heartbeats": heartbeats}
        self.conn = cls([(LOCAL, port)], timeout=timeout, **kw)
        if ssl is not None:
            self.conn.set_ssl([(LOCAL, port)], **ssl)
        self.rec = Recorder()
        self.conn.set_listener("rec", self.rec)

    async def call(self, fn, *args, **kw) -> Any:
        # abandoned on cancel: a test's fail_after ends a stuck client call (its thread
        # is left to stomp.py's own socket timeout) instead of hanging the run
        return await trio.to_thread.run_sync(lambda: fn(*args, **kw),
                                             abandon_on_cancel=True)

    async def connect(self, login: str | None = None, passcode: str | None = None,
                      **headers) -> Client:
        await self.call(self.conn.connect, login, passcode, wait=True, headers=headers)
        return self

    async def send(self, dst: str, body: str | bytes = "", **headers) -> None:
        await self.call(self.conn.send, dst, body, headers=headers)

    async def subscribe(self, dst: str, sub_id: str, ack: str = "auto", **headers) -> None:
        await self.call(self.conn.subscribe, dst, sub_id, ack=ack, headers=headers)

    async def receipt(self, receipt: str, timeout: float = 5.0) -> None:
        await wait_for(lambda: receipt in self.rec.receipts, timeout)

    async def messages(self, n: int, timeout: float = 5.0) -> list:
        await wait_for(lambda: len(self.rec.messages) >= n, timeout)
        return list(self.rec.messages)

    async def disconnect(self, **kw) -> None:
        if self.conn.is_connected():
            await self.call(self.conn.disconnect, **kw)


class RawStomp:
    """A hand-driven STOMP peer: writes arbitrary bytes, reads frames until EOF."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = StompDecoder(commands=SERVER_COMMANDS)
        self.decoder.escapes = True

    @classmethod
    async def open(cls, port: int, *, connect: bool = True, **headers) -> RawStomp:
        peer = cls(await trio.open_tcp_stream(LOCAL, port))
        if connect:
            await peer.send(StompFrame("CONNECT", {"accept-version": "1.2",
                                                   "host": "x", **headers}))
            [connected] = await peer.frames(1)
            assert connected.command == "CONNECTED", connected
        return peer

    async def send(self, frame: StompFrame) -> None:
        await self.stream.send_all(encode(frame))

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def frames(self, n: int, timeout: float = 5.0) -> list[StompFrame]:
        got: list[StompFrame] = []
        with trio.fail_after(timeout):
            while len(got) < n:
                got += list(self.decoder.frames())
                if len(got) >= n:
                    break
                data = await self.stream.receive_some(65536)
                assert data, f"closed after {got!r}"
                self.decoder.receive_data(data)
        return got

    async def frames_until_eof(self, timeout: float = 5.0) -> list[StompFrame]:
        got: list[StompFrame] = []
        with trio.fail_after(timeout):
            while True:
                got += list(self.decoder.frames())
                try:
                    data = await self.stream.receive_some(65536)
                except trio.BrokenResourceError:
                    return got
                if not data:
                    return got
                self.decoder.receive_data(data)

    async def error_and_close(self, timeout: float = 5.0) -> StompFrame:
        frames = await self.frames_until_eof(timeout)
        errors = [f for f in frames if f.command == "ERROR"]
        assert errors, f"no ERROR before the close, got {frames!r}"
        return errors[-1]

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)
