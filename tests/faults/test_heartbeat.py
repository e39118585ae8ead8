"""Half-open peers: a link (or a client connection) whose far end goes silent without
closing is found dead by heartbeats within two intervals and torn down; the link comes
back when the network does, and nothing is lost."""

from __future__ import annotations

import pytest
import trio

from tests.faults.harness import Ledger, Traffic, wait_until
from tests.faults.proxy import ProxyProcess

FLOWS = [("hq", "s1", "queue://s1.in"), ("s1", "hq", "queue://hq.in")]
INTERVAL = 0.5
#: detection takes 2-3 intervals (pinged after one silent interval, dead one interval
#: later, checked once per interval); the rest is slack for stat polling on a busy host
BOUND = 3 * INTERVAL + 2.5

#: real broker processes: seconds per test, so the whole module counts as slow
pytestmark = pytest.mark.slow


async def _link_to(broker, peer: str) -> bool:
    stats = await broker.stat()
    return stats is not None and any(c.get("peer") == peer and c["kind"] == "link"
                                     for c in stats["conns"])


class TestHalfOpenLink:
    async def test_silent_link_is_detected_and_recovers(self, estates, mode,
                                                        record_property):
        """The store<->region link black-holes: both brokers tear it down within two
        heartbeat intervals (plus one check), the store keeps re-dialling, and once the
        network is back every confirmed message is delivered once, in order."""
        estate = estates(mode, proxied=("s1",), heartbeat=INTERVAL)
        ledger = Ledger()
        with trio.fail_after(90):
            await estate.start()
            store, region = estate.brokers["s1"], estate.brokers["r1"]
            async with trio.open_nursery() as nursery:
                traffic = Traffic(estate, ledger, FLOWS, rate=100)
                await traffic.start(nursery)
                await wait_until(lambda: len(ledger.deliveries) > 50, 20, "traffic")
                proxy = estate.proxies["s1"]
                await trio.to_thread.run_sync(proxy.blackhole)
                t0 = trio.current_time()

                async def store_sees_it_dead() -> bool:
                    stats = await store.stat()
                    return stats is not None and all(
                        c["state"] != "operational" or c["connects"] > 1
                        for c in stats["connectors"]) and not await _link_to(store, "r1")

                async def region_sees_it_dead() -> bool:
                    return not await _link_to(region, "s1")

                await wait_until(store_sees_it_dead, 10, "the store to drop the link")
                t_store = trio.current_time() - t0
                await wait_until(region_sees_it_dead, 10, "the region to drop the link")
                t_region = trio.current_time() - t0
                assert t_store <= BOUND and t_region <= BOUND, (t_store, t_region)
                stats = await store.stat()
                [connector] = stats["connectors"]
                assert connector["state"] in ("waiting", "connecting")
                assert connector["last_error"]
                await trio.to_thread.run_sync(proxy.restore)
                await estate.wait_linked()
                await traffic.stop_producers()
                await traffic.drained(timeout=60)
                summary = ledger.check()
                traffic.stop_consumers()
            codes = await estate.stop()
        figures = {"mode": mode, "interval_s": INTERVAL, "store_detect_s": round(t_store, 3),
                   "region_detect_s": round(t_region, 3), **summary}
        print(f"\nhalf-open figures: {figures}")
        record_property("figures", figures)
        assert all(code == 0 for code in codes.values()), codes


class TestHalfOpenClient:
    async def test_silent_client_is_dropped_and_reconnects(self, estates, mode):
        """A consumer whose connection black-holes: the broker drops it within two
        intervals (its unacked messages go back on the queue), the client notices the
        silence too and fails over, and all confirmed messages arrive once, in order."""
        estate = estates(mode, heartbeat=INTERVAL)
        ledger = Ledger()
        with trio.fail_after(90):
            await estate.start()
            store = estate.brokers["s1"]
            proxy = await trio.to_thread.run_sync(ProxyProcess, estate.sites["s1"].port)
            estate.proxies["client"] = proxy
            uri = (f"failover:(tcp://127.0.0.1:{proxy.port})"
                   "?initialReconnectDelay=100&maxReconnectDelay=500")
            async with trio.open_nursery() as nursery:
                traffic = Traffic(estate, ledger, [("hq", "s1", "queue://s1.in")], rate=100,
                                  uris={"s1": uri})
                await traffic.start(nursery)
                await wait_until(lambda: len(ledger.deliveries) > 50, 20, "traffic")

                async def dropped() -> bool:
                    stats = await store.stat()
                    return stats is not None and not any(
                        c["dst"] == "queue://s1.in" and c["peer"] is None
                        for c in stats["consumers"])

                assert not await dropped()
                await trio.to_thread.run_sync(proxy.blackhole)
                t0 = trio.current_time()
                await wait_until(dropped, 10, "the store to drop the silent client")
                assert trio.current_time() - t0 <= BOUND
                await trio.to_thread.run_sync(proxy.restore)
                await traffic.stop_producers()
                await traffic.drained(timeout=60)
                ledger.check()
                consumer = traffic.consumers["queue://s1.in"]
                assert consumer.reconnects >= 1
                traffic.stop_consumers()
            codes = await estate.stop()
        assert all(code == 0 for code in codes.values()), codes
