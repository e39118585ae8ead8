"""A TCP proxy process the fault tests put on a broker link, to cut it on command.

Theory of operation
-------------------
``python -m tests.faults.proxy --listen 127.0.0.1:0 --target 127.0.0.1:P`` binds, prints
``port N`` on stdout, then relays every accepted connection to the target, byte for byte,
in both directions.  The test drives it through stdin, one command a line, each answered
``ok <command> ...`` on stdout once it has taken effect:

* ``cut`` — a WAN outage: every relayed connection is reset (RST to both sides) and the
  listening socket is closed, so new connections are *refused* until ``restore``;
* ``blackhole`` — a half-open peer: connections stay open and new ones are accepted, but
  nothing is forwarded any more, not even a close; whatever arrives is read and discarded,
  so only a heartbeat can tell the peers that the other side is gone;
* ``restore`` — relay again; connections that lived through a blackhole are reset (their
  byte streams lost data, they can never be trusted again) and the listener reopens on the
  same port;
* ``target HOST:PORT`` — relay new connections elsewhere; ``status`` — mode and counts;
* ``quit`` (or end of stdin: the test died) — exit.

It is a test fixture, not part of treefed: it imports only trio, and the ``ProxyProcess``
class below is the test side (start, command, stop) of the same line protocol.
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import trio

__all__ = ["ProxyProcess", "main"]

_RST = struct.pack("ii", 1, 0)   # SO_LINGER on, 0 s: close() sends a reset, not a FIN


class _Pipe:
    """One relayed connection: the accepted side, the dialed side (None in a blackhole)."""

    __slots__ = ("down", "up", "scope", "tainted")

    def __init__(self, down: trio.SocketStream, tainted: bool) -> None:
        self.down = down
        self.up: trio.SocketStream | None = None
        self.scope = trio.CancelScope()
        self.tainted = tainted          # lost bytes in a blackhole: reset on restore

    def reset(self) -> None:
        for stream in (self.down, self.up):
            if stream is not None:
                try:
                    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
                except OSError:
                    pass
        self.scope.cancel()


class _Proxy:
    def __init__(self, host: str, port: int, target: tuple[str, int]) -> None:
        self.host = host
        self.port = port
        self.target = target
        self.mode = "pass"              # pass | cut | blackhole
        self.pipes: set[_Pipe] = set()
        self.accepted = 0
        self.listen_scope: trio.CancelScope | None = None

    async def listen(self, nursery: trio.Nursery) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        self.port = listeners[0].socket.getsockname()[1]
        scope = self.listen_scope = trio.CancelScope()

        async def serve() -> None:
            with scope:
                await trio.serve_listeners(self._handle, listeners, handler_nursery=nursery)
            for listener in listeners:
                await listener.aclose()

        nursery.start_soon(serve)

    async def _handle(self, down: trio.SocketStream) -> None:
        self.accepted += 1
        pipe = _Pipe(down, tainted=self.mode == "blackhole")
        self.pipes.add(pipe)
        try:
            with pipe.scope:
                if not pipe.tainted:
                    try:
                        pipe.up = await trio.open_tcp_stream(*self.target)
                    except OSError:
                        pipe.reset()   # target down: the client sees a reset, as via a router
                        return
                    if pipe.tainted:     # a blackhole began while we dialed
                        await self._pump(down, None, pipe)
                        return
                    async with trio.open_nursery() as n:
                        n.start_soon(self._pump, down, pipe.up, pipe)
                        n.start_soon(self._pump, pipe.up, down, pipe)
                else:
                    await self._pump(down, None, pipe)
        finally:
            self.pipes.discard(pipe)
            for stream in (down, pipe.up):
                if stream is not None:
                    await trio.aclose_forcefully(stream)

    async def _pump(self, src: trio.SocketStream, dst: trio.SocketStream | None,
                    pipe: _Pipe) -> None:
        """Copy src -> dst until EOF; in a blackhole read and drop, never close."""
        try:
            while True:
                data = await src.receive_some(65536)
                if pipe.tainted or dst is None:
                    if not data:
                        await trio.sleep_forever()   # a half-open peer says nothing
                    continue
                if not data:
                    await dst.send_eof()
                    return
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pipe.reset()

    async def command(self, line: str, nursery: trio.Nursery) -> str | None:
        word, _, arg = line.strip().partition(" ")
        if word == "cut":
            self.mode = "cut"
            if self.listen_scope is not None:
                self.listen_scope.cancel()
                self.listen_scope = None
            for pipe in list(self.pipes):
                pipe.reset()
            while self.pipes:                  # answer only once they are really gone
                await trio.sleep(0.001)
        elif word == "blackhole":
            self.mode = "blackhole"
            for pipe in self.pipes:
                pipe.tainted = True
        elif word == "restore":
            for pipe in list(self.pipes):
                if pipe.tainted:
                    pipe.reset()
            if self.mode == "cut":
                await self.listen(nursery)
            self.mode = "pass"
        elif word == "target":
            host, _, port = arg.rpartition(":")
            self.target = (host, int(port))
        elif word == "status":
            return f"ok status mode={self.mode} conns={len(self.pipes)} accepted={self.accepted}"
        elif word == "quit":
            return None
        else:
            return f"error unknown command {word!r}"
        return f"ok {word}"


async def _serve(host: str, port: int, target: tuple[str, int]) -> None:
    proxy = _Proxy(host, port, target)
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    async with trio.open_nursery() as nursery:
        await proxy.listen(nursery)
        print(f"port {proxy.port}", flush=True)
        buffered = b""
        while True:
            data = await stdin.receive_some(4096)
            if not data:
                break
            buffered += data
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                reply = await proxy.command(line.decode(), nursery)
                if reply is None:
                    nursery.cancel_scope.cancel()
                    return
                print(reply, flush=True)
        nursery.cancel_scope.cancel()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.proxy")
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to accept on")
    parser.add_argument("--target", required=True, help="HOST:PORT to relay to")
    args = parser.parse_args(argv)
    host, port = _address(args.listen)
    trio.run(_serve, host, port, _address(args.target))
    return 0


# --------------------------------------------------------------------------- test side

REPO_ROOT = Path(__file__).resolve().parents[2]


class ProxyProcess:
    """The proxy as a child process.  Methods block for at most ``timeout`` seconds;
    async tests call them through ``trio.to_thread.run_sync``."""

    def __init__(self, target_port: int, *, listen_port: int = 0) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                          env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.proxy", "--listen",
             f"127.0.0.1:{listen_port}", "--target", f"127.0.0.1:{target_port}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=str(REPO_ROOT))
        self._buffer = b""
        first = self._line(20.0)
        if not first.startswith("port "):
            raise AssertionError(f"proxy did not start: {first!r}")
        self.port = int(first.split()[1])

    def _line(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None and not select.select(
                    [fd], [], [], 0)[0]:
                raise AssertionError(f"proxy gave no answer (exit {self.proc.poll()})")
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise AssertionError("proxy closed its stdout")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def command(self, line: str, timeout: float = 10.0) -> str:
        """Send one command; return the proxy's answer once it took effect."""
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        answer = self._line(timeout)
        if not answer.startswith("ok"):
            raise AssertionError(f"proxy refused {line!r}: {answer}")
        return answer

    def cut(self) -> None:
        self.command("cut")

    def blackhole(self) -> None:
        self.command("blackhole")

    def restore(self) -> None:
        self.command("restore")

    def status(self) -> dict[str, str]:
        return dict(part.split("=", 1) for part in self.command("status").split()[2:])

    def stop(self) -> None:
        """Quit (idempotent); kill if it does not go within a few seconds."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b"quit\n")
                self.proc.stdin.flush()
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main())
