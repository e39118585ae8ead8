"""Tests for treefed.scenario.runner, cli and compare: run directories and commands."""

from __future__ import annotations

import gzip
import json
import tomllib
from pathlib import Path

import pytest

from treefed.errors import ConfigError
from treefed.events import validate_event
from treefed.scenario import cli, compare
from treefed.scenario.runner import SUMMARY_KEYS, run_scenario, scenario_toml
from treefed.scenario.spec import load_scenario, parse_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
SMALL = SCENARIOS / "retail-small.toml"


@pytest.fixture(scope="module")
def small_runs(tmp_path_factory: pytest.TempPathFactory) -> list:
    return run_scenario(SMALL, out=tmp_path_factory.mktemp("runs"))


class TestRunScenario:
    def test_one_directory_per_mode(self, small_runs) -> None:
        """Every mode gets its own run directory with log, scenario and summary."""
        assert [r.summary["mode"] for r in small_runs] == ["tree", "mesh-ttl1", "mesh-ttl2"]
        for r in small_runs:
            assert r.run_id.startswith(f"retail-small-{r.summary['mode']}-replay-")
            assert r.path.name == r.run_id
            assert {p.name for p in r.path.iterdir()} == {"events.jsonl.gz", "scenario.toml",
                                                          "summary.json",
                                                          "events.part-0000.parquet",
                                                          "events.rest.parquet",
                                                          "events.demand.parquet",
                                                          "events.messages.parquet",
                                                          "events.codes.json"}

    def test_summary_keys(self, small_runs) -> None:
        """summary.json holds the issue's keys with the run's figures."""
        for r in small_runs:
            on_disk = json.loads((r.path / "summary.json").read_text())
            assert set(SUMMARY_KEYS) <= set(on_disk)
            assert on_disk["brokers"] == 13 and on_disk["links"] == 12
            assert on_disk["engine"] == "replay" and on_disk["expected"] == 40
            assert on_disk["wall_s"] > 0 and on_disk["peak_rss_mb"] > 10
        tree = small_runs[0].summary
        assert tree["delivered"] == 40 and tree["stranded"] == 0

    def test_log_lines_valid_and_tagged(self, small_runs) -> None:
        """The gzip log decodes line by line, each valid and carrying the run id."""
        r = small_runs[2]
        with gzip.open(r.path / "events.jsonl.gz", "rt") as f:
            lines = [json.loads(line) for line in f]
        assert len(lines) == r.summary["events"]
        assert all(not validate_event(line) and line["run"] == r.run_id for line in lines)
        stranded = sum(1 for line in lines if line["event"] == "message.stranded")
        assert stranded == r.summary["stranded"] > 0

    def test_a_big_log_is_written_in_parts(self, tmp_path, monkeypatch) -> None:
        """Past LOG_PART_LINES the log goes on in events.part-NNNN.jsonl.gz files: every
        line in exactly one part, in order, each part non-empty, all listed in the
        summary and all found by the Spark job's file listing."""
        import functools

        from treefed.analysis.job import event_files
        from treefed.log import EventWriter
        from treefed.scenario import runner

        monkeypatch.setattr(runner, "LOG_PART_LINES", 300)
        monkeypatch.setattr(runner, "EventWriter",
                            functools.partial(EventWriter, buffer_lines=100))
        (r,) = run_scenario(SMALL, out=tmp_path, modes=["mesh-ttl2"])
        names = r.summary["log_files"]
        assert names[0] == "events.jsonl.gz" and len(names) >= 3
        assert names[1:] == [f"events.part-{i:04d}.jsonl.gz" for i in range(1, len(names))]
        lines, per_part = [], []
        for name in names:
            with gzip.open(r.path / name, "rt") as f:
                part = [json.loads(line) for line in f]
            per_part.append(len(part))
            lines += part
        assert len(lines) == r.summary["events"] and all(n > 0 for n in per_part)
        assert max(per_part) <= 400          # a part closes at the chunk after 300 lines
        assert [line["ts"] for line in lines] == sorted(line["ts"] for line in lines)
        assert lines[0]["event"] == "run.started" and lines[-1]["event"] == "run.finished"
        assert sorted(Path(f).name for f in event_files([str(r.path)])) == sorted(names)

    def test_resolved_scenario_reruns(self, small_runs) -> None:
        """scenario.toml parses back to the same scenario, with only the run's mode."""
        original = load_scenario(SMALL)
        for r in small_runs:
            again = parse_scenario(tomllib.loads((r.path / "scenario.toml").read_text()))
            assert [m.label for m in again.modes] == [r.summary["mode"]]
            assert again.modes[0] == original.mode(r.summary["mode"])
            assert (again.workload, again.topology, again.seed) == (
                original.workload, original.topology, original.seed)

    def test_timeline_round_trips(self) -> None:
        """A scenario with every timeline action survives scenario_toml unchanged."""
        sc = load_scenario(SCENARIOS / "churn.toml")
        again = parse_scenario(tomllib.loads(scenario_toml(sc)))
        assert again.timeline == sc.timeline and again.modes == sc.modes

    def test_bad_input_refused_before_running(self, tmp_path: Path) -> None:
        """A bad scenario, an unknown mode or engine raise before any directory exists."""
        bad = tmp_path / "bad.toml"
        bad.write_text('name = "x"\n[topology]\nregions = 1\nstores_per_region = 0\n'
                       '[[mode]]\nconnector = "tree"\n')
        out = tmp_path / "runs"
        with pytest.raises(ConfigError) as info:
            run_scenario(bad, out=out)
        assert info.value.key == "topology.stores_per_region"
        with pytest.raises(ConfigError):
            run_scenario(SMALL, out=out, modes=["mesh-ttl9"])
        with pytest.raises(ValueError):
            run_scenario(SMALL, out=out, engine="warp")
        assert not out.exists()

    def test_run_ids_unique(self, tmp_path: Path) -> None:
        """Two runs of one mode in the same second get distinct directories."""
        a = run_scenario(SMALL, out=tmp_path, modes=["tree"])[0]
        b = run_scenario(SMALL, out=tmp_path, modes=["tree"])[0]
        assert a.path != b.path and a.summary["delivered"] == b.summary["delivered"]


