"""Class-data sharing for the report's local Spark driver JVM (Java's AppCDS).

A cold driver JVM spends its first seconds loading, parsing and verifying thousands of
classes from pyspark's jars -- at start-up and again inside the job, as each new kind of
plan, reader and writer is first used.  Java 17 can keep those classes in a *dynamic
archive* that a later JVM maps instead (``-XX:ArchiveClassesAtExit`` writes one when a
JVM exits; ``-XX:SharedArchiveFile`` uses it).

``python -m treefed.analysis.cds`` (``make run``'s first step) builds the archive once
per JDK and pyspark: it runs the scenario ``sweep-size-4x0005`` in every compared mode
into a temporary directory, reports them with the Spark job in a JVM started with
``-XX:ArchiveClassesAtExit``, waits for that JVM to write the archive as it exits (the
report's own JVM never dumps: writing ~190 MB while the report's heap is still mapped
would land in make run's peak and its time), and moves the archive to
``archive_dir()/<key>.jsa``.  The key names the JDK PySpark starts (JAVA_HOME's, else the
first on PATH: its home, release file and libjvm) and pyspark (version, home, its jars),
so another JDK or pyspark finds no archive rather than a foreign one.

``java_options()`` is what job._session gives a local driver JVM: the archive of this
JDK and pyspark when it exists, starts with the dynamic archive's magic number and has
the length it was written with (``<key>.jsa.bytes``: a truncated archive crashes the
JVM instead of being ignored), else nothing.  The JVM checks the rest itself (its
version, the class path, the jars' sizes and times) and runs without an archive that
does not match: never an error.  Its ``cds`` log messages are switched off, so a stale
archive prints nothing.

``TREEFED_SPARK_CDS`` names the directory the archives live in (default: in the virtual
environment, ``<venv>/treefed-cds``, else ``~/.cache/treefed/cds``); ``off`` disables
class-data sharing.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["ENV", "SCENARIO", "archive_dir", "archive_path", "java_options", "main"]

ENV = "TREEFED_SPARK_CDS"
#: the small input the archive is made from: every compared mode, ~1 s to run
SCENARIO = "sweep-size-4x0005"
#: a dynamic archive's first four bytes (HotSpot's CDS_DYNAMIC_ARCHIVE_MAGIC)
_MAGIC = 0xF00BABA8
#: the JVM's cds messages (a stale, foreign or broken archive) off
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
#: set by main() in the building process: the file its JVM writes at exit
_dump_to: Path | None = None


def _java() -> Path | None:
    """The java binary PySpark's launcher runs (JAVA_HOME's, else PATH's), resolved."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    return Path(os.path.realpath(java))


def _spark_home() -> Path | None:
    try:
        from pyspark.find_spark_home import _find_spark_home

        with contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            return Path(_find_spark_home()).resolve()
    except (ImportError, StopIteration, OSError, SystemExit):
        return None


def _stat(path: Path) -> str:
    try:
        s = path.stat()
    except OSError:
        return f"{path.name}:-"
    return f"{path.name}:{s.st_size}:{s.st_mtime_ns}"


def archive_key() -> str | None:
    """Names the JDK and pyspark an archive is for; None without Java or pyspark."""
    java = _java()
    spark_home = _spark_home()
    if java is None or spark_home is None:
        return None
    import pyspark

    home = java.parent.parent
    parts = [str(java), pyspark.__version__, str(spark_home)]
    try:
        parts.append((home / "release").read_text(errors="replace"))
    except OSError:
        pass
    parts.append(_stat(home / "lib" / "server" / "libjvm.so"))
    jars = spark_home / "jars"
    if jars.is_dir():
        parts += sorted(_stat(j) for j in jars.iterdir())
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return f"java{_major(home)}-pyspark{pyspark.__version__}-{digest}"


def _major(home: Path) -> str:
    try:
        for line in (home / "release").read_text(errors="replace").splitlines():
            if line.startswith("JAVA_VERSION="):
                return line.split("=", 1)[1].strip('"').split(".")[0]
    except OSError:
        pass
    return ""


