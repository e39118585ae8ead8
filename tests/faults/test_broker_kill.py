"""Brokers dying mid-stream: the region is SIGKILLed and restarted; the master HQ is
SIGKILLed and its slave on the same data directory takes over.  Either way every
confirmed message is delivered exactly once and in order."""

from __future__ import annotations

import pytest
import trio

from tests.faults.harness import Ledger, Traffic, wait_until

FLOWS = [("hq", "s1", "queue://s1.in"), ("s1", "hq", "queue://hq.in")]

#: real broker processes: seconds per test, so the whole module counts as slow
pytestmark = pytest.mark.slow


class TestRegionKill:
    async def test_region_sigkill_and_restart(self, estates, mode, record_property):
        """kill -9 of the region in the middle of the stream, restart: the backlog held
        on both sides of it (and in its own store) is delivered once, in order."""
        estate = estates(mode)
        ledger = Ledger()
        with trio.fail_after(120):
            await estate.start()
            async with trio.open_nursery() as nursery:
                traffic = Traffic(estate, ledger, FLOWS, rate=150)
                await traffic.start(nursery)
                await wait_until(lambda: len(ledger.deliveries) > 100, 20, "traffic")
                region = estate.brokers["r1"]
                await trio.to_thread.run_sync(region.kill)
                t_kill = trio.current_time()
                await trio.sleep(1.0)                 # producers go on meanwhile
                region.start()
                await region.wait_serving()
                await estate.wait_linked()
                t_back = trio.current_time()
                await trio.sleep(0.5)
                await traffic.stop_producers()
                await traffic.drained(timeout=60)
                summary = ledger.check()
                traffic.stop_consumers()
            figures = {"mode": mode, "down_s": round(t_back - t_kill, 3),
                       "duplicates_suppressed": await estate.dropped("duplicate"),
                       **summary}
            codes = await estate.stop()
        print(f"\nregion-kill figures: {figures}")
        record_property("figures", figures)
        assert all(code == 0 for code in codes.values()), codes


class TestMasterSlave:
    async def test_slave_takes_over_when_the_master_is_killed(self, estates, mode,
                                                              record_property):
        """Two HQ brokers on one data directory: the slave waits without listening; when
        the master is SIGKILLed it takes the lock, serves, and the region and the
        clients (failover URIs) carry on with nothing lost or doubled."""
        estate = estates(mode, hq_slave=True)
        ledger = Ledger()
        with trio.fail_after(120):
            await estate.start()
            master, slave = estate.brokers["hq"], estate.brokers["hq-slave"]
            await wait_until(lambda: slave.events("broker.slave"), 20, "the slave waiting")
            assert await slave.stat(timeout=0.5) is None, "a slave must not listen"
            async with trio.open_nursery() as nursery:
                traffic = Traffic(estate, ledger, FLOWS, rate=150)
                await traffic.start(nursery)
                await wait_until(lambda: len(ledger.deliveries) > 100, 20, "traffic")
                await trio.to_thread.run_sync(master.kill)
                t_kill = trio.current_time()
                await slave.wait_serving(timeout=30)
                t_serving = trio.current_time()
                await estate.wait_linked()
                await trio.sleep(0.5)
                await traffic.stop_producers()
                await traffic.drained(timeout=60)
                summary = ledger.check()
                traffic.stop_consumers()
            # the old master comes back as the slave of the new one
            master.start()
            await wait_until(lambda: master.events("broker.slave"), 20,
                             "the old master waiting as slave")
            figures = {"mode": mode, "takeover_s": round(t_serving - t_kill, 3),
                       "duplicates_suppressed": await estate.dropped("duplicate"),
                       **summary}
            codes = await estate.stop()
        print(f"\nmaster/slave figures: {figures}")
        record_property("figures", figures)
        assert all(code == 0 for code in codes.values()), codes
