"""The job runs unchanged on a Spark standalone cluster.

A master and a worker are started from the installed pyspark (``spark-class
org.apache.spark.deploy.master.Master`` / ``...worker.Worker``, bound to 127.0.0.1 on
ports the OS picks), the job is submitted with ``spark-submit --master spark://...``
over real retail-small runs, and its ``runs.csv`` must equal the one local mode writes.
The worker's directories go under the test's tmp dir, never into the installed package.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "retail-small.toml"


def spark_bin(name: str) -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / name)


def wait_for(proc: subprocess.Popen, log: Path, pattern: str, timeout: float = 180) -> str:
    """The first match of ``pattern`` in the process's log, waiting for it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text(errors="replace"))
        if found:
            return found.group(1) if found.groups() else found.group(0)
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"{pattern!r} not seen; log:\n{log.read_text()[-3000:]}")


@contextlib.contextmanager
def standalone(tmp: Path):
    """A master and one worker on 127.0.0.1, started in the background: yields a function
    that waits until the worker registered with the master and returns the master URL.

    The JVMs start while the caller does other work (the local run): the master first,
    the worker once the master's log names its URL (a worker dialing a master not yet up
    retries only after 5-15 s)."""
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_WORKER_DIR=str(tmp / "work"),
               SPARK_LOCAL_DIRS=str(tmp / "local"), SPARK_LOG_DIR=str(tmp / "logs"),
               SPARK_NO_DAEMONIZE="1")
    procs: list[subprocess.Popen] = []
    lock = threading.Lock()
    stopping = threading.Event()
    mlog, wlog = tmp / "master.log", tmp / "worker.log"

    def start_worker() -> str:
        url = wait_for(procs[0], mlog, r"Starting Spark master at (spark://127\.0\.0\.1:\d+)")
        with lock:
            if stopping.is_set():
                raise AssertionError("stopped before the worker started")
            procs.append(subprocess.Popen(
                [spark_bin("spark-class"), "org.apache.spark.deploy.worker.Worker",
                 "--host", "127.0.0.1", "--port", "0", "--webui-port", "0", "--cores", "2",
                 "--memory", "1g", "--work-dir", str(tmp / "work"), url],
                stdout=wlog.open("w"), stderr=subprocess.STDOUT, env=env))
        return url

    def ready() -> tuple[str, dict]:
        url = started.result()
        wait_for(procs[1], wlog, r"Successfully registered with master")
        return url, env

    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        procs.append(subprocess.Popen(
            [spark_bin("spark-class"), "org.apache.spark.deploy.master.Master",
             "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
            stdout=mlog.open("w"), stderr=subprocess.STDOUT, env=env))
        started = pool.submit(start_worker)
        yield ready
    finally:
        with lock:                # no worker starts after this
            stopping.set()
            for proc in reversed(procs):
                proc.terminate()
        pool.shutdown()           # a waiting start_worker sees the master gone
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_cluster_runs_csv_equals_local(spark, tmp_path):
    from treefed.analysis import job
    from treefed.scenario.runner import run_scenario

    with standalone(tmp_path) as ready:      # the cluster starts during the local run
        runs = [str(r.path) for r in run_scenario(SCENARIO, engine="replay",
                                                  out=tmp_path / "runs")]
        local = tmp_path / "local"
        with contextlib.redirect_stdout(io.StringIO()):
            assert job.main([*runs, "--out", str(local)]) == 0

        url, env = ready()
        remote = tmp_path / "cluster"
        env = dict(env, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                   PYTHONPATH=str(ROOT))
        done = subprocess.run(
            [spark_bin("spark-submit"), "--master", url,
             "--conf", "spark.driver.host=127.0.0.1",
             "--conf", "spark.driver.bindAddress=127.0.0.1",
             "--conf", "spark.ui.enabled=false",
             "--conf", "spark.sql.shuffle.partitions=4",
             "--driver-memory", "1g", "--executor-memory", "1g",
             str(ROOT / "treefed" / "analysis" / "job.py"), *runs, "--out", str(remote),
             # a URI: the tables written by Spark (the local run's by the driver)
             "--tables", (tmp_path / "cluster-tables").as_uri()],
            capture_output=True, text=True, env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
        assert "report:" in done.stdout
    assert (remote / "runs.csv").read_text() == (local / "runs.csv").read_text()
    assert (remote / "per_role.csv").read_text() == (local / "per_role.csv").read_text()
    import pyarrow.parquet as pq

    for name in ("runs", "per_role", "brokers"):
        here = pq.read_table(local / "tables" / f"{name}.parquet")
        there = pq.read_table(tmp_path / "cluster-tables" / f"{name}.parquet")
        assert there.schema == here.schema, name
        assert sorted(map(repr, there.to_pylist())) == sorted(map(repr, here.to_pylist()))
