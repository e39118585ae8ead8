"""run_broker: one broker process — lock, store, restore, serve, stop on a signal.

Theory of operation
-------------------
The process owns its data directory through ``persistence.acquire_lock``, opens the
SqliteStore there (capped at ``max_store_bytes``), puts every stored message back on its
queue, and serves until SIGTERM or SIGINT.  Once it serves, the start-up's objects are
frozen out of the cyclic collector's reach and its passes are counted (``gcwatch``,
issue #14).

Master/slave on a shared directory: when the lock is held by a broker with *our* id, this
process is its slave — it logs ``broker.slave``, opens no listener and no link, and polls
the lock every ``SLAVE_POLL`` seconds; the kernel frees the lock the moment the master
dies (even by kill -9), and the slave then logs ``broker.master`` and starts exactly as a
master does, from the same store.  A lock held by a *different* broker id is a
misconfiguration: refused (status 1), never allowed to corrupt the store.  A signal while
waiting ends the slave (status 0).  A signal starts the graceful stop (``BrokerNode.shutdown``: no new
connections, ``bye`` to every peer, flush, close); the store is closed last.  A kill -9
skips all of that and loses nothing confirmed: receipts are only sent after commit.
"""

from __future__ import annotations

import signal
import sys
import time
from typing import Any

import trio

from treefed.config import BrokerConfig
from treefed.errors import TreefedError
from treefed.log import configure_logging, get_logger, reopen_log_file
from treefed.node import gcwatch
from treefed.node.node import BrokerNode
from treefed.node.trim import trim_when_idle
from treefed.persistence import SqliteStore, acquire_lock, read_lock

__all__ = ["run_broker", "serve_until_signal", "wait_for_lock", "SLAVE_POLL"]

#: Seconds between a slave's attempts at the lock: bounds the take-over time.
SLAVE_POLL = 0.1


async def serve_until_signal(node: BrokerNode,
                             signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT),
                             ) -> int:
    """Serve ``node`` until one of ``signals`` arrives, then stop gracefully.  Returns
    the signal number.  SIGHUP reopens the log file (logrotate) and re-reads the config
    file (``BrokerNode.reload``); a config that cannot be applied changes nothing."""
    with trio.open_signal_receiver(*signals, signal.SIGHUP) as received:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.serve)
            gcwatch.freeze_start_up()   # no GC pass walks the start-up again (gcwatch.py)
            gcwatch.watch()             # GC passes and pauses while serving, in ``stat``
            nursery.start_soon(trim_when_idle, node)   # idle RSS (issue #14)
            async for signum in received:
                node.log.info("broker.signal", signal=signal.Signals(signum).name)
                if signum == signal.SIGHUP and signum not in signals:
                    await _reload(node)
                    continue
                await node.shutdown()
                nursery.cancel_scope.cancel()   # the idle trimmer
                return signum
    return 0  # pragma: no cover - the receiver never ends by itself


async def _reload(node: BrokerNode) -> None:
    reopen_log_file()
    try:
        await node.reload()
    except TreefedError as exc:
        node.log.error("broker.reload_refused", error=exc.message)


async def wait_for_lock(data_dir: str, owner: str, *, poll: float = SLAVE_POLL,
                        signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> Any:
    """As a slave: poll the lock until it is ours (returns the LockHandle) or a signal
    arrives (returns None)."""
    with trio.open_signal_receiver(*signals) as received:
        async with trio.open_nursery() as nursery:
            got: list = []

            async def poll_lock() -> None:
                while True:
                    lock = acquire_lock(data_dir, owner=owner)
                    if lock is not None:
                        got.append(lock)
                        nursery.cancel_scope.cancel()
                        return
                    await trio.sleep(poll)

            nursery.start_soon(poll_lock)
            async for _ in received:
                nursery.cancel_scope.cancel()
                break
    return got[0] if got else None


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


def run_broker(config: BrokerConfig, *, init: bool = False) -> int:
    """Run one broker process to completion; returns the process exit status.
    ``init``: accept a 0-byte or missing message store as a new, empty one
    (``treefed broker --init``; see persistence/sqlite.py, "Start-up and identity")."""
    configure_logging(config.logging.level, file=config.logging.file or None)
    log = get_logger(broker=config.broker.id)
    data_dir = config.broker.data_dir
    me = config.broker.id
    try:
        lock = acquire_lock(data_dir, owner=me)
        if lock is None:
            pid, owner = read_lock(data_dir)
            if owner != me:
                message = (f"data directory {data_dir} is locked by another broker process"
                           f" ({owner or 'unknown'}, pid {pid}); only a slave of the same "
                           "broker id may share it")
                log.error("broker.failed", error=message)
                print(f"treefed broker: {message}", file=sys.stderr)
                return 1
            log.info("broker.slave", data_dir=data_dir, master_pid=pid)
            began = time.monotonic()
            lock = trio.run(wait_for_lock, data_dir, me)
            if lock is None:
                log.info("broker.stopped", role="slave")
                return 0
            log.info("broker.master", data_dir=data_dir,
                     waited=round(time.monotonic() - began, 3))
    except TreefedError as exc:
        log.error("broker.failed", error=exc.message)
        print(f"treefed broker: {exc.message}", file=sys.stderr)
        return 1
    with lock:
        try:
            store = SqliteStore(data_dir, max_bytes=config.broker.max_store_bytes,
                                broker_id=me, init=init, ack_sync=config.store.ack_sync)
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
