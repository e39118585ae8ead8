"""The kill -9 test: a real `treefed broker` process is SIGKILLed while a producer
pipelines 10,000 persistent messages; after a restart every confirmed message is there,
and once acked none comes back."""

from __future__ import annotations

import signal

import pytest
import trio

from treefed.client import ConnectionClosed, connect

from tests.node.helpers import BrokerProcess, wait_for, write_config

TOTAL = 10_000
KILL_AFTER = 3_000  # confirmations seen before the kill


async def _drain(uri: str, dst: str, expected: int) -> list[str]:
    """Receive and ack ``expected`` messages, then make sure nothing else is queued.
    A stat round trip at the end proves the acks were committed (its reply is sent
    after the batch holding them)."""
    got: list[str] = []
    async with connect(uri) as conn:
        sub = await conn.subscribe(dst, prefetch=1000)
        while len(got) < expected:
            msg = await sub.receive()
            got.append(msg.id)
            msg.ack_nowait()
        stats = await conn.stat()
        assert stats["destinations"][dst]["depth"] == 0
        assert sub.queued == 0
    return got


class TestKillDashNine:
    @pytest.mark.slow
    async def test_confirmed_messages_survive_sigkill(self, tmp_path):
        """Every message confirmed before SIGKILL is delivered after the restart, each
        once; after they are acked and the broker is killed again, none returns."""
        config = write_config(tmp_path / "broker.toml", "crashy", tmp_path / "data")
        broker = BrokerProcess(config, tmp_path / "broker.log")
        dst = "queue://crash.test"
        try:
            with trio.fail_after(60):
                uri = await trio.to_thread.run_sync(broker.start)
                sent: list[str] = []
                # a small pipeline window keeps most sends in the future when the
                # kill lands, however fast the machine is
                async with connect(uri, client_id="crash-producer",
                                   max_unconfirmed=200) as producer:
                    async def produce() -> None:
                        try:
                            for i in range(TOTAL):
                                sent.append(await producer.send(
                                    dst, f"m{i}".encode(), persistent=True, confirm=False))
                            await producer.wait_confirmed()
                        except ConnectionClosed:
                            pass

                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(produce)
                        await wait_for(lambda: producer.confirmed_total >= KILL_AFTER,
                                       timeout=30, interval=0.001)
                        broker.proc.send_signal(signal.SIGKILL)
                        await trio.to_thread.run_sync(broker.proc.wait)
                    unconfirmed = set(producer.unconfirmed())
                confirmed = [m for m in sent if m not in unconfirmed]
                assert KILL_AFTER <= len(confirmed) < TOTAL, "the kill came too late"

                uri = await trio.to_thread.run_sync(broker.start)
                async with connect(uri) as probe:
                    depth = (await probe.stat())["destinations"][dst]["depth"]
                # everything confirmed is there; anything extra was sent and committed
                # but its receipt was lost with the process
                assert len(confirmed) <= depth <= len(sent)
                received = await _drain(uri, dst, depth)
                assert len(received) == len(set(received)), "a message was delivered twice"
                assert set(confirmed) <= set(received)
                assert set(received) <= set(sent)

                await trio.to_thread.run_sync(broker.kill)
                uri = await trio.to_thread.run_sync(broker.start)
                async with connect(uri) as probe:
                    stats = await probe.stat()
                assert stats["destinations"].get(dst, {"depth": 0})["depth"] == 0
                assert await trio.to_thread.run_sync(broker.terminate) == 0
        finally:
            broker.cleanup()
