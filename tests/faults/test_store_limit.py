"""Limits reached during an outage: with the store's uplink cut, its backlog for HQ hits
the configured limit.  The producer is flow-controlled (``block``) or refused with a clear
error (``max_store_bytes``), the broker keeps serving, traffic to other destinations is
not held up, and once the link returns every confirmed message is delivered once, in
order, and nothing refused ever is."""

from __future__ import annotations

import pytest
import trio

from tests.faults.harness import Ledger, Producer, Traffic, wait_until

LOCAL = ("s1", "s1", "queue://s1.local")      # stays inside the store
UP = ("s1", "hq", "queue://hq.in")            # crosses the cut link

#: real broker processes: seconds per test, so the whole module counts as slow
pytestmark = pytest.mark.slow


async def _started(estates, mode, *, broker=None, policies=None):
    """An estate whose store s1 reaches its region through a cuttable proxy."""
    estate = estates(mode, proxied=("s1",), broker=broker or {}, policies=policies or {})
    await estate.start()
    return estate


def _blocked(ledger: Ledger, dst: str, *, held: float = 1.0) -> bool:
    """A send to ``dst`` has waited ``held`` seconds for its receipt (a flowing send's
    receipt comes within milliseconds)."""
    now = trio.current_time()
    return any(d == dst and now - t >= held and m not in ledger.confirmed
               and m not in ledger.refused for m, (d, t) in ledger.sent.items())


class TestDestinationLimit:
    async def test_blocked_producer_resumes_after_the_outage(self, estates, mode):
        """``limit_behaviour = "block"`` on the outbound queue: during the outage the
        producer stalls at the limit (no error, nothing dropped) while a local flow goes
        on; when the link returns it resumes and everything arrives."""
        limit = 60
        policies = {"s1": [{"pattern": "queue://hq.>", "max_messages": limit,
                            "limit_behaviour": "block"}]}
        estate = await _started(estates, mode, policies=policies)
        ledger = Ledger()
        with trio.fail_after(90):
            async with trio.open_nursery() as nursery:
                traffic = Traffic(estate, ledger, [UP, LOCAL], rate=200)
                await traffic.start(nursery)
                up_producer, local_producer = traffic.producers
                local_consumer = traffic.consumers["queue://s1.local"]
                await trio.to_thread.run_sync(estate.proxies["s1"].cut)
                t_cut = trio.current_time()
                # the producer stalls once `limit` messages wait for the link
                await wait_until(lambda: ledger.confirmed_between(t_cut, 1e18, UP[2])
                                 >= limit - 5, 20, "the backlog to reach the limit")
                # blocked: a send awaits its receipt (polled, not a fixed wait: under load
                # the last sends before the limit can take longer than any fixed sleep)
                await wait_until(lambda: _blocked(ledger, UP[2]), 20,
                                 "the producer to block on a send")
                stalled_at = up_producer.sent
                local_before = local_consumer.received
                # while 50 local messages arrive, the blocked producer sends nothing
                await wait_until(lambda: local_consumer.received > local_before + 50, 20,
                                 "local traffic to go on")
                assert up_producer.sent == stalled_at, "a blocked producer kept sending"
                assert not up_producer.refusals
                assert await estate.brokers["s1"].stat() is not None
                await trio.to_thread.run_sync(estate.proxies["s1"].restore)
                await wait_until(lambda: up_producer.sent > stalled_at + 50, 30,
                                 "the producer to resume")
                await traffic.stop_producers()
                await traffic.drained(timeout=60)
                summary = ledger.check()
                traffic.stop_consumers()
            codes = await estate.stop()
        assert summary["refused"] == 0
        assert all(code == 0 for code in codes.values()), codes


class TestStoreFull:
    async def test_full_store_refuses_producers_and_keeps_serving(self, estates, mode,
                                                                  record_property):
        """``max_store_bytes`` reached while the uplink is cut: persistent sends are
        refused with ``store_full`` (not confirmed, never delivered); the broker serves on;
        after the link returns the backlog drains, space frees, sends succeed again."""
        estate = await _started(estates, mode,
                                     broker={"s1": {"max_store_bytes": 256 * 1024}})
        ledger = Ledger()
        with trio.fail_after(90):
            async with trio.open_nursery() as nursery:
                traffic = Traffic(estate, ledger, [UP], rate=100)
                await traffic.start(nursery)
                await wait_until(lambda: len(ledger.deliveries) > 20, 20, "traffic")
                await trio.to_thread.run_sync(estate.proxies["s1"].cut)
                big = Producer(ledger, estate.uri("s1"), UP[2], "big", rate=400,
                               body_size=2048)
                await nursery.start(big.run)
                await wait_until(lambda: len(big.refusals) >= 10, 30, "the store to fill")
                assert set(big.refusals) == {"store_full"}
                assert await estate.brokers["s1"].stat() is not None   # still serving
                await trio.to_thread.run_sync(estate.proxies["s1"].restore)
                t_back = trio.current_time()
                await wait_until(lambda: ledger.confirmed_between(t_back, 1e18) > 100, 30,
                                 "sends to be confirmed again")
                big.stop.set()
                await traffic.stop_producers()
                await wait_until(big.done.is_set, 10, "the big producer to stop")
                await traffic.drained(timeout=60)
                summary = ledger.check()
                traffic.stop_consumers()
            codes = await estate.stop()
        figures = {"mode": mode, **summary}
        print(f"\nstore-full figures: {figures}")
        record_property("figures", figures)
        assert summary["refused"] >= 10
        assert all(code == 0 for code in codes.values()), codes
