"""Every test starts from the same process-wide logging set-up.

structlog's configuration is process state: a live engine quiets it to ``warning`` when
nothing configured it (scenario/engines/live.py), a reload changes the level
(node.set_logging), the CLI configures it.  A test that does any of these must not change
what later tests see (a log-capturing test after a scenario run captured nothing at
``info``), so each test's changes are undone when it ends.

`make test` runs the suite in two pytest-xdist workers: the hooks below keep each worker's
broker ports apart and the Spark tests in one worker.
"""

from __future__ import annotations

import warnings

import pytest
import structlog


@pytest.fixture(autouse=True)
def _restore_structlog():
    configured = structlog.is_configured()
    saved = structlog.get_config()
    yield
    if configured:
        structlog.configure(**saved)
    else:
        structlog.reset_defaults()


def pytest_configure(config):
    """Under pytest-xdist, this worker's brokers listen on its own share of the ports
    (tests/worker_ports.py)."""
    from tests.worker_ports import keep_ports_to_this_worker

    keep_ports_to_this_worker()


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist every Spark test runs in one worker, in the suite's order: one
    SparkSession (5-9 s to start, and its JIT warm-up) instead of one per worker, and
    tests/model/test_spark_messages.py's routings, queued from the module's first test for
    all its selected tests, are checked in the worker that computed them.  (The machine's
    two cores are busy all along either way: a second group for test_cluster.py's own
    JVMs made no difference, 748 s against 740 s.)"""
    if config.pluginmanager.hasplugin("xdist"):
        for item in items:
            if item.get_closest_marker("spark") is not None:
                item.add_marker(pytest.mark.xdist_group("spark"))
    result = yield       # in a worker, xdist's own hook names each item's group here
    if getattr(config.option, "loadgroup", False):
        for item in items:
            groups = {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                      for m in item.iter_markers("xdist_group")}
            if groups:
                _name_the_group(item, "_".join(sorted(groups)))
    return result


def _name_the_group(item, group: str) -> None:
    """``--dist loadgroup`` sends the items whose node id ends in ``@group`` to one worker.
    xdist's worker hook appends it by setting ``item._nodeid``, which pytest 9.2's
    structured node ids no longer read (pytest-xdist issue #1386: the tests are then
    spread over the workers as if unmarked): appended here too, through the node id
    pytest 9.2 reads, when xdist's did not take."""
    suffix = f"@{group}"
    if item.nodeid.endswith(suffix):
        return
    nodeid = item.nodeid + suffix
    if hasattr(item, "_id"):             # pytest >= 9.2
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(nodeid)
    else:
        item._nodeid = nodeid
    if not item.nodeid.endswith(suffix):
        warnings.warn(f"{item.nodeid}: cannot put it in the xdist group {group!r}; "
                      "the Spark tests may run in both workers")
