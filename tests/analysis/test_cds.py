"""The driver JVM's class archive (analysis/cds.py): used only when this JDK and pyspark
have a usable one, harmless when it is stale or broken, built without failing make run.
No Spark session here: the JVMs started are ``java -version``."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest

from treefed.analysis import cds, integrity, job

needs_java = pytest.mark.skipif(integrity.java_version() is None, reason="needs Java")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(cds.ENV, str(tmp_path / "cds"))
    return tmp_path / "cds"


def _archive(path: Path, body: bytes = b"") -> Path:
    """A file with a dynamic archive's magic number, listed at its length."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<I", cds._MAGIC) + body)
    cds._sized(path).write_text(f"{path.stat().st_size}\n")
    return path


@needs_java
def test_the_driver_uses_the_archive_only_when_there_is_one(cache) -> None:
    assert cds.java_options() == ""
    assert job.driver_java_options() == job.JIT_OPTIONS
    target = cds.archive_path()
    assert target is not None and target.parent == cache and target.suffix == ".jsa"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"not an archive")        # not a dynamic archive: left out
    assert cds.java_options() == ""
    _archive(target)
    options = job.driver_java_options()
    assert options.startswith(job.JIT_OPTIONS + " ")
    assert f"-XX:SharedArchiveFile={target}" in options.split()
    assert "-Xlog:cds=off" in options.split()


def test_off_and_blank_paths_leave_sharing_out(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(cds.ENV, "off")
    assert cds.archive_dir() is None and cds.archive_path() is None
    assert cds.java_options() == ""
    monkeypatch.setenv(cds.ENV, str(tmp_path / "with blank"))
    target = cds.archive_path()
    if target is not None:
        _archive(target)
        assert cds.java_options() == ""      # extraJavaOptions is split at blanks


def test_the_key_names_the_jdk(tmp_path, monkeypatch, cache) -> None:
    """Another JDK (or the same one updated) looks for another archive."""
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text("")
    (home / "lib" / "server").mkdir(parents=True)
    (home / "lib" / "server" / "libjvm.so").write_bytes(b"x")
    (home / "release").write_text('JAVA_VERSION="17.0.15"\n')
    monkeypatch.setenv("JAVA_HOME", str(home))
    first = cds.archive_key()
    assert first is not None and first.startswith("java17-pyspark")
    (home / "release").write_text('JAVA_VERSION="17.0.16"\n')
    second = cds.archive_key()
    assert second.startswith("java17-") and second != first
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    assert cds.archive_key() is None and cds.java_options() == ""


@needs_java
def test_a_broken_archive_starts_a_quiet_jvm(cache) -> None:
    """An archive with the right magic and length but wrong contents (another build's,
    a corrupted one): the JVM runs without it and says nothing about it."""
    target = _archive(cds.archive_path(), b"\0" * 4096)
    options = cds.java_options().split()
    assert options[0] == f"-XX:SharedArchiveFile={target}"
    done = subprocess.run([str(cds._java()), *options, "-version"], capture_output=True,
                          text=True, timeout=60, cwd=cache)
    assert done.returncode == 0 and "version" in done.stderr
    assert "cds" not in done.stderr + done.stdout


@needs_java
def test_a_truncated_archive_is_left_out(cache) -> None:
    """A real archive cut short crashes a JVM that maps it: it is not handed to one."""
    target = cds.archive_path()
    target.parent.mkdir(parents=True)
    java = str(cds._java())
    subprocess.run([java, f"-XX:ArchiveClassesAtExit={target}", "-version"],
                   capture_output=True, timeout=60, cwd=cache, check=True)
    cds._sized(target).write_text(f"{target.stat().st_size}\n")
    assert cds.java_options().split()[0] == f"-XX:SharedArchiveFile={target}"
    whole = target.read_bytes()
    target.chmod(0o644)
    target.write_bytes(whole[:len(whole) // 2])
    assert cds.java_options() == ""
    crashed = subprocess.run([java, f"-XX:SharedArchiveFile={target}", *cds.QUIET.split(),
                              f"-XX:ErrorFile={cache}/hs_err.log", "-version"],
                             capture_output=True, timeout=60, cwd=cache)
    assert crashed.returncode != 0        # what the length check keeps the report from


def test_main_keeps_a_usable_archive(cache, monkeypatch) -> None:
    target = cds.archive_path()
    if target is None:
        pytest.skip("needs Java and pyspark")
    _archive(target)
    monkeypatch.setattr(cds, "build", lambda *a, **k: pytest.fail("rebuilt"))
    assert cds.main([]) == 0


def test_a_failed_build_leaves_nothing_and_exits_0(cache, monkeypatch, capsys) -> None:
    """make run goes on without an archive; no partial file is left for a JVM to map."""
    target = cds.archive_path()
    if target is None or integrity.java_problem() is not None:
        pytest.skip("needs Java and pyspark")

    def dump_fails(work: Path) -> None:
        cds._dump_to.write_bytes(b"half an archive")
        raise RuntimeError("the small report exited 1")

    monkeypatch.setattr(cds, "_report_small", dump_fails)
    assert cds.main([]) == 0
    assert "no Spark class archive (RuntimeError: the small report exited 1)" \
        in capsys.readouterr().err
    assert list(cache.iterdir()) == []
    assert cds._dump_to is None and cds.java_options() == ""


def test_a_build_that_writes_no_archive_is_refused(cache, monkeypatch, capsys) -> None:
    target = cds.archive_path()
    if target is None or integrity.java_problem() is not None:
        pytest.skip("needs Java and pyspark")
    stale = _archive(cache / "java17-pyspark0-old.jsa")
    monkeypatch.setattr(cds, "_report_small", lambda work: None)
    monkeypatch.setattr(cds, "_wait_for_jvm", lambda timeout: None)
    assert cds.main([]) == 0
    assert "the JVM wrote no archive" in capsys.readouterr().err
    assert sorted(cache.iterdir()) == [stale, cds._sized(stale)]

    def dumped(timeout: float) -> None:       # a JVM's archive (of no app classes)
        subprocess.run([str(cds._java()), f"-XX:ArchiveClassesAtExit={cds._dump_to}",
                        "-version"], capture_output=True, timeout=60, check=True)

    monkeypatch.setattr(cds, "_wait_for_jvm", dumped)
    assert cds.main([]) == 0
    assert "Spark class archive written" in capsys.readouterr().err
    assert sorted(cache.iterdir()) == [target, cds._sized(target)]   # the old one gone
    assert cds.java_options().split()[0] == f"-XX:SharedArchiveFile={target}"
