"""The canary: persistent traffic through store -> region -> HQ (real broker processes)
that an attack test keeps running, to show other traffic flows while a hostile client
does its worst (issue #12).

Theory of operation
-------------------
``open_canary(tmp_path)`` starts the fault suite's tree estate (``tests.faults.harness``:
HQ the root, region ``r1`` a branch, store ``s1`` a leaf, each a ``treefed broker``
process with an SQLite store on loopback) and two paced persistent flows over it:
``s1 -> hq`` on ``queue://canary.up`` and ``hq -> s1`` on ``queue://canary.down``.  Each
message is confirmed (stored) before the next is sent and acked by its consumer; the
fault suite's ``Ledger`` records every send, receipt and delivery.

An attack test marks the start and end of its attack (``attack_started`` /
``attack_ended``) and finally calls ``finish()``, which stops the producers, waits until
every confirmed message was delivered and asserts:

* every broker process is still alive (no attack may end one);
* ``Ledger.check()``: every confirmed message delivered exactly once, in order;
* traffic flowed *during* the attack: messages of both flows were confirmed and
  delivered between its start and its end (at least ``min_during`` each);
* returns the figures (counts, latency p50/p99 in ms) for the test and the report.
"""

from __future__ import annotations

import math
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator

import trio

from tests.faults.harness import Estate, Ledger, Traffic, wait_until

__all__ = ["Canary", "open_canary", "UP", "DOWN"]

UP = "queue://canary.up"        # store s1 -> HQ
DOWN = "queue://canary.down"    # HQ -> store s1


class Canary:
    """Two persistent flows over a running estate and their verdict."""

    def __init__(self, estate: Estate, *, rate: float = 20.0) -> None:
        self.estate = estate
        self.ledger = Ledger()
        self.traffic = Traffic(estate, self.ledger, [("s1", "hq", UP), ("hq", "s1", DOWN)],
                               rate=rate)
        self.started_at = math.nan
        self.ended_at = math.nan

    async def start(self, nursery: trio.Nursery) -> None:
        await self.traffic.start(nursery)
        # the canary is only a witness once it demonstrably flows
        await wait_until(lambda: self._delivered_between(0.0, math.inf, UP) >= 3
                         and self._delivered_between(0.0, math.inf, DOWN) >= 3,
                         30.0, "the canary to flow", interval=0.02)

    def attack_started(self) -> None:
        self.started_at = trio.current_time()

    def attack_ended(self) -> None:
        self.ended_at = trio.current_time()

    def _delivered_between(self, start: float, end: float, dst: str) -> int:
        return sum(1 for d in self.ledger.deliveries
                   if d.dst == dst and start <= d.at < end)

    def alive(self) -> dict[str, bool]:
        return {name: proc.alive for name, proc in self.estate.brokers.items()}

    def latencies_ms(self) -> list[float]:
        sent = self.ledger.sent
        return sorted((d.at - sent[d.msg][1]) * 1000 for d in self.ledger.deliveries
                      if d.msg in sent)

    async def finish(self, *, min_during: int = 1, timeout: float = 30.0) -> dict:
        """Stop the producers, drain, and assert the canary's verdict (module doc)."""
        dead = [name for name, ok in self.alive().items() if not ok]
        assert not dead, f"broker process(es) died: {dead}\n{self.estate.logs()}"
        await self.traffic.stop_producers(timeout)
        await self.traffic.drained(timeout)
        self.traffic.stop_consumers()
        figures = self.ledger.check()
        if not math.isnan(self.started_at):
            end = self.ended_at if not math.isnan(self.ended_at) else trio.current_time()
            # a message sent before the attack ended counts if it arrived within a second
            for dst in (UP, DOWN):
                during = self._delivered_between(self.started_at, end + 1.0, dst)
                assert during >= min_during, (
                    f"canary {dst}: {during} deliveries during the attack "
                    f"({end - self.started_at:.2f} s)\n{self.estate.logs()}")
                figures[f"during:{dst}"] = during
        lat = self.latencies_ms()
        if lat:
            figures["p50_ms"] = round(lat[len(lat) // 2], 1)
            figures["p99_ms"] = round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 1)
        dead = [name for name, ok in self.alive().items() if not ok]
        assert not dead, f"broker process(es) died: {dead}\n{self.estate.logs()}"
        return figures


@asynccontextmanager
async def open_canary(tmp_path: Path, *, rate: float = 20.0,
                      broker: dict[str, dict] | None = None,
                      ) -> AsyncIterator[tuple[Estate, Canary]]:
    """A running tree estate (HQ, r1, s1; real processes) with the canary flowing.
    The estate is killed on the way out, whatever happened; on failure the brokers' last
    log lines are printed."""
    estate = Estate(tmp_path, "tree", broker=broker)
    try:
        async with trio.open_nursery() as nursery:
            await estate.start()
            canary = Canary(estate, rate=rate)
            await canary.start(nursery)
            try:
                yield estate, canary
            finally:
                canary.traffic.stop_consumers()
                for p in canary.traffic.producers:
                    p.stop.set()
                nursery.cancel_scope.cancel()
    except BaseException:
        print(estate.logs(40))
        raise
    finally:
        estate.cleanup()
