"""Listen ports of one pytest-xdist worker.

`make test` runs the suite in two worker processes (pytest-xdist).  A broker started in
another process gets a port that the test picked earlier with
``treefed.transport.ports.free_port``: checked free, and never handed out twice *by one
process*.  Two workers are two processes: between one worker's pick and its broker's bind,
the other worker could pick the same port (both saw it free), and one broker would fail
with "Address already in use".  So each worker takes only its own share of the ports: the
ones equal to its index modulo the number of workers, the others counted as handed out.

Called by tests/conftest.py in each worker, and by the scripts a test runs as a child
process that pick ports themselves (they inherit the worker's environment).  Outside
pytest-xdist (a plain ``pytest`` run) it does nothing.
"""

from __future__ import annotations

import os

from treefed.transport import ports


def keep_ports_to_this_worker() -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        index = int(worker.removeprefix("gw"))
    except ValueError:
        return
    if count < 2 or not 0 <= index < count:
        return
    with ports._lock:
        ports._given.update(p for p in range(65536) if p % count != index)
