"""One local SparkSession for the whole test session: starting one costs 5-9 s."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    """A local[2] SparkSession with the UI off and few shuffle partitions."""
    import os

    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")   # servers in tests: loopback only

    session = (SparkSession.builder.master("local[2]").appName("treefed-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.session.timeZone", "UTC")
               # Tests' inputs are a few hundred rows in a chain of many small jobs (the
               # model runs two or three per hop): adaptive execution re-plans each
               # query stage by stage for nothing here -- off, -12 % of the JVM's CPU on
               # the model tests.  It picks plans, never results (job.py and model/cli.py
               # keep Spark's default for users).
               .config("spark.sql.adaptive.enabled", "false")
               # every hop's plans are new code to compile: keep more of them compiled
               .config("spark.sql.codegen.cache.maxEntries", "2000")
               # G1's concurrent work on 2 cores (job.JIT_OPTIONS says why a report
               # uses the parallel collector; C1-only JIT is slower for these tests)
               .config("spark.driver.extraJavaOptions", "-XX:+UseParallelGC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
