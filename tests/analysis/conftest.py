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
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
