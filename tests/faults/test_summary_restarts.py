"""Issue 18 part 2 on real processes: a summarising region (``summary_budget`` in the
generated ``[tree_connector]``) keeps routing HQ's messages to its stores' own queues
through a region restart and an HQ restart, and when the consumers leave no broker keeps
a cover or any interest for them.

Estate: hq <- r1 <- s1, s2, s3 (the fault harness), each store consuming
``queue://Store.<store>.Incoming``; budget 2, so r1 (3 consumers below) summarises."""

from __future__ import annotations

import pytest
import trio

from treefed.client import connect

from tests.faults.harness import wait_until
from tests.faults.test_interest_restarts import failover, restart

pytestmark = pytest.mark.slow

OPTIONS = {"summary_budget": 2, "summary_owned": ["queue://Store.{broker}.>"]}
COVER = "queue://Store.*.>"
STORES = ("s1", "s2", "s3")


def queue(store: str) -> str:
    return f"queue://Store.{store}.Incoming"


async def consumers_at(estate, name: str) -> set[str]:
    stats = await estate.brokers[name].stat()
    assert stats is not None, f"{name} does not answer"
    return {c["dst"] for c in stats["consumers"]}


async def covered(estate) -> bool:
    """hq holds r1's cover and no per-store demand."""
    at_hq = await consumers_at(estate, "hq")
    return COVER in at_hq and not any(queue(s) in at_hq for s in STORES)


class TestSummaryRestarts:
    async def test_region_and_hq_restarts_keep_routing_then_nothing_stale(self, estates):
        estate = estates("tree", stores=3, tree_options=OPTIONS)
        with trio.fail_after(180):
            await estate.start()
            async with trio.open_nursery() as nursery:
                apps = {}
                subs = {}
                for s in STORES:
                    apps[s] = await nursery.start(_client, failover(estate, s))
                    subs[s] = await apps[s].subscribe(queue(s))
                await wait_until(lambda: covered(estate), 30, "r1's cover at hq",
                                 interval=0.1)
                for step in ("start", "r1", "hq"):
                    if step != "start":
                        await restart(estate, step)
                        await wait_until(lambda: covered(estate), 30,
                                         f"cover back after restarting {step}",
                                         interval=0.1)
                    async with connect(estate.uri("hq")) as producer:
                        for s in STORES:
                            await producer.send(queue(s), f"{step}-{s}".encode(),
                                                persistent=True)
                    for s in STORES:
                        with trio.fail_after(30):
                            msg = await subs[s].receive()
                        await msg.ack()
                        assert msg.body == f"{step}-{s}".encode(), (step, s)
                for s in STORES:
                    await subs[s].close()

                async def nothing_left() -> bool:
                    for name in ("hq", "r1"):
                        held = await consumers_at(estate, name)
                        if COVER in held or any(queue(s) in held for s in STORES):
                            return False
                    return True

                await wait_until(nothing_left, 20, "no cover or store demand left",
                                 interval=0.1)
                nursery.cancel_scope.cancel()
            await estate.stop()


async def _client(uri: str, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    async with connect(uri) as conn:
        task_status.started(conn)
        await trio.sleep_forever()