class TestScenarioCli:
    def test_run_prints_table(self, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
        """`scenario run FILE --mode tree` exits 0 and prints the summary table."""
        rc = cli.main(["run", str(SMALL), "--out", str(tmp_path), "--mode", "tree"])
        out = capsys.readouterr().out
        assert rc == 0 and "tree" in out and "strand" in out
        assert len(list(tmp_path.iterdir())) == 1

    def test_bad_file_exits_2_naming_key(self, tmp_path: Path,
                                         capsys: pytest.CaptureFixture) -> None:
        """A bad scenario exits 2 with the key and reason on stderr, nothing written."""
        bad = tmp_path / "bad.toml"
        bad.write_text('name = "x"\n[topology]\nregions = 2\nstores_per_region = 1\n'
                       '[[mode]]\nconnector = "mesh"\nnetwork_ttl = "two"\n')
        rc = cli.main(["run", str(bad), "--out", str(tmp_path / "runs")])
        err = capsys.readouterr().err
        assert rc == 2 and "mode[0].network_ttl" in err
        assert not (tmp_path / "runs").exists()

    def test_unknown_engine_is_usage_error(self) -> None:
        """An unknown --engine is refused by argparse (exit 2)."""
        with pytest.raises(SystemExit) as info:
            cli.main(["run", str(SMALL), "--engine", "warp"])
        assert info.value.code == 2


class TestCompare:
    def test_adds_missing_modes(self) -> None:
        """Compared scenarios run tree, mesh TTL 1..3 and the tuned baselines (mesh,
        one-way mesh, NATS-style isolated leaves) and the tree variants tree-summary
        (summary_budget 50) and tree-resync (resync_grace 30 s); their own modes are kept."""
        sc = compare.with_compared_modes(load_scenario(SCENARIOS / "reconfigure.toml"))
        assert [m.label for m in sc.modes] == ["tree", "mesh-ttl2", "mesh-ttl1", "mesh-ttl3",
                                               "mesh-tuned", "mesh-tuned-oneway",
                                               "nats-isolated", "tree-summary",
                                               "tree-resync"]
        assert sc.mode("mesh-ttl3").options == {"network_ttl": 3, "duplex": True}
        assert sc.mode("tree-summary").options == {
            "summary_budget": 50, "summary_owned": ["queue://Store.{broker}.>"]}
        assert sc.mode("tree-resync").options == {"resync_grace": 30.0}
        off = compare.with_compared_modes(load_scenario(SCENARIOS / "reconfigure.toml"),
                                          summary_budget=0)
        assert "tree-summary" not in [m.label for m in off.modes]

    def test_finds_scenarios_by_name(self) -> None:
        """A bare name resolves to scenarios/<name>.toml; an unknown one is a ConfigError."""
        assert compare.find_scenario("deep").name == "deep.toml"
        with pytest.raises(ConfigError):
            compare.find_scenario("no-such-scenario")

    def test_runs_without_report(self, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
        """`compare --no-report retail-small` runs the nine compared modes."""
        rc = compare.main(["retail-small", "--no-report", "--out", str(tmp_path)])
        assert rc == 0
        assert sorted(p.name.split("-replay-")[0] for p in tmp_path.iterdir()) == [
            "retail-small-mesh-ttl1", "retail-small-mesh-ttl2", "retail-small-mesh-ttl3",
            "retail-small-mesh-tuned", "retail-small-mesh-tuned-oneway",
            "retail-small-nats-isolated", "retail-small-tree", "retail-small-tree-resync",
            "retail-small-tree-summary"]
        assert "9 runs" in capsys.readouterr().out

    def test_unknown_scenario_exits_2(self, capsys: pytest.CaptureFixture) -> None:
        """An unknown scenario name exits 2 before anything runs."""
        assert compare.main(["nope", "--no-report"]) == 2
        assert "nope" in capsys.readouterr().err
