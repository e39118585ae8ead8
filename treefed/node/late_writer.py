"""A connection's writer task started only when it is needed (issue #14, in-process estate).

Theory of operation
-------------------
A node serves every connection with a reader (the task that runs ``_run_conn``) and a
writer task that waits on the connection's ``wake`` event and sends ``out``.  On an
in-process frame link (``transport.memory.FrameEnd``) the site task already writes each
batch's frames itself (``BrokerNode._write_now``: ``send_now`` always takes them while
the link is up), so the writer only ever woke for the few frames queued outside a batch
(the link's hello, a ping) and for the end: flush, EOF, linger, cancel.  A memory-engine
estate of 4 x 1,000 sites had ~12,000 such writers to start, and to cancel at the end.

``LateWriter`` stands in for the ``wake`` event of such a connection.  ``set()`` sends
what waits in ``out`` at once, in the caller's task, while the connection is open; once
the connection is closing (or the link refused the frames) it starts the node's ordinary
``_writer`` in the connection's nursery, with a set event in ``wake`` -- from then on
everything is as before: the writer flushes, half-closes, lingers and ends the
connection.  After the connection's nursery is gone, ``set()`` does nothing (the
connection has ended; nobody would write).

``ConnTasks`` stands in for the connection's nursery on such a link: with no writer
task for most of its life, a connection needs no nursery of its own, only a cancel
scope (``c.scope``: a dead peer is cut off).  It is an async context manager around
that scope whose ``start_soon`` starts the rare task (the late writer) in the node's
nursery under a scope of its own, which is cancelled when the connection's block ends
-- as a nursery would cancel its children.

``LateStart`` does the same for a node task that sleeps on an event until something
rare happens (``BrokerNode._watch_space``: the store became full): it stands in for the
event, and its first ``set()`` starts the task (which then uses a real event).
"""

from __future__ import annotations

from typing import Any

import trio

__all__ = ["ConnTasks", "LateStart", "LateWriter"]


class LateWriter:
    """The ``wake`` of an in-process frame-link connection (see the module doc)."""

    __slots__ = ("node", "conn", "nursery")

    def __init__(self, node: Any, conn: Any, nursery: trio.Nursery) -> None:
        self.node = node
        self.conn = conn
        self.nursery: trio.Nursery | None = nursery   # None: the connection ended

    def set(self) -> None:
        c = self.conn
        if not c.closing:
            if not c.out:
                return
            if c.framed.send_now(c.out):
                c.out = []
                c.out_bytes = 0
                return
        nursery = self.nursery
        if nursery is None:
            return
        self.nursery = None
        wake = c.wake = trio.Event()   # the writer's own from now on
        wake.set()
        nursery.start_soon(self.node._writer, c, nursery)

    def is_set(self) -> bool:   # trio.Event's; nothing waits on this one
        return False


class LateStart:
    """An event whose first ``set()`` calls ``start()`` (see the module doc)."""

    __slots__ = ("start",)

    def __init__(self, start: Any) -> None:
        self.start = start

    def set(self) -> None:
        start, self.start = self.start, None
        if start is not None:
            start()

    def is_set(self) -> bool:   # trio.Event's; nothing waits on this one
        return False


class ConnTasks:
    """A connection's cancel scope used as its nursery (see the module doc)."""

    __slots__ = ("host", "cancel_scope", "children")

    def __init__(self, host: trio.Nursery) -> None:
        self.host = host                       # the node's nursery
        self.cancel_scope = trio.CancelScope()
        # the scope of the task started through it; made when one is (most never are)
        self.children: trio.CancelScope | None = None

    @property
    def started(self) -> bool:
        return self.children is not None

    async def __aenter__(self) -> ConnTasks:
        self.cancel_scope.__enter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool:
        if self.children is not None:   # as a nursery's end cancels what still runs in it
            self.children.cancel()
        return self.cancel_scope.__exit__(*exc)

    def start_soon(self, fn: Any, *args: Any) -> None:
        """Start the connection's one extra task (its writer)."""
        if self.children is not None:
            raise RuntimeError("a frame link's connection starts one task at most")
        self.children = trio.CancelScope()
        self.host.start_soon(self._child, self.children, fn, args)

    @staticmethod
    async def _child(scope: trio.CancelScope, fn: Any, args: tuple) -> None:
        with scope:
            await fn(*args)
