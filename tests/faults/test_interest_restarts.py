"""Issue 18 part 5: interest stays correct across broker restarts (real processes, both
connector modes) -- the cases where NATS leaf nodes were seen to fail.

The chain is the fault harness's estate: hq <- r1 <- s1 (tree: root, branch, leaf; mesh:
duplex links, network_ttl 2)."""

from __future__ import annotations

import pytest
import trio

from treefed.client import connect

from tests.faults.harness import wait_until

#: real broker processes, restarted several times: the module counts as slow
pytestmark = pytest.mark.slow

FAILOVER = "?randomize=false&initialReconnectDelay=50&maxReconnectDelay=500"


def failover(estate, name: str) -> str:
    return f"failover:(tcp://127.0.0.1:{estate.sites[name].port}){FAILOVER}"


async def restart(estate, name: str) -> None:
    """kill -9 and start again on the same port and data directory; wait until linked."""
    proc = estate.brokers[name]
    await trio.to_thread.run_sync(proc.kill)
    proc.start()
    await proc.wait_serving()
    await estate.wait_linked()


async def holders(estate, dst: str) -> list[str]:
    """Brokers holding any consumer (local or network demand) for ``dst``."""
    out = []
    for name, proc in estate.brokers.items():
        stats = await proc.stat()
        assert stats is not None, f"{name} does not answer"
        if any(c["dst"] == dst for c in stats["consumers"]):
            out.append(name)
    return sorted(out)


async def settled(estate, marker: str) -> None:
    """Proof that s1's interest updates reach HQ again: a marker consumer's demand
    appears at hq (then the marker leaves again)."""
    async with connect(estate.uri("s1")) as conn:
        await conn.subscribe(marker)
        await estate.wait_demand("hq", marker)
    await wait_until(lambda: _gone(estate, marker), 20, f"{marker} gone", interval=0.05)


async def _gone(estate, dst: str) -> bool:
    return await holders(estate, dst) == []


class TestChainRestarts:
    async def test_messages_from_the_leaf_reach_the_root_after_each_restart(self, estates,
                                                                           mode):
        """Subscriber at hq, publisher at s1: restart s1, then r1, then hq; after each,
        a message published at s1 reaches the subscriber (it failed over to hq again)."""
        estate = estates(mode)
        dst = "queue://hq.chain"
        with trio.fail_after(150):
            await estate.start()
            async with connect(failover(estate, "hq")) as app:
                sub = await app.subscribe(dst)
                for step in ("start", "s1", "r1", "hq"):
                    if step != "start":
                        await restart(estate, step)
                    if mode == "mesh":   # the mesh forwards on demand only
                        await estate.wait_demand("s1", dst, timeout=30)
                    async with connect(estate.uri("s1")) as producer:
                        await producer.send(dst, step.encode(), persistent=True)
                    with trio.fail_after(30):
                        msg = await sub.receive()
                    await msg.ack()
                    assert msg.body == step.encode(), f"after restarting {step}"
            await estate.stop()


class TestNoStaleInterest:
    async def test_consumer_leaves_after_its_region_restarted(self, estates, mode):
        """A consumer at s1 stays while r1 restarts, then leaves: afterwards no broker
        holds interest for it (hq neither)."""
        estate = estates(mode)
        dst = "queue://s1.stays"
        with trio.fail_after(120):
            await estate.start()
            async with connect(estate.uri("s1")) as app:
                await app.subscribe(dst)
                await estate.wait_demand("hq", dst)
                await restart(estate, "r1")
                await estate.wait_demand("hq", dst)      # re-learned through the restart
                assert await holders(estate, dst) == ["hq", "r1", "s1"]
            await wait_until(lambda: _gone(estate, dst), 20, f"{dst} forgotten everywhere",
                             interval=0.05)
            await estate.stop()

    async def test_consumer_leaves_during_its_regions_outage(self, estates, mode):
        """The consumer leaves while r1 is down: once r1 is back, no broker holds
        interest for it, and interest updates flow again."""
        estate = estates(mode)
        dst = "queue://s1.leaves"
        with trio.fail_after(120):
            await estate.start()
            region = estate.brokers["r1"]
            async with connect(estate.uri("s1")) as app:
                await app.subscribe(dst)
                await estate.wait_demand("hq", dst)
                await trio.to_thread.run_sync(region.kill)
            region.start()
            await region.wait_serving()
            await estate.wait_linked()
            await settled(estate, "queue://s1.marker")
            assert await holders(estate, dst) == []
            await estate.stop()


class TestDeltaResync:
    async def test_store_link_flap_resends_only_the_difference(self, estates):
        """Tree, resync_grace 30: s1's uplink is cut (proxy) while one of its 20
        consumers leaves; after the link returns r1 receives exactly one advisory (that
        removal) instead of 19 adds, holds demand for the 19, none for the one that left,
        and messages from HQ reach a kept consumer."""
        estate = estates("tree", proxied=("s1",), tree_options={"resync_grace": 30.0})
        n = 20
        with trio.fail_after(120):
            await estate.start()
            r1 = estate.brokers["r1"]

            async def r1_demand() -> set[str]:
                stats = await r1.stat()
                return {c["dst"] for c in stats["consumers"]} if stats else set()

            async with connect(failover(estate, "s1")) as app:
                subs = [await app.subscribe(f"queue://s1.q{i}") for i in range(n)]
                await wait_until(lambda: _has(r1_demand, n), 20, "demand at r1")
                before = (await r1.stat())["advisories"]["advisories_received"]
                proxy = estate.proxies["s1"]
                await trio.to_thread.run_sync(proxy.cut)
                await wait_until(lambda: _has(r1_demand, 0), 20, "r1 forgot s1's demand")
                await subs[0].close()                 # leaves during the outage
                await trio.to_thread.run_sync(proxy.restore)
                await estate.wait_linked()
                await wait_until(lambda: _has(r1_demand, n - 1), 20, "demand back at r1")
                assert "queue://s1.q0" not in await r1_demand()
                after = (await r1.stat())["advisories"]["advisories_received"]
                assert after - before == 1
                async with connect(estate.uri("hq")) as hq:
                    await hq.send("queue://s1.q5", b"after-resync", persistent=True)
                with trio.fail_after(20):
                    msg = await subs[5].receive()
                assert msg.body == b"after-resync"
                await msg.ack()
            await estate.stop()


async def _has(demand, n: int) -> bool:
    return sum(1 for d in await demand() if d.startswith("queue://s1.q")) == n
