"""run_broker: one broker process — lock, store, restore, serve, stop on a signal.

Theory of operation
-------------------
The process owns its data directory through ``persistence.acquire_lock`` (a second
broker on the same directory is refused, not allowed to corrupt the store), opens the
SqliteStore there, puts every stored message back on its queue, and serves until SIGTERM
or SIGINT.  A signal starts the graceful stop (``BrokerNode.shutdown``: no new
connections, ``bye`` to every peer, flush, close); the store is closed last.  A kill -9
skips all of that and loses nothing confirmed: receipts are only sent after commit.
"""

from __future__ import annotations

import signal
import sys

import trio

from treefed.config import BrokerConfig
from treefed.errors import TreefedError
from treefed.log import configure_logging, get_logger
from treefed.node.node import BrokerNode
from treefed.persistence import SqliteStore, acquire_lock

__all__ = ["run_broker", "serve_until_signal"]


async def serve_until_signal(node: BrokerNode,
                             signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT),
                             ) -> int:
    """Serve ``node`` until one of ``signals`` arrives, then stop gracefully.  Returns
    the signal number."""
    with trio.open_signal_receiver(*signals) as received:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.serve)
            async for signum in received:
                node.log.info("broker.signal", signal=signal.Signals(signum).name)
                await node.shutdown()
                return signum
    return 0  # pragma: no cover - the receiver never ends by itself


def _only_treefed_error(exc: BaseException) -> TreefedError | None:
    """The TreefedError behind ``exc`` (a nursery may wrap it in exception groups), or
    None when something else went wrong too — a bug, which should show its traceback."""
    if isinstance(exc, TreefedError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        found = [_only_treefed_error(e) for e in exc.exceptions]
        if found and all(found):
            return found[0]
    return None


def run_broker(config: BrokerConfig) -> int:
    """Run one broker process to completion; returns the process exit status."""
    configure_logging(config.logging.level, file=config.logging.file or None)
    log = get_logger(broker=config.broker.id)
    data_dir = config.broker.data_dir
    try:
        lock = acquire_lock(data_dir)
    except TreefedError as exc:
        log.error("broker.failed", error=exc.message)
        print(f"treefed broker: {exc.message}", file=sys.stderr)
        return 1
    if lock is None:
        message = f"data directory {data_dir} is locked by another broker process"
        log.error("broker.failed", error=message)
        print(f"treefed broker: {message}", file=sys.stderr)
        return 1
    with lock:
        try:
            store = SqliteStore(data_dir)
        except TreefedError as exc:
            log.error("broker.failed", error=exc.message, code=exc.code)
            print(f"treefed broker: {exc.message}", file=sys.stderr)
            return 1
        try:
            node = BrokerNode(config, store=store)
            node.restore()
            trio.run(serve_until_signal, node)
        except (TreefedError, BaseExceptionGroup) as exc:
            error = _only_treefed_error(exc)
            if error is None:
                raise
            log.error("broker.failed", error=error.message, code=error.code)
            print(f"treefed broker: {error.message}", file=sys.stderr)
            return 1
        finally:
            store.close()
    log.info("broker.stopped")
    return 0
