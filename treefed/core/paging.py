"""Paged-out message bodies (issue #12, defect 8): persistent bodies not all held in RAM.

A persistent queue message is in the store from the moment its batch committed, so while
it waits in ``pending`` its body need not also be in memory.  When the bytes a broker
holds pass a quarter of ``max_memory_bytes``, ``Broker.page_out`` swaps the bodies of waiting
persistent messages for a ``Paged`` marker; the shell reads the body back from the store
(``store.load_bodies``) before a Deliver / Forward frame carrying the marker leaves, and
before a StoreMessage carrying one (a dead-lettered copy) is written.

``Paged`` has the body's length (``len``), so every size computed from a message --
destination byte limits, the memory accounting -- is unchanged by paging, and ``key``:
the (id, destination) row whose body it stands for.  Pure: no I/O here.
"""

from __future__ import annotations

__all__ = ["Paged", "paged_key"]


class Paged:
    """Stands for a body that lives only in the store: ``len`` is its length."""

    __slots__ = ("n", "key")

    def __init__(self, n: int, key: tuple[str, str]) -> None:
        self.n = n
        self.key = key              # (message id, destination) of the stored row

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"Paged({self.n} bytes of {self.key[0]!r} in {self.key[1]})"


def paged_key(body: object) -> tuple[str, str] | None:
    """The stored row to read ``body`` from, or None when it is in memory."""
    return body.key if type(body) is Paged else None
