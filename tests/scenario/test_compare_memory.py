"""make run's memory: compare hands the report a small Spark driver heap, and runs each
scenario in a child process that exits (the runner's heap is gone before Java starts)."""

from __future__ import annotations

import os
from pathlib import Path

from treefed.scenario import compare


def test_report_gets_the_small_driver_heap(tmp_path: Path, monkeypatch) -> None:
    from treefed.analysis import integrity, job

    seen: list[list[str]] = []
    monkeypatch.setattr(integrity, "java_problem", lambda: None)
    monkeypatch.setattr(job, "main", lambda argv: seen.append(argv) or 0)
    assert compare.main(["retail-small", "--out", str(tmp_path / "runs"),
                         "--report", str(tmp_path / "rep")]) == 0
    (argv,) = seen
    assert argv[argv.index("--driver-memory") + 1] == compare.DRIVER_MEMORY == "768m"
    modes = compare.with_compared_modes(
        compare.load_scenario(compare.find_scenario("retail-small"))).modes
    assert len([a for a in argv if a.startswith(str(tmp_path / "runs"))]) == len(modes)


def _pid(scenario, out):       # runs in the child
    return os.getpid()


def test_scenarios_run_in_a_child_process(tmp_path: Path, monkeypatch) -> None:
    """_run_apart's worker is another process; the results come back without the
    per-message deliveries."""
    monkeypatch.setattr(compare, "_run_in_child", _pid)
    scenario = compare.load_scenario(compare.find_scenario("retail-small"))
    assert compare._run_apart(scenario, str(tmp_path)) != os.getpid()
    monkeypatch.undo()
    results = compare._run_apart(scenario, str(tmp_path))
    assert [r.summary["mode"] for r in results] == ["tree", "mesh-ttl1", "mesh-ttl2"]
    assert all(r.deliveries == {} and r.path.is_dir() for r in results)
