"""Graceful shutdown: SIGTERM makes a broker stop accepting, flush, close its links with
``bye`` and exit 0 within a bounded time; restarted, it carries on with nothing lost."""

from __future__ import annotations

import time

import pytest
import trio

from tests.faults.harness import Ledger, Traffic, wait_until

FLOWS = [("hq", "s1", "queue://s1.in"), ("s1", "hq", "queue://hq.in")]
BOUND = 5.0   # seconds a SIGTERMed broker may take

#: real broker processes: seconds per test, so the whole module counts as slow
pytestmark = pytest.mark.slow


class TestGracefulShutdown:
    async def test_sigterm_mid_stream_exits_cleanly(self, estates, mode, record_property):
        """SIGTERM of the region while messages flow through it: exit status 0 within
        the bound, its peers are told ``bye`` (no heartbeat timeout needed), and after a
        restart every confirmed message is delivered once, in order."""
        estate = estates(mode)
        ledger = Ledger()
        with trio.fail_after(90):
            await estate.start()
            region, store = estate.brokers["r1"], estate.brokers["s1"]
            async with trio.open_nursery() as nursery:
                traffic = Traffic(estate, ledger, FLOWS, rate=150)
                await traffic.start(nursery)
                await wait_until(lambda: len(ledger.deliveries) > 100, 20, "traffic")
                began = time.monotonic()
                code = await trio.to_thread.run_sync(region.terminate, BOUND + 5)
                took = time.monotonic() - began
                assert code == 0 and took < BOUND, (code, took)
                assert region.events("broker.stopped")
                await wait_until(lambda: any(e.get("reason") for e in
                                             store.events("conn.bye")), 5,
                                 "the store to hear the region's bye")
                region.start()
                await region.wait_serving()
                await estate.wait_linked()
                await trio.sleep(0.5)
                await traffic.stop_producers()
                await traffic.drained(timeout=60)
                summary = ledger.check()
                traffic.stop_consumers()
            codes = await estate.stop()
        figures = {"mode": mode, "sigterm_exit_s": round(took, 3), **summary}
        print(f"\nshutdown figures: {figures}")
        record_property("figures", figures)
        assert all(c == 0 for c in codes.values()), codes
