"""Issue #14: the duplicate windows remember only ids that can come again, compactly.

* A non-persistent message a local producer sent is never re-sent (the client re-sends
  only unconfirmed persistent sends), so its id need not join the consumed window; a
  persistent one or one that came over a link (a peer re-forwards it if our ForwardAck
  was lost) must.
* ``IdWindow`` (core/idwindow.py) answers exactly as the set + deque it replaces, for
  ``<producer>:<seq>`` ids and anything else, and holds 100,000 sequenced ids in a few
  hundred KiB instead of ~16 MiB of small objects.
"""

from __future__ import annotations

import random
import tracemalloc
from collections import deque

from treefed.core.broker import Broker
from treefed.core.duplicates import Duplicates
from treefed.core.idwindow import IdWindow
from treefed.wire.frames import Ack, Forward, Send, Subscribe


def _consume(b: Broker, persistent: bool, n: int, prefix: str = "p-1") -> None:
    b.handle_frame("c", Subscribe("s", "queue://Q", prefetch=n + 1), 0.0)
    for i in range(n):
        b.handle_frame("p", Send("queue://Q", f"{prefix}:{i}", persistent=persistent), 0.0)
    for i in range(n):
        b.handle_frame("c", Ack("s", f"{prefix}:{i}"), 0.0)


class TestWhatIsRemembered:
    def test_local_non_persistent_ids_are_not_remembered(self):
        b = Broker("B")
        _consume(b, False, 50)
        assert len(b._dups.consumed) == 0
        assert not b._dups.known("p-1:3")

    def test_persistent_ids_are_remembered_and_a_resend_is_a_duplicate(self):
        b = Broker("B")
        _consume(b, True, 50)
        assert len(b._dups.consumed) == 50
        b.handle_frame("p", Send("queue://Q", "p-1:7", persistent=True), 0.0)
        assert b.statistics()["dropped"] == {"duplicate": 1}

    def test_forwarded_non_persistent_ids_are_remembered(self):
        """A re-forward after a lost ForwardAck (tree link: only held or consumed tells)
        is dropped, not delivered twice."""
        b = Broker("B")
        b.connect("L:X", 0.0)
        b.handle_frame("c", Subscribe("s", "queue://Q", prefetch=10), 0.0)
        b.accept_forward("L:X", Forward("queue://Q", "x-1:1", ["X"]), 0.0)
        b.handle_frame("c", Ack("s", "x-1:1"), 0.0)
        assert "x-1:1" in b._dups.consumed
        b.accept_forward("L:X", Forward("queue://Q", "x-1:1", ["X"]), 0.0)
        assert b.statistics()["dropped"] == {"duplicate": 1}


class _Reference:
    """The set + deque the windows were before IdWindow."""

    def __init__(self, window: int) -> None:
        self.window, self.ids, self.order = window, set(), deque()

    def add(self, k: str) -> None:
        if self.window <= 0 or k in self.ids:
            return
        self.ids.add(k)
        self.order.append(k)
        if len(self.order) > self.window:
            self.ids.discard(self.order.popleft())

    def discard(self, k: str) -> None:
        self.ids.discard(k)


class TestIdWindow:
    def test_same_answers_as_a_set_and_deque(self):
        rng = random.Random(14)
        for window in (0, 1, 7, 300):
            w, ref = IdWindow(window), _Reference(window)
            seqs = {p: 0 for p in ("p-a", "p-b", "c:d-e")}
            universe: list[str] = []
            for _ in range(6000):
                r = rng.random()
                if r < 0.55:       # mostly in order, sometimes far ahead or behind
                    p = rng.choice(list(seqs))
                    seqs[p] += rng.choice((1, 1, 1, 2, 5))
                    s = seqs[p] + rng.choice((0, 0, 0, -40, 9000, -9000))
                    k = f"{p}:{max(s, 0)}"
                elif r < 0.7:
                    k = rng.choice(("stomp-1", "t:1#2", "p-a:007", "p-a:-3", "p-a:",
                                    "p-a:1²", f"x:{rng.randrange(10**19, 10**20)}"))
                elif r < 0.85 and universe:
                    k = rng.choice(universe)
                else:
                    k = f"q-{rng.randrange(4)}:{rng.randrange(200000)}"
                if rng.random() < 0.1 and universe:
                    k = rng.choice(universe)
                    w.discard(k)
                    ref.discard(k)
                else:
                    w.add(k)
                    ref.add(k)
                universe.append(k)
                probe = rng.choice(universe)
                assert (probe in w) == (probe in ref.ids), (window, probe)
                assert len(w) == len(ref.ids)
            assert set(w) == ref.ids
            assert sorted(list(w)) == sorted(ref.ids)

    def test_slots_are_reused_only_when_no_entry_names_them(self):
        w = IdWindow(2)
        w.add("a:1")
        w.discard("a:1")      # a's bitmap empties, its entry is still in the order
        w.add("b:1")          # must not take a's slot while a's entry names it
        w.add("b:2")          # evicts a's entry
        assert "b:1" in w and "b:2" in w and len(w) == 2
        w.add("b:3")          # evicts b:1
        assert "b:1" not in w and "b:3" in w

    def test_100000_sequenced_ids_are_compact(self):
        """Before: ~16 MiB of str + set + deque for the consumed window."""
        ids = [f"bench-p-0123456789ab:{i}" for i in range(100_000)]
        tracemalloc.start()
        try:
            dups = Duplicates(100_000)
            base = tracemalloc.get_traced_memory()[0]
            for k in ids:
                dups.consume(k)
            held = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        assert held < 3 * 1024 * 1024, held
        assert dups.known(ids[0]) and dups.known(ids[-1])
        dups.consume("bench-p-0123456789ab:100000")
        assert not dups.known(ids[0]) and dups.known(ids[1])


class TestScopedIds:
    def test_a_brokers_scoped_ids_take_the_compact_form(self):
        """The broker holds client ids qualified with a scope (wire/ids.py)."""
        from treefed.wire.ids import qualify
        w = IdWindow(10)
        ids = [qualify(f"p-1:{i}", "AbC-_x") for i in range(1, 6)] + ["a\0b:1", "x:1\x1f"]
        for k in ids:
            w.add(k)
        assert not w._other - {"a\0b:1"}, w._other
        assert all(k in w for k in ids)
        assert "p-1:1" not in w and qualify("p-1:1", "other") not in w
        assert list(w) == ids


def test_held_table_is_let_go_once_empty():
    dups = Duplicates(0)
    for i in range(5000):
        dups.hold(f"m{i}")
    for i in range(5000):
        dups.release(f"m{i}")
    assert dups.held == {} and not dups.known("m1")
    import sys
    assert sys.getsizeof(dups.held) < 1024
