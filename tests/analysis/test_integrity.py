"""What `treefed report` and `treefed compare` refuse: incomplete runs and a missing Java.

Run directories are written by the real runner (retail-small, replay engine) and then
damaged the way a user damages them: Ctrl-C before summary.json, a log of garbage, a gzip
cut short.  Each is refused with exit 2, the run and the problem named, and no output
folder left; --allow-partial includes it, flagged.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import shutil
import stat
from pathlib import Path

import pytest

from treefed.analysis import integrity

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "retail-small.toml"


# ----------------------------------------------------------------------------- pure

def whole(**over) -> dict:
    row = dict(lines=100, bad_lines=0, summary_lines=100, finished=1, expected=40,
               delivered=30, stranded=5, stranded_log=5, dropped=5, lost=0)
    row.update(over)
    return row


class TestRunProblems:
    def test_a_whole_run_has_none(self):
        assert integrity.run_problems(whole()) == []

    @pytest.mark.parametrize("over, said", [
        (dict(lines=60), "log truncated: 60 of the 100 lines"),
        (dict(lines=120), "log has 120 lines, summary.json counts 100"),
        (dict(finished=0), "no run.finished"),
        (dict(bad_lines=1, lines=100, summary_lines=100), "1 of 100 log lines (1.0%)"),
        (dict(summary_lines=None, expected=None), "no complete summary.json"),
        (dict(dropped=4), "accounting does not close: expected 40 != delivered 30 + "
                          "stranded 5 + dropped 4 + lost 0"),
        (dict(dropped=0, lost=5), "5 message copies lost"),
        (dict(stranded_log=4), "log has 4 message.stranded lines, summary.json counts 5"),
        (dict(lines=0, summary_lines=0), "log is empty"),
    ])
    def test_each_problem_is_named(self, over, said):
        problems = integrity.run_problems(whole(**over))
        assert any(said in p for p in problems), problems

    def test_a_few_bad_lines_in_many_are_tolerated(self):
        assert integrity.run_problems(whole(lines=10_000, summary_lines=10_000,
                                            bad_lines=10)) == []


class TestSummaryProblems:
    def test_missing_garbage_incomplete_and_complete(self, tmp_path):
        run = tmp_path / "r"
        run.mkdir()
        assert "no summary.json" in integrity.summary_problems(str(run))[0]
        (run / "summary.json").write_text('{"scenario": ')
        assert "does not parse" in integrity.summary_problems(str(run))[0]
        complete = {k: 1 for k in integrity.SUMMARY_REQUIRED}
        (run / "summary.json").write_text(json.dumps({**complete, "lost": None}))
        assert "lacks lost" in integrity.summary_problems(str(run))[0]
        (run / "summary.json").write_text(json.dumps(complete))
        assert integrity.summary_problems(str(run)) == []
        assert integrity.summary_problems("hdfs:///runs/x") == []


def fake_java(tmp_path: Path, version_line: str, status: int = 0) -> str:
    path = tmp_path / "java"
    path.write_text(f"#!/bin/sh\necho '{version_line}' >&2\nexit {status}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


class TestJava:
    def test_versions(self, tmp_path):
        new = fake_java(tmp_path, 'openjdk version "17.0.15" 2025-04-15')
        assert integrity.java_version(new) == (17, 'openjdk version "17.0.15" 2025-04-15')
        assert integrity.java_problem(new) is None
        old = fake_java(tmp_path, 'java version "1.8.0_392"')
        assert integrity.java_version(old)[0] == 8
        problem = integrity.java_problem(old)
        assert "Java 8 found" in problem and "apt-get install" in problem

    def test_absent_or_broken(self, tmp_path, monkeypatch):
        assert "no working Java" in integrity.java_problem(str(tmp_path / "nope"))
        broken = fake_java(tmp_path, "Error: could not create the VM", status=1)
        assert "no working Java" in integrity.java_problem(broken)
        monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
        problem = integrity.java_problem()
        assert "JAVA_HOME=" in problem and "openjdk-17-jre-headless" in problem

    def test_compare_checks_java_before_running_anything(self, tmp_path, monkeypatch,
                                                         capsys):
        """With no Java, `treefed compare` exits 2 with the hint and writes no run."""
        from treefed.scenario import compare

        monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
        monkeypatch.chdir(tmp_path)
        assert compare.main([str(SCENARIO), "--out", str(tmp_path / "runs")]) == 2
        assert "no working Java" in capsys.readouterr().err
        assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- main

@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    from treefed.scenario.runner import run_scenario

    root = tmp_path_factory.mktemp("runs")
    # JSON lines only: these damage the text log (Parquet parts: test_parquet_job.py)
    return [r.path for r in run_scenario(SCENARIO, engine="replay", out=root, parquet=False)]


def damaged(runs: list[Path], tmp_path: Path, **how: str) -> list[Path]:
    """Copies of the three runs, the one of each mode in ``how`` damaged that way."""
    copies = []
    for run in runs:
        copy = tmp_path / run.name
        shutil.copytree(run, copy)
        copies.append(copy)
    for mode, kind in how.items():
        victim = next(c for c in copies if f"-{mode}-" in c.name)
        log = victim / "events.jsonl.gz"
        if kind == "interrupted":
            (victim / "summary.json").unlink()
        elif kind == "garbage":
            count = len(gzip.decompress(log.read_bytes()).splitlines())
            log.write_bytes(gzip.compress(b"\x00not json at all\n" * count))
        elif kind == "truncated":
            data = log.read_bytes()
            log.write_bytes(data[: len(data) // 2])
    return copies


def report(dirs: list[Path], out: Path, *extra: str) -> tuple[int, str, str]:
    from treefed.analysis import job

    printed, complained = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(complained):
        status = job.main([str(d) for d in dirs] + ["--out", str(out), *extra])
    return status, printed.getvalue(), complained.getvalue()


class TestRefusal:
    def test_interrupted_run_is_refused_before_spark(self, runs, tmp_path):
        dirs = damaged(runs, tmp_path, **{"mesh-ttl1": "interrupted"})
        out = tmp_path / "report"
        status, _, err = report(dirs, out)
        assert status == 2
        assert "retail-small-mesh-ttl1" in err and "no summary.json" in err
        assert not out.exists()

    @pytest.mark.spark
    @pytest.mark.slow
    def test_damaged_logs_are_refused(self, spark, runs, tmp_path):
        """A log of garbage and a gzip cut in half: both runs named, exit 2, no folder."""
        dirs = damaged(runs, tmp_path, **{"mesh-ttl1": "garbage", "mesh-ttl2": "truncated"})
        out = tmp_path / "report"
        status, _, err = report(dirs, out)
        assert status == 2, err
        (garbage,) = [x for x in err.splitlines() if "do not parse" in x]
        assert "retail-small-mesh-ttl1" in garbage and "(100.0%)" in garbage
        (cut,) = [x for x in err.splitlines() if "log truncated" in x]
        assert "retail-small-mesh-ttl2" in cut
        assert "retail-small-tree-" not in err     # the whole run is not blamed
        assert not out.exists()

    @pytest.mark.spark
    @pytest.mark.slow
    def test_allow_partial_includes_it_flagged(self, spark, runs, tmp_path):
        dirs = damaged(runs, tmp_path, **{"mesh-ttl1": "interrupted"})
        out = tmp_path / "report"
        status, _, err = report(dirs, out, "--allow-partial")
        assert status == 0, err
        page = (out / "index.html").read_text()
        assert "mesh-ttl1 [partial]" in page and "no complete summary.json" in page
        md = (out / "report.md").read_text()
        assert "Partial runs" in md
        # the whole runs' accounting is shown term by term
        assert "| retail-small | 13 | mesh-ttl2 | 40 | 33 | 7 |" in md
