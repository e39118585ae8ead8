"""The scenario runner: a scenario file in, one run directory per mode out.

Theory of operation
-------------------
``run_scenario`` validates the scenario (a ``ConfigError`` before anything runs),
builds the plan once (workload.py: the same messages and expectations for every mode),
then for each mode creates ``OUT/<run-id>/`` and runs the chosen engine into it:

* ``events.jsonl.gz`` -- every event, through ``log.EventWriter`` (gzip); a run of more
  than ``LOG_PART_LINES`` lines goes on in ``events.part-0001.jsonl.gz``, ... (gzip cannot
  be split, so Spark reads one file on one core: parts let it use them all);
* ``events.part-NNNN.parquet`` -- the same events as Parquet parts in the events.py
  schema (parquet_parts.py; ``parquet=False`` leaves them out), which the Spark job reads
  instead of the JSON lines; summary.json lists each part with its rows;
* ``scenario.toml``   -- the scenario resolved to this run: defaults explicit, globs,
  templates and consumer names as planned, only this run's mode, so the file re-runs
  exactly this run;
* ``summary.json``    -- the Recorder's figures plus scenario, mode, engine, brokers,
  links, wall_s and peak_rss_mb (``ru_maxrss`` of this process: a peak over its life so
  far, so later modes of one invocation report at least the earlier peaks).

The run id is ``<scenario>-<mode>-<engine>-<YYYYmmdd-HHMMSS>`` (``-2``, ``-3``... when
that directory exists).  The cyclic garbage collector is paused while an engine runs:
a run builds millions of long-lived objects, and generational collections over them
cost more than the run itself; what cycles a run leaves are collected afterwards.
"""

from __future__ import annotations

import gc
import json
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from treefed.errors import ConfigError
from treefed.log import EventWriter
from treefed.scenario.engines import engine_class
from treefed.scenario.parquet_parts import ParquetParts
from treefed.scenario.results import Recorder
from treefed.scenario.spec import ACTIONS, Mode, Scenario, load_scenario
from treefed.scenario.workload import Plan, build_plan

__all__ = ["RunResult", "SUMMARY_KEYS", "run_scenario", "run_mode", "scenario_toml",
           "peak_rss_mb", "select_modes"]

#: Lines per event-log file (about 14 MB of gzip): a bigger run is written in parts.
LOG_PART_LINES = 2_000_000

#: Keys every summary.json has (the issue's list); more follow them.
SUMMARY_KEYS = ("run", "scenario", "mode", "engine", "brokers", "links", "advisory_frames",
                "advisory_receipts", "demand_created", "expected", "delivered",
                "duplicates", "stranded", "wall_s", "peak_rss_mb")


@dataclass(frozen=True)
class RunResult:
    run_id: str
    path: Path                       # the run directory
    summary: dict[str, Any]
    deliveries: dict[str, list] = field(repr=False, default_factory=dict)  # msg -> [(b, sub)]


def peak_rss_mb(*, children: bool = False) -> float:
    """Peak resident set size of this process (or its reaped children) in MiB."""
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    return round(resource.getrusage(who).ru_maxrss / 1024, 1)  # Linux: KiB


def run_scenario(path_or_spec: str | Path | Scenario, *, engine: str = "replay",
                 out: str | Path = "runs", modes: Iterable[str] | None = None,
                 progress: Callable[[str, dict], None] | None = None,
                 parquet: bool = True, **engine_options: Any) -> list[RunResult]:
    """Run ``modes`` (default: all) of a scenario; one RunResult per mode, in order.

    Raises ConfigError for a bad scenario file or an unknown mode label, ValueError for an
    unknown engine -- both before anything runs."""
    scenario = path_or_spec if isinstance(path_or_spec, Scenario) \
        else load_scenario(path_or_spec)
    cls = engine_class(engine)
    chosen = select_modes(scenario, modes)
    plan = build_plan(scenario)
    return [run_mode(plan, mode, cls, engine, Path(out), progress=progress, parquet=parquet,
                     **engine_options)
            for mode in chosen]


def select_modes(scenario: Scenario, labels: Iterable[str] | None) -> list[Mode]:
    """The modes called ``labels`` (all when None); ConfigError for an unknown label."""
    if labels is None:
        return list(scenario.modes)
    known = [m.label for m in scenario.modes]
    chosen = []
    for label in labels:
        if label not in known:
            raise ConfigError("mode", f"no mode {label!r} in scenario {scenario.name!r}; "
                                      f"it has {', '.join(known)}")
        chosen.append(scenario.mode(label))
    return chosen


def run_mode(plan: Plan, mode: Mode, cls: Any, engine: str, out: Path, *,
             progress: Callable[[str, dict], None] | None = None,
             parquet: bool = True, **engine_options: Any) -> RunResult:
    """Run one mode of ``plan`` with engine class ``cls`` into a new run directory.

    The cyclic garbage collector is off from the run to the one collection made after
    it, once the engine is dropped: on earlier (before the event log is closed, say), its
    first automatic full collection walks the whole live estate for nothing -- 4,005
    in-process brokers at 4 x 1,000 (issue #14)."""
    gc_was = gc.isenabled()
    try:
        return _run_mode(plan, mode, cls, engine, out, progress=progress, parquet=parquet,
                         **engine_options)
    finally:
        if gc_was:
            gc.enable()


