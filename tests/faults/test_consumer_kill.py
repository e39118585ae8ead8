"""A consumer process is SIGKILLed holding unacknowledged messages: the broker gives them
to the next consumer, flagged as redelivered, and nothing is lost or doubled."""

from __future__ import annotations

import pytest
import trio

from tests.faults.harness import (ConsumerProcess, Consumer, Delivery, Ledger, Producer,
                                  wait_until)

DST = "queue://s1.in"

#: real broker processes: seconds per test, so the whole module counts as slow
pytestmark = pytest.mark.slow


async def _kill_and_drain(estate, ledger: Ledger, doomed: ConsumerProcess):
    """Produce 300 messages to the store's queue; SIGKILL ``doomed`` once it holds 40
    unacked; a survivor drains.  Returns the ledger summary and the held ids."""
    await estate.wait_demand("hq", DST)
    async with trio.open_nursery() as nursery:
        producer = Producer(ledger, estate.uri("hq"), DST, "p-hq", rate=200, count=300)
        nursery.start_soon(producer.run)
        ready = await trio.to_thread.run_sync(doomed.read_until_ready)
        assert ready["ready"] == 40
        await trio.to_thread.run_sync(doomed.kill)
        now = trio.current_time()
        held = []
        for line in doomed.lines:
            if "id" in line:
                ledger.record_delivery(Delivery(line["id"], DST, line["redelivered"], now,
                                                "doomed", acked=line["acked"]))
                if not line["acked"]:
                    held.append(line["id"])
        assert len(held) == 40
        await producer.done.wait()
        survivor = Consumer(ledger, estate.uri("s1"), DST, "survivor")
        await nursery.start(survivor.run)
        await wait_until(ledger.all_confirmed_accepted, 30, "every confirmed message accepted")
        summary = ledger.check()
        again = {d.msg: d.redelivered for d in ledger.deliveries
                 if d.consumer == "survivor" and d.msg in set(held)}
        assert set(again) == set(held), "a held message was not redelivered"
        assert all(n >= 1 for n in again.values()), again
        first = [d.msg for d in ledger.deliveries if d.consumer == "survivor"][:40]
        assert first == held, "redeliveries did not come first, in order"
        survivor.cancel.cancel()
    return summary, held


class TestConsumerKill:
    async def test_unacked_messages_are_redelivered_flagged(self, estates, mode):
        """kill -9 of a store consumer holding 40 unacked messages: a new consumer gets
        them first, each with the redelivered flag; every confirmed message is accepted
        exactly once, in order."""
        estate = estates(mode)
        ledger = Ledger()
        with trio.fail_after(90):
            await estate.start()
            doomed = await trio.to_thread.run_sync(
                lambda: ConsumerProcess(estate.uri("s1"), DST, ack=15, prefetch=40))
            try:
                summary, _ = await _kill_and_drain(estate, ledger, doomed)
            finally:
                doomed.kill()
            codes = await estate.stop()
        assert summary["confirmed"] == 300
        assert all(code == 0 for code in codes.values()), codes
