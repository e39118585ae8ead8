"""``treefed model`` through the real ``treefed`` entry point (a subprocess), without
Spark: the exact engine is the same command's reference walk."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

from tests.node.helpers import REPO_ROOT, child_env


def _treefed(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "treefed.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=child_env(), cwd=str(REPO_ROOT))


def test_treefed_lists_and_helps_the_model_command():
    top = _treefed("--help")
    assert top.returncode == 0
    assert "model" in top.stdout
    helped = _treefed("model", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "usage: treefed model" in helped.stdout
    for option in ("--mode", "--regions", "--stores-per-region", "--engine", "--no-brokers"):
        assert option in helped.stdout


def test_treefed_model_runs_the_exact_engine_end_to_end(tmp_path):
    out = tmp_path / "m"
    done = _treefed("model", "retail-small", "--engine", "exact", "--mode", "tree",
                    "--mode", "mesh-ttl2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader((out / "model.csv").open()))
    assert [(r["source"], r["mode"], r["engine"]) for r in rows] == \
        [("model", "tree", "exact"), ("model", "mesh-ttl2", "exact")]
    assert int(rows[0]["sibling_spill"]) == 0 < int(rows[1]["sibling_spill"])
    assert json.loads((out / "model.json").read_text())["engine"] == "exact"
    assert (out / "brokers-mesh-ttl2.csv").exists()


def test_treefed_model_refuses_an_unknown_scenario(tmp_path):
    done = _treefed("model", "no-such-scenario", "--engine", "exact", "--out",
                    str(tmp_path / "x"))
    assert done.returncode == 2
    assert "no scenario" in done.stderr


def test_the_module_runs_as_a_script_from_its_checkout(tmp_path):
    # spark-submit runs treefed/model/cli.py as a script: it must use the checkout it is
    # in, not whichever treefed is installed (a worktree's venv may hold another one)
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = tmp_path / "s"
    done = subprocess.run([sys.executable, str(REPO_ROOT / "treefed" / "model" / "cli.py"),
                           "retail-small", "--engine", "exact", "--mode", "tree", "--out",
                           str(out)], capture_output=True, text=True, timeout=120, env=env,
                          cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert (out / "model.csv").exists()