def _run_mode(plan: Plan, mode: Mode, cls: Any, engine: str, out: Path, *,
              progress: Callable[[str, dict], None] | None = None,
              parquet: bool = True, **engine_options: Any) -> RunResult:
    run_id, path = _run_dir(out, plan.scenario.name, mode.label, engine)
    (path / "scenario.toml").write_text(scenario_toml(plan.scenario, mode), encoding="utf-8")
    started = time.perf_counter()
    parts = ParquetParts(path, part_lines=LOG_PART_LINES, run_id=run_id) if parquet else None
    writer = EventWriter(path / "events.jsonl.gz", run=run_id, part_lines=LOG_PART_LINES,
                         tee=parts)
    try:
        recorder = Recorder(plan, writer)
        report = None if progress is None else (lambda info: progress(mode.label, info))
        runner = cls(plan, mode, recorder, progress=report, **engine_options)
        gc.disable()   # run_mode turns it back on
        figures = runner.run()
    finally:
        writer.close()
    wall = time.perf_counter() - started
    outcome = figures.pop("outcome")
    topology = plan.final_topology
    summary: dict[str, Any] = {
        "run": run_id, "scenario": plan.scenario.name, "mode": mode.label, "engine": engine,
        "brokers": len(topology), "links": len(topology) - 1,
        **outcome,
        "demand_held": outcome["demand_created"] - outcome["demand_removed"],
        "wall_s": round(wall, 3), "peak_rss_mb": peak_rss_mb(),
        "log_files": [p.name for p in writer.paths],
        "connector": mode.connector, "options": mode.options, "seed": plan.scenario.seed,
        **{k: v for k, v in figures.items() if _jsonable(v)},
    }
    summary["events"] = events = sum(recorder.counts.values())   # run.finished included
    summary["events_per_s"] = round(events / wall) if wall > 0 else 0
    if parts is not None and parts.error is None:
        summary["parquet_parts"] = [{"file": name, "rows": rows} for name, rows in parts.parts]
        if parts.codes is not None:
            summary["parquet_codes"] = parts.codes   # the job's integer columns' dictionaries
    elif parts is not None:
        summary["parquet_error"] = parts.error    # the job reads the JSON lines
    (path / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n",
                                       encoding="utf-8")
    deliveries = recorder.delivery_map()
    del runner, recorder
    gc.collect()   # runs with the collector off, too
    return RunResult(run_id, path, summary, deliveries)


def _jsonable(value: Any) -> bool:
    return isinstance(value, (int, float, str, bool, list, dict)) or value is None


def _run_dir(out: Path, scenario: str, mode: str, engine: str) -> tuple[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    base = f"{scenario}-{mode}-{engine}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_id, n = base, 1
    while True:
        path = out / run_id
        try:
            path.mkdir()
            return run_id, path
        except FileExistsError:
            n += 1
            run_id = f"{base}-{n}"


# --------------------------------------------------------------------------- scenario.toml


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def scenario_toml(scenario: Scenario, mode: Mode | None = None) -> str:
    """The scenario as TOML with every default explicit; only ``mode`` if given.
    ``parse_scenario(tomllib.loads(text))`` accepts it and means the same run."""
    lines = [f"# resolved by treefed from {scenario.source_path or '<memory>'}",
             f"name = {_value(scenario.name)}"]
    if scenario.description:
        lines.append(f"description = {_value(scenario.description)}")
    lines += [f"seed = {scenario.seed}", "", "[topology]",
              f"regions = {scenario.topology.regions}",
              f"stores_per_region = {scenario.topology.stores_per_region}"]
    if scenario.topology.layers:
        layers = ", ".join(f"{{name = {_value(layer.name)}, count = {layer.count}}}"
                           for layer in scenario.topology.layers)
        lines.append(f"layers = [{layers}]")
    for m in ([mode] if mode is not None else scenario.modes):
        lines += ["", "[[mode]]", f"connector = {_value(m.connector)}",
                  f"label = {_value(m.label)}"]
        lines += [f"{k} = {_value(v)}" for k, v in m.options.items() if v is not None]
    lines += ["", "[workload]"]
    w = scenario.workload
    for name in w.__dataclass_fields__:
        lines.append(f"{name} = {_value(getattr(w, name))}")
    for ev in scenario.timeline:
        required, optional = ACTIONS[ev.action]
        lines += ["", "[[timeline]]", f"at = {_value(float(ev.at))}",
                  f"action = {_value(ev.action)}"]
        for key in (*required, *optional):
            value = getattr(ev, key)
            if value is not None:
                lines.append(f"{key} = {_value(value)}")
    return "\n".join(lines) + "\n"
