"""The runner keeps the cyclic collector off until the engine is dropped (issue #14):
an automatic full collection while the event log closes walked the whole live estate
(4,005 in-process brokers at 4 x 1,000) for nothing, inside the run's wall time."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from treefed.log import EventWriter
from treefed.scenario import runner as runner_mod
from treefed.scenario.runner import run_scenario

SMALL = Path(__file__).resolve().parents[2] / "scenarios" / "retail-small.toml"


class _Watched(EventWriter):
    seen: list = []

    def close(self) -> None:
        _Watched.seen.append(gc.isenabled())
        super().close()


def test_collector_off_while_the_log_closes_and_on_again_after(tmp_path, monkeypatch):
    monkeypatch.setattr(runner_mod, "EventWriter", _Watched)
    _Watched.seen = []
    assert gc.isenabled()
    (r,) = run_scenario(SMALL, out=tmp_path, modes=["tree"], parquet=False)
    assert r.summary["delivered"] == r.summary["expected"]
    assert _Watched.seen[:1] == [False]
    assert gc.isenabled()


def test_collector_on_again_when_the_engine_fails(tmp_path, monkeypatch):
    class Boom(Exception):
        pass

    def fail(self):
        raise Boom("engine failed")

    from treefed.scenario.engines.replay import ReplayEngine

    monkeypatch.setattr(ReplayEngine, "run", fail)
    with pytest.raises(Boom):
        run_scenario(SMALL, out=tmp_path, modes=["tree"], parquet=False)
    assert gc.isenabled()
