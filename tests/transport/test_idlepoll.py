"""Polling after reads instead of sleeping (transport/idlepoll.py; issue #14, session 12).

``PollWindow`` is pure: its window grows to cover the gaps between reads that polling
would have caught and shrinks to nothing when they are longer than the operator's
maximum.  ``IdlePoller`` polls while reads keep coming within the window and stops after
it; a broker (``[broker] idle_poll_us``) and a client (``connect(..., idle_poll_us=)``)
poll and report it, and messages flow as without it."""

from __future__ import annotations

import functools

import pytest
import trio

from treefed.client import connect
from treefed.config import parse_config
from treefed.errors import ConfigError
from treefed.transport.idlepoll import COVER, MAX_US, START_US, IdlePoller, PollWindow

from tests.node.helpers import make_config, start_node

DST = "queue://polled"


class TestPollWindow:
    def test_a_gap_polling_would_have_caught_grows_the_window_to_cover_it(self) -> None:
        w = PollWindow(1000)
        assert w.us == 0
        w.missed(400)
        assert w.us == 400 * COVER
        w.missed(100)   # shorter than the window: doubles, as KVM's halt polling
        assert w.us == 2 * 400 * COVER
        w.missed(900)
        assert w.us == 1000   # never beyond the maximum

    def test_a_gap_beyond_the_maximum_halves_the_window_down_to_nothing(self) -> None:
        w = PollWindow(1000)
        w.missed(800)
        assert w.us == 1000
        w.missed(5000)
        assert w.us == 500
        for _ in range(5):
            w.missed(5000)
        assert w.us == 0   # below START_US: no polling at all
        w.missed(1)        # a short gap starts it again, at START_US at least
        assert w.us == START_US

    def test_a_zero_maximum_never_polls(self) -> None:
        w = PollWindow(0)
        w.missed(1)
        assert w.us == 0

    @pytest.mark.parametrize("bad", [-1, MAX_US + 1])
    def test_a_maximum_out_of_range_is_refused(self, bad: int) -> None:
        with pytest.raises(ValueError, match="idle poll window"):
            PollWindow(bad)


async def _until(predicate, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.001)


class TestIdlePoller:
    async def test_polls_while_reads_come_and_stops_after_the_window(self) -> None:
        now = [100.0]   # the poller's clock (s): it moves only when the test says
        poller = IdlePoller(MAX_US, clock=lambda: now[0])
        poller.window.missed(2000)    # as if a read had come 2 ms after the one before
        assert poller.window.us == 2000 * COVER
        async with trio.open_nursery() as nursery:
            nursery.start_soon(poller.run)
            poller.poke()
            await _until(lambda: poller._polling)
            now[0] += 0.002           # within the 2.5 ms window
            poller.poke()             # a read while polling: counted as caught
            await _until(lambda: poller.hits == 1)
            assert poller._polling and poller.misses == 0
            now[0] += 0.0026          # 2.6 ms since that read: the window is over
            # nothing more: the poller gives up and sleeps
            await _until(lambda: not poller._polling)
            assert poller.misses == 1
            hits = poller.hits
            await trio.sleep(0.05)
            assert poller.hits == hits and poller.misses == 1   # asleep: no passes
            nursery.cancel_scope.cancel()

    async def test_does_not_poll_while_its_window_is_zero(self) -> None:
        poller = IdlePoller(MAX_US)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(poller.run)
            poller.poke()             # the first read: no gap known, window 0
            await trio.sleep(0.02)
            assert not poller._polling and poller.hits == poller.misses == 0
            nursery.cancel_scope.cancel()


def test_the_broker_option_is_checked() -> None:
    base = {"id": "b", "data_dir": "/tmp/x"}
    assert parse_config({"broker": base}).broker.idle_poll_us == 0   # off by default
    assert parse_config({"broker": {**base, "idle_poll_us": 800}}).broker.idle_poll_us == 800
    for bad in (-5, MAX_US + 1, "fast"):
        with pytest.raises(ConfigError, match="idle_poll_us"):
            parse_config({"broker": {**base, "idle_poll_us": bad}})


async def _consume(sub, n: int, got: list) -> None:
    for _ in range(n):
        msg = await sub.receive()
        got.append(msg.body)
        msg.ack_nowait()


def _caught(node, *conns) -> bool:
    return node.statistics()["idle_poll"]["hits"] > 0 and all(
        c.poller.hits > 0 for c in conns)


async def test_a_polling_broker_and_clients_deliver_one_at_a_time_sends(
        nursery, tmp_path) -> None:
    """One-at-a-time persistent sends through a broker and clients that all poll
    (maximum 10 ms): every message once, in order, and the broker's ``stat`` and both
    clients report polls that caught a read.  Sends go on in rounds of 50 until all
    three did (a round's gaps between reads may all exceed 10 ms on a machine loaded
    enough; a poller that never catches a read fails at the bound)."""
    node, uri = await start_node(nursery, make_config(tmp_path / "d", idle_poll_us=MAX_US))
    got: list = []
    n = 0
    with trio.fail_after(120):
        async with connect(uri, idle_poll_us=MAX_US) as consumer, \
                connect(uri, idle_poll_us=MAX_US) as producer:
            sub = await consumer.subscribe(DST, prefetch=100)
            while n < 50 or not _caught(node, producer, consumer):
                assert n < 2000, (node.statistics()["idle_poll"], producer.poller.hits,
                                  consumer.poller.hits)
                async with trio.open_nursery() as inner:
                    inner.start_soon(functools.partial(_consume, sub, 50, got))
                    for i in range(n, n + 50):
                        await producer.send(DST, f"m{i}".encode(), persistent=True)
                n += 50
            assert node.statistics()["idle_poll"]["max_us"] == MAX_US
    assert got == [f"m{i}".encode() for i in range(n)]


async def test_a_broker_and_a_client_do_not_poll_by_default(nursery, tmp_path) -> None:
    node, uri = await start_node(nursery, make_config(tmp_path / "d"))
    async with connect(uri) as conn:
        await conn.send(DST, b"x", persistent=True)
        assert conn.poller is None
    assert "idle_poll" not in node.statistics()
