"""What the comparison refuses: runs whose evidence is incomplete, and a missing Java.

Theory of operation
-------------------
The report is evidence, so every run it counts must be whole.  Two passes:

* before Spark starts (``summary_problems``): each local run directory must hold a
  ``summary.json`` that parses and carries every key of ``SUMMARY_REQUIRED`` -- a run cut
  off with Ctrl-C has none, an older runner's lacks the accounting terms;
* after the job (``run_problems``, on one row of the runs table): the log must hold every
  line ``summary.json`` counts (``events``) and end with ``run.finished`` -- fewer lines is a
  truncated log; at most ``MAX_BAD_SHARE`` of the lines may be unparseable; and the
  accounting must close -- ``expected = delivered + stranded + dropped + lost`` with
  ``lost`` 0, the stranded count of the log equal to the runner's.

A refused run stops the report (exit 2, every problem named with its run) unless the
caller allows partial runs; then it is included and flagged.  ``java_problem`` is asked
before anything runs: PySpark needs a Java runtime, and finding out after the scenario
runs, as a Py4J traceback, wastes the run.

Pure apart from reading summary.json files and running ``java -version``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "SUMMARY_REQUIRED",
    "MAX_BAD_SHARE",
    "MIN_JAVA",
    "JAVA_HINT",
    "summary_problems",
    "run_problems",
    "parquet_problems",
    "java_version",
    "java_problem",
]

#: Keys a complete summary.json carries (the runner writes them last, all at once).
SUMMARY_REQUIRED = ("scenario", "mode", "engine", "brokers", "links", "expected",
                    "delivered", "stranded", "dropped", "lost", "events")
#: Largest share of unparseable log lines a run may have and still count.
MAX_BAD_SHARE = 0.001
#: The oldest Java the installed PySpark (4.x) runs on.
MIN_JAVA = 17
JAVA_HINT = ("install a Java 17+ runtime (Debian/Ubuntu: apt-get install -y "
             "openjdk-17-jre-headless) or point JAVA_HOME at one")


def _has_scheme(path: str) -> bool:
    return "://" in path


def summary_problems(run_dir: str) -> list[str]:
    """Why ``run_dir``'s summary.json does not make it a complete run (empty: it does).
    Remote run directories (URIs) are checked after the job, from what Spark read."""
    if _has_scheme(run_dir) or os.path.isfile(run_dir):
        return []
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        return ["no summary.json (the run did not finish: interrupted, or a log gathered "
                "from elsewhere)"]
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return [f"summary.json does not parse ({exc})"]
    if not isinstance(summary, dict):
        return ["summary.json is not an object"]
    missing = [k for k in SUMMARY_REQUIRED if summary.get(k) is None]
    if missing:
        return [f"summary.json lacks {', '.join(missing)} (incomplete, or written by an "
                "older treefed: run the scenario again)"]
    return []


def parquet_problems(run_dir: str) -> list[str]:
    """Why the Parquet parts a local run's summary.json lists are not its whole log
    (missing, unreadable footer, rows other than listed or than ``events``); empty when
    they are, or when it lists none (the job then reads the JSON lines)."""
    if _has_scheme(run_dir) or not os.path.isdir(run_dir):
        return []
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return []   # summary_problems names it
    if not isinstance(summary, dict) or not summary.get("parquet_parts"):
        return []
    from treefed.scenario.parquet_parts import parquet_problems as check

    return check(run_dir, summary)


def _n(row: Mapping[str, object], key: str) -> int | None:
    value = row.get(key)
    return None if value is None else int(value)  # type: ignore[arg-type]


def run_problems(row: Mapping[str, object]) -> list[str]:
    """Why one runs-table row is not whole evidence (empty: it is).

    Reads ``lines``, ``bad_lines``, ``summary_lines`` (summary.json's ``events``),
    ``finished`` (run.finished lines), ``expected``, ``delivered``, ``stranded``,
    ``stranded_log``, ``dropped`` and ``lost``."""
    problems: list[str] = []
    lines, bad = _n(row, "lines") or 0, _n(row, "bad_lines") or 0
    want = _n(row, "summary_lines")
    if want is None or _n(row, "expected") is None:
        problems.append("no complete summary.json")
    elif lines < want:
        problems.append(f"log truncated: {lines:,} of the {want:,} lines summary.json "
                        "counts")
    elif lines > want:
        problems.append(f"log has {lines:,} lines, summary.json counts {want:,}")
    if not _n(row, "finished"):
        problems.append("log has no run.finished line (truncated or unfinished)")
    if lines == 0:
        problems.append("log is empty")
    elif bad > MAX_BAD_SHARE * lines:
        problems.append(f"{bad:,} of {lines:,} log lines ({bad / lines:.1%}) do not parse "
                        f"(at most {MAX_BAD_SHARE:.1%} allowed)")
    expected = _n(row, "expected")
    if expected is not None:
        terms = {k: _n(row, k) for k in ("delivered", "stranded", "dropped", "lost")}
        if any(v is None for v in terms.values()):
            problems.append("accounting incomplete: "
                            + ", ".join(k for k, v in terms.items() if v is None)
                            + " unknown")
        else:
            total = sum(terms.values())   # type: ignore[arg-type]
            if total != expected:
                problems.append(
                    f"accounting does not close: expected {expected:,} != delivered "
                    f"{terms['delivered']:,} + stranded {terms['stranded']:,} + dropped "
                    f"{terms['dropped']:,} + lost {terms['lost']:,}")
            if terms["lost"]:
                problems.append(f"{terms['lost']:,} message copies lost (neither delivered, "
                                "stranded nor dropped with a reason)")
        logged = _n(row, "stranded_log")
        if logged is not None and terms["stranded"] is not None \
                and logged != terms["stranded"]:
            problems.append(f"log has {logged:,} message.stranded lines, summary.json "
                            f"counts {terms['stranded']:,}")
    return problems


_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?[^"]*"')


def java_version(java: str | None = None) -> tuple[int, str] | None:
    """(major version, the first line of ``java -version``) of the Java PySpark would use
    (JAVA_HOME's, else the first on PATH); None when there is none that runs."""
    if java is None:
        home = os.environ.get("JAVA_HOME")
        java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    text = (done.stderr or "") + (done.stdout or "")
    match = _VERSION.search(text)
    if done.returncode != 0 or match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2):     # "1.8.0_392" is Java 8
        major = int(match.group(2))
    return major, text.strip().splitlines()[0]


def java_problem(java: str | None = None) -> str | None:
    """Why the Spark job cannot start here (None: Java is fine), with an install hint."""
    found = java_version(java)
    if found is None:
        where = f"JAVA_HOME={os.environ['JAVA_HOME']}" if os.environ.get("JAVA_HOME") \
            and java is None else (java or "PATH")
        return f"no working Java found ({where}); the Spark job needs one: {JAVA_HINT}"
    major, line = found
    if major < MIN_JAVA:
        return (f"Java {major} found ({line}); PySpark needs Java {MIN_JAVA} or newer: "
                f"{JAVA_HINT}")
    return None
