"""Store-and-forward across a WAN outage: the store<->region link is cut (TCP proxy) while
HQ and the store keep producing to each other; after the link returns every confirmed
message arrives exactly once and in order.  A second store's traffic is unaffected."""

from __future__ import annotations

import pytest
import trio

from tests.faults.harness import MODES, Ledger, Traffic

FLOWS = [("hq", "s1", "queue://s1.in"), ("s1", "hq", "queue://hq.in"),
         ("hq", "s2", "queue://s2.in"), ("s2", "hq", "queue://hq.up2")]
CROSSING = ("queue://s1.in", "queue://hq.in")   # the flows the cut interrupts

#: real broker processes: seconds per test, so the whole module counts as slow
pytestmark = pytest.mark.slow


async def _link_cut(estates, mode: str, cut: float, record) -> dict:
    estate = estates(mode, stores=2, proxied=("s1",))
    ledger = Ledger()
    with trio.fail_after(cut + 90):
        await estate.start()
        async with trio.open_nursery() as nursery:
            traffic = Traffic(estate, ledger, FLOWS, rate=40)
            await traffic.start(nursery)
            await trio.sleep(1.0)                         # traffic flows before the cut
            proxy = estate.proxies["s1"]
            await trio.to_thread.run_sync(proxy.cut)
            t_cut = trio.current_time()       # the proxy answers once the cut is done
            s2_before = traffic.consumers["queue://s2.in"].received
            await trio.sleep(cut)                         # the outage (producers go on)
            # the other store's link kept working all along
            assert traffic.consumers["queue://s2.in"].received > s2_before
            t_back = trio.current_time()
            await trio.to_thread.run_sync(proxy.restore)
            await trio.sleep(0.5)
            await traffic.stop_producers()
            t_drained = await traffic.drained(timeout=60)
            summary = ledger.check()
            during = {m for m, t in ledger.confirmed.items()
                      if t_cut <= t < t_back and ledger.sent[m][0] in CROSSING}
            backlog = {m for m, t in ledger.confirmed.items()
                       if t < t_back and ledger.sent[m][0] in CROSSING}
            after = sum(1 for d in ledger.deliveries if d.msg in during and d.at >= t_back)
            figures = {
                "mode": mode, "cut_s": cut,
                "produced_during_outage": len(during),
                "delivered_after_return": after,
                "duplicates_suppressed": await estate.dropped("duplicate"),
                "drain_s": round(ledger.last_acceptance(backlog) - t_back, 3),
                **summary,
            }
            traffic.stop_consumers()
        codes = await estate.stop()
    assert figures["produced_during_outage"] > 0
    assert figures["delivered_after_return"] == figures["produced_during_outage"]
    assert all(code == 0 for code in codes.values()), codes
    print(f"\nlink-cut figures: {figures}")
    record("figures", figures)
    return figures


class TestLinkCut:
    async def test_thirty_second_cut_in_both_modes(self, estates, record_property):
        """The issue's 30 s outage, a tree estate and a mesh estate side by side (the
        wait is the cost, not the CPU): each backlog drains once its link returns."""
        results: dict[str, dict] = {}

        async def run(mode: str) -> None:
            results[mode] = await _link_cut(estates, mode, 30.0,
                                            lambda k, v: record_property(f"{k}-{mode}", v))

        async with trio.open_nursery() as nursery:
            for mode in MODES:
                nursery.start_soon(run, mode)
        for figures in results.values():
            assert figures["drain_s"] < 10.0, figures
