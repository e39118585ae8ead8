"""``Broker._new_dest`` (issue #14: every store's queue of an in-process estate is made on
its first message): a destination found by one consumer takes it without a sort; found
by several, they are ordered by priority (highest first), then creation."""

from __future__ import annotations

import builtins

from treefed.core.broker import Broker
from treefed.core.policy import PolicySet
from treefed.wire.frames import Send


def _consumers(b: Broker, dst: str) -> list[str]:
    b.handle_frame("p", Send(dst, f"m-{dst}"), 0.0)
    return [c.sub_id for c in b._dests[dst].consumers]


def test_one_consumer_is_taken_without_a_sort(monkeypatch) -> None:
    b = Broker("B", PolicySet([]), log_messages=False)
    b.add_consumer("c", "s1", "queue://Store.>", 0.0)
    sorts: list = []
    real = builtins.sorted

    def counted(*args, **kwargs):
        sorts.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(builtins, "sorted", counted)
    assert _consumers(b, "queue://Store.s1.Incoming") == ["s1"]
    assert sorts == []


def test_several_consumers_by_priority_then_creation() -> None:
    b = Broker("B", PolicySet([]), log_messages=False)
    b.add_consumer("c", "low", "queue://Store.>", 0.0, priority=-2)
    b.add_consumer("c", "first", "queue://Store.*.Incoming", 0.0)
    b.add_consumer("c", "high", "queue://>", 0.0, priority=3)
    b.add_consumer("c", "second", "queue://Store.s1.Incoming", 0.0)
    assert _consumers(b, "queue://Store.s1.Incoming") == ["high", "first", "second", "low"]
