"""The group fsync of received forwards (node/acksync.py, ``FORWARD_SYNC_S``) is shared by
the forwards of a one-at-a-time persistent sender (issue #14, session 10): its messages
reach a relaying broker one every 1-2 ms, and with a 2 ms window each one had an fsync
(and a worker-thread hand-off, and a wake-up) of its own on every hop.  Run on trio's
virtual clock with the fsync in this thread: the count is exact, whatever the load."""

from __future__ import annotations

import trio
import trio.testing

from treefed.node import acksync
from treefed.node.acksync import FORWARD_SYNC_S, AckSyncer


class _Store:
    """What the syncer uses of a store: frames written since the last sync, and sync."""

    def __init__(self) -> None:
        self.pending = False
        self.syncs = 0

    def sync_pending(self) -> bool:
        return self.pending

    def sync(self) -> None:
        self.pending = False
        self.syncs += 1


async def _inline(fn, *args):   # the fsync on this thread: virtual time stays exact
    return fn(*args)


def test_a_one_at_a_time_senders_forwards_share_each_fsync(monkeypatch):
    monkeypatch.setattr(acksync, "in_thread", _inline)
    store = _Store()
    released: list[float] = []
    forwards, gap = 40, 0.0025   # a forward every 2.5 ms: a one-at-a-time sender's pace

    async def main() -> None:
        syncer = AckSyncer(store, log=None, interval=30,
                           on_synced=lambda: released.append(trio.current_time()))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(syncer.run)
            for _ in range(forwards):   # committed without an fsync, its ForwardAck held
                store.pending = True
                syncer.poke(urgent=True)
                await trio.sleep(gap)
            await trio.sleep(2 * FORWARD_SYNC_S)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert not store.pending                     # every forward was synced in the end
    assert store.syncs <= forwards // 3, store.syncs   # >= 3 forwards per fsync
    # and no forward's ack waited much past the window: at most the window and one gap,
    # which it may reach exactly -- virtual times are float sums (0.0125000000000004 once
    # failed a fresh-clone CI run), hence the nanosecond of slack
    longest = max(b - a for a, b in zip([0.0, *released], released))
    assert longest <= FORWARD_SYNC_S + gap + 1e-9, longest
