"""The link-cutting proxy the fault suite relies on: relays, cuts, black-holes, restores."""

from __future__ import annotations

import trio

from tests.faults.proxy import ProxyProcess


async def _echo_server(nursery: trio.Nursery) -> int:
    async def echo(stream: trio.SocketStream) -> None:
        try:
            async for data in stream:
                await stream.send_all(data)
        except trio.BrokenResourceError:
            pass

    listeners = await nursery.start(trio.serve_tcp, echo, 0)
    return listeners[0].socket.getsockname()[1]


async def _round_trip(port: int, payload: bytes = b"ping") -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(payload)
        return await stream.receive_some(100)


class TestProxyProcess:
    async def test_relays_cuts_and_restores(self):
        """Bytes are relayed; a cut resets live connections and refuses new ones; a
        restore relays again on the same port."""
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                target = await _echo_server(nursery)
                proxy = await trio.to_thread.run_sync(ProxyProcess, target)
                try:
                    assert await _round_trip(proxy.port) == b"ping"
                    live = await trio.open_tcp_stream("127.0.0.1", proxy.port)
                    await live.send_all(b"x")
                    assert await live.receive_some(10) == b"x"
                    await trio.to_thread.run_sync(proxy.cut)
                    try:
                        got = await live.receive_some(10)
                    except trio.BrokenResourceError:
                        got = b""
                    assert got == b""                       # dropped
                    try:
                        await trio.open_tcp_stream("127.0.0.1", proxy.port)
                        refused = False
                    except OSError:
                        refused = True
                    assert refused, "a cut proxy accepted a connection"
                    await trio.to_thread.run_sync(proxy.restore)
                    assert await _round_trip(proxy.port, b"again") == b"again"
                    await trio.aclose_forcefully(live)
                finally:
                    await trio.to_thread.run_sync(proxy.stop)
                nursery.cancel_scope.cancel()

    async def test_blackhole_is_silent_until_restore(self):
        """In a blackhole a connection stays open but nothing comes back, not even EOF;
        a restore resets it, and new connections relay again."""
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                target = await _echo_server(nursery)
                proxy = await trio.to_thread.run_sync(ProxyProcess, target)
                try:
                    live = await trio.open_tcp_stream("127.0.0.1", proxy.port)
                    await trio.to_thread.run_sync(proxy.blackhole)
                    await live.send_all(b"lost")
                    with trio.move_on_after(0.3) as silent:
                        await live.receive_some(10)
                    assert silent.cancelled_caught, "a black-holed link answered"
                    fresh = await trio.open_tcp_stream("127.0.0.1", proxy.port)  # accepted
                    await fresh.send_all(b"lost too")
                    with trio.move_on_after(0.2) as silent:
                        await fresh.receive_some(10)
                    assert silent.cancelled_caught
                    assert proxy.status()["mode"] == "blackhole"
                    await trio.to_thread.run_sync(proxy.restore)
                    try:
                        got = await live.receive_some(10)
                    except trio.BrokenResourceError:
                        got = b""
                    assert got == b"", "a black-holed connection survived the restore"
                    assert await _round_trip(proxy.port) == b"ping"
                    for s in (live, fresh):
                        await trio.aclose_forcefully(s)
                finally:
                    await trio.to_thread.run_sync(proxy.stop)
                nursery.cancel_scope.cancel()
