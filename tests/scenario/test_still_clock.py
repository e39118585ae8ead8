"""The in-process engines' virtual clock (scenario/engines/live.py ``still_clock``, issue
#14): at rate 0 it reads the jumped-to time without the real clock -- the same floats
MockClock gives, autojumps and manual jumps alike."""

from __future__ import annotations

import trio
import trio.testing

from treefed.scenario.engines.live import still_clock


def _times(clock: trio.testing.MockClock) -> list[float]:
    seen: list[float] = []

    async def main() -> None:
        seen.append(trio.current_time())
        await trio.sleep(1.5)
        seen.append(trio.current_time())
        clock.jump(0.1)
        seen.append(trio.current_time())
        with trio.move_on_after(2.25):
            await trio.sleep_forever()
        seen.append(trio.current_time())

    trio.run(main, clock=clock)
    return seen


def test_the_same_virtual_times_as_mockclock_without_the_real_clock() -> None:
    clock = still_clock(0.0)
    reads: list = []
    clock._real_clock = lambda: reads.append(1) or 0.0
    want = _times(trio.testing.MockClock(autojump_threshold=0))
    assert _times(clock) == want == [0.0, 1.5, 1.6, 3.85]
    assert reads == []
    assert clock.current_time() == 3.85
