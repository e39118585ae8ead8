"""Fixtures of the fault suite: an estate factory that always cleans up (and shows the
brokers' last log lines when a test fails), and the connector mode parameter."""

from __future__ import annotations

import pytest

from tests.faults.harness import MODES, Estate


@pytest.fixture(params=MODES)
def mode(request) -> str:
    """Every fault test runs under the tree connector and under the mesh connector."""
    return request.param


@pytest.fixture
def estates(tmp_path, request):
    """``estates(mode, **options)`` builds an Estate; all are killed at teardown."""
    made: list[Estate] = []

    def make(mode: str, **options) -> Estate:
        estate = Estate(tmp_path, mode, **options)
        made.append(estate)
        return estate

    yield make
    failed = getattr(request.node, "rep_call", None)
    for estate in made:
        if failed is not None and failed.failed:
            print(f"--- {estate.mode} estate logs ---\n{estate.logs()}")
        estate.cleanup()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