def archive_dir() -> Path | None:
    """Where the archives live; None when class-data sharing is off."""
    chosen = os.environ.get(ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off", "0", "no") else Path(chosen)
    if sys.prefix != sys.base_prefix:        # a virtual environment: make clean drops it
        return Path(sys.prefix) / "treefed-cds"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "treefed" / "cds"


def archive_path() -> Path | None:
    """The archive this JDK and pyspark would use (it may not exist); None: none can."""
    where = archive_dir()
    key = archive_key() if where is not None else None
    return None if key is None else where / f"{key}.jsa"


def _sized(path: Path) -> Path:
    """The file beside an archive holding its length as written: a JVM given a
    truncated archive crashes rather than falling back."""
    return path.with_name(path.name + ".bytes")


def _usable(path: Path) -> bool:
    """A dynamic archive as it was written (its magic number, its length)."""
    try:
        with path.open("rb") as f:
            head = f.read(4)
            size = os.fstat(f.fileno()).st_size
        written = int(_sized(path).read_text().strip())
    except (OSError, ValueError):
        return False
    return len(head) == 4 and struct.unpack("<I", head)[0] == _MAGIC and size == written


def java_options() -> str:
    """Driver JVM options for class-data sharing: the archive when there is a usable one
    (or, in the building process, where to write it); else an empty string."""
    if _dump_to is not None:
        return f"-XX:ArchiveClassesAtExit={_dump_to} {QUIET}"
    path = archive_path()
    # spark.driver.extraJavaOptions is split at blanks: a path with one is left out
    if path is None or any(c.isspace() or c in "\"'" for c in str(path)) \
            or not _usable(path):
        return ""
    return f"-XX:SharedArchiveFile={path} {QUIET}"


def _report_small(work: Path) -> None:
    """The Spark job over SCENARIO's runs (made here), as make run's report runs it."""
    from treefed.analysis import job
    from treefed.scenario.compare import (DRIVER_MEMORY, find_scenario,
                                          with_compared_modes)
    from treefed.scenario.runner import run_scenario
    from treefed.scenario.spec import load_scenario

    scenario = with_compared_modes(load_scenario(find_scenario(SCENARIO)))
    with contextlib.redirect_stdout(io.StringIO()):
        runs = [str(r.path) for r in run_scenario(scenario, engine="replay",
                                                  out=str(work / "runs"))]
        rc = job.main([*runs, "--out", str(work / "report"), "--driver-memory",
                       DRIVER_MEMORY])
    if rc != 0:
        raise RuntimeError(f"the small report exited {rc}")


def _wait_for_jvm(timeout: float) -> None:
    """Let the stopped session's JVM exit (it does when its stdin closes) and write its
    archive; PySpark leaves it running until this Python exits otherwise."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    if proc is None:
        raise RuntimeError("the JVM was not started by this process")
    if proc.stdin is not None:
        proc.stdin.close()
    try:
        proc.wait(timeout=timeout)
    except BaseException:      # a dump that does not end is not left running
        proc.kill()
        proc.wait()
        raise


def build(target: Path, *, timeout: float = 600.0) -> Path:
    """Write the archive to ``target`` (a temporary name beside it first, so a failed or
    interrupted build leaves nothing a JVM would map)."""
    global _dump_to
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        with tempfile.TemporaryDirectory(prefix="treefed-cds-") as work:
            _dump_to = partial
            try:
                _report_small(Path(work))
                _wait_for_jvm(timeout)
            finally:
                _dump_to = None
        _check(partial)
        _sized(target).write_text(f"{partial.stat().st_size}\n")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    for old in [*target.parent.glob("*.jsa"), *target.parent.glob("*.jsa.bytes")]:
        if old not in (target, _sized(target)):     # other JDKs' or pysparks' archives
            old.unlink(missing_ok=True)
    return target


def _check(archive: Path) -> None:
    """A JVM starts with the archive: written whole, by this JDK."""
    import subprocess

    try:
        with archive.open("rb") as f:
            head = f.read(4)
    except OSError:
        head = b""
    if len(head) != 4 or struct.unpack("<I", head)[0] != _MAGIC:
        raise RuntimeError("the JVM wrote no archive")
    with tempfile.TemporaryDirectory(prefix="treefed-cds-") as cwd:
        done = subprocess.run([str(_java()), f"-XX:SharedArchiveFile={archive}",
                               *QUIET.split(), "-version"], cwd=cwd, capture_output=True,
                              timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"a JVM given the archive exited {done.returncode}")


def main(argv: list[str] | None = None) -> int:
    """Build the archive if this JDK and pyspark have none.  Always exits 0: the report
    runs without an archive, only slower to warm up."""
    del argv
    target = archive_path()
    if target is None:
        if archive_dir() is not None:
            print("treefed: no Spark class archive (no Java or pyspark found)",
                  file=sys.stderr)
        return 0
    if _usable(target):
        return 0
    from treefed.analysis.integrity import java_problem

    if (problem := java_problem()) is not None:
        print(f"treefed: no Spark class archive: {problem}", file=sys.stderr)
        return 0
    print(f"treefed: building the Spark driver's class archive (once per JDK and "
          f"pyspark) from a small report: {target}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    try:
        build(target)
    except Exception as e:    # never fails make run: the report runs without it
        print(f"treefed: no Spark class archive ({type(e).__name__}: {e}); the report "
              "runs without it", file=sys.stderr)
        return 0
    print(f"treefed: Spark class archive written ({target.stat().st_size / 2**20:,.0f} MiB "
          f"in {time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    # the package's module, not this __main__ copy: job._session reads its _dump_to
    from treefed.analysis.cds import main as _main

    sys.exit(_main(sys.argv[1:]))
