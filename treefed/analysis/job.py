"""The Spark comparison job: federation event logs -> per-run and per-role metrics.

Theory of operation
-------------------
A *run* is a directory ``DIR/<run-id>/`` holding ``events.jsonl`` (or ``.jsonl.gz``, read
natively by Spark from the suffix) and, from the scenario runner, ``summary.json``.  The
directory name is the run id for every line read from it, so logs gathered from a deployed
estate (no ``run`` field) and lines too broken to carry one are attributed the same way.

The job is a chain of stage functions, DataFrame -> DataFrame (STYLE habit 11); only
``main`` creates a SparkSession.  Everything is Spark SQL expressions, no Python UDFs, so a
cluster's executors need nothing of treefed and only small aggregates reach the driver.

* ``read_events`` applies an explicit schema built from ``events.FIELD_TYPES`` in
  PERMISSIVE mode: a line that does not parse (or lacks ``event``/``broker``) is counted
  per run by ``line_counts`` and excluded by ``valid_events`` — never fatal.  Which lines
  Spark flags as corrupt depends on the columns a query reads, so ``compute`` persists the
  parsed frame once and every stage sees the same verdict.
* ``interest`` is DESIGN §5's ``interested(b, d)``: b had a local consumer or producer for
  d, or forwarded or delivered a message of d.  A wildcard destination (``*``/``>``) is of
  interest where a matching concrete destination is.
* Advisory and demand metrics are computed per broker (``advisory_metrics``,
  ``demand_metrics`` -> ``broker_metrics``) and rolled up by role/tier (``per_role``) and
  by run (``runs_table``): a receipt (``advisory.received``, kind add) or a created demand
  at a broker not interested in its destination is *spilled* / *wasted*.
* ``max_demand`` is the peak, over time, of demand created minus removed at one broker;
  events at the same ``ts`` are netted first, so a swap within one tick is not a peak.
* ``delivered`` counts distinct copies delivered -- a queue message once, a topic message
  once per subscriber (broker and subscription id) -- the unit the runner's ``expected``
  in ``summary.json`` counts (absent for logs without one); ``duplicates`` counts
  deliveries beyond one per copy; ``stranded`` counts ``message.stranded`` lines.
* ``convergence`` pairs each ``consumer.added`` with the ``demand.created`` lines for that
  consumer id up to its next add, and measures to the last one; a consumer whose interest
  created no demand anywhere has no convergence time (it is still counted in
  ``consumers``).  A ``consumer.added`` carrying a local id is qualified with its broker.
  Times are rounded to the microsecond, below which epoch-second subtraction is noise.

The job never writes to the run directories and never fails on a bad line; it fails
only when a run directory holds no event log.
"""

from __future__ import annotations

import argparse
import csv
import glob
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

try:
    from treefed import events as schema
except ImportError:  # `spark-submit treefed/analysis/job.py` from an uninstalled checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from treefed import events as schema

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

__all__ = [
    "RUN_COLUMNS",
    "ROLE_COLUMNS",
    "USED_COLUMNS",
    "Tables",
    "event_schema",
    "event_files",
    "read_events",
    "read_summaries",
    "line_counts",
    "valid_events",
    "run_info",
    "broker_roles",
    "site_tier",
    "interest",
    "advisory_metrics",
    "demand_metrics",
    "delivery_metrics",
    "convergence",
    "broker_metrics",
    "per_role",
    "runs_table",
    "compute",
    "main",
]

CORRUPT = "_corrupt_record"

#: Columns of runs.csv / the runs table, in order.
RUN_COLUMNS: tuple[str, ...] = (
    "run", "scenario", "mode", "ttl", "engine", "brokers", "links", "regions",
    "stores_per_region", "depth", "consumers", "advisory_frames", "advisory_receipts",
    "spilled_advisories", "advisories_per_consumer", "demand_created", "wasted_demand",
    "max_demand_per_broker", "expected", "delivered", "delivery_ratio", "deliveries",
    "duplicates", "stranded", "convergence_median_s", "convergence_p99_s", "lines",
    "bad_lines", "run_wall_s", "run_peak_rss_mb",
)

#: Columns of per_role.csv / the per-role table, in order.
ROLE_COLUMNS: tuple[str, ...] = (
    "run", "scenario", "mode", "ttl", "stores_per_region", "role", "tier", "brokers",
    "advisory_frames", "advisory_receipts", "spilled_advisories", "demand_created",
    "wasted_demand", "max_demand_per_broker", "deliveries", "stranded",
)

#: The event fields the metrics read; ``compute`` parses and caches only these.
USED_COLUMNS: tuple[str, ...] = (
    "run", "ts", "broker", "event", "kind", "consumer", "dst", "msg", "role", "node_type",
    "parent", "scenario", "mode", "engine", "brokers", "links", "params", CORRUPT,
)

_SPARK_TYPES = {
    "string": T.StringType(),
    "long": T.LongType(),
    "double": T.DoubleType(),
    "boolean": T.BooleanType(),
}

_SUMMARY_SCHEMA = T.StructType([
    T.StructField("scenario", T.StringType()),
    T.StructField("mode", T.StringType()),
    T.StructField("engine", T.StringType()),
    T.StructField("brokers", T.LongType()),
    T.StructField("links", T.LongType()),
    T.StructField("expected", T.LongType()),
    T.StructField("wall_s", T.DoubleType()),
    T.StructField("peak_rss_mb", T.DoubleType()),
])

# Event-name groups used by more than one stage.
_INTEREST_EVENTS = ("consumer.added", "message.produced", "message.forwarded",
                    "message.delivered")
_KNOWN_TIERS = ("country", "region", "store")


def _is(*names: str) -> Column:
    """The line is one of these events."""
    return F.col("event").isin(*names)


# ----------------------------------------------------------------------------- reading

def event_schema() -> T.StructType:
    """The explicit read schema: every events.FIELD_TYPES field, then the corrupt column."""
    fields = [T.StructField(name, _SPARK_TYPES[kind])
              for name, kind in schema.FIELD_TYPES.items()]
    return T.StructType(fields + [T.StructField(CORRUPT, T.StringType())])


def _has_scheme(path: str) -> bool:
    return "://" in path


def _uri_exists(spark: SparkSession, uri: str) -> bool:
    """Whether a file exists on a Hadoop filesystem (hdfs://, s3a://, file://...)."""
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(uri)
    return path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).exists(path)


def event_files(paths: list[str]) -> list[str]:
    """Event-log files for run directories (or files given directly).

    A local directory contributes its ``events*.jsonl`` / ``events*.jsonl.gz`` files; when
    both ``X.jsonl`` and ``X.jsonl.gz`` exist the compressed one is taken (the runner
    compresses after writing).  A URI (hdfs://, s3a://...) is left to Spark as a glob.
    """
    files: list[str] = []
    for path in paths:
        if _has_scheme(path):
            files.append(path if path.endswith((".jsonl", ".gz", ".json"))
                         else path.rstrip("/") + "/events*.jsonl*")
            continue
        if os.path.isfile(path):
            files.append(path)
            continue
        found = sorted(glob.glob(os.path.join(glob.escape(path), "events*.jsonl"))
                       + glob.glob(os.path.join(glob.escape(path), "events*.jsonl.gz")))
        chosen = [f for f in found if not (f.endswith(".jsonl") and f + ".gz" in found)]
        if not chosen:
            raise FileNotFoundError(f"no events.jsonl[.gz] in run directory {path}")
        files.extend(chosen)
    return files


def _run_of(file_path: Column) -> Column:
    """The run id of a file: the name of the directory holding it."""
    return F.regexp_extract(file_path, r"([^/]+)/[^/]+$", 1)


def read_events(spark: SparkSession, paths: list[str]) -> DataFrame:
    """Every line of the runs' event logs, typed, with ``run`` = its run directory name.

    Unparseable lines are kept with ``_corrupt_record`` set (see ``line_counts``)."""
    frame = (spark.read.schema(event_schema())
             .option("mode", "PERMISSIVE")
             .option("columnNameOfCorruptRecord", CORRUPT)
             .json(event_files(paths)))
    return frame.withColumn("run", _run_of(F.col("_metadata.file_path")))


def read_summaries(spark: SparkSession, paths: list[str]) -> DataFrame:
    """``summary.json`` of each run directory that has one: run, scenario, mode, engine,
    brokers, links, expected, wall_s, peak_rss_mb."""
    candidates = [p.rstrip("/") + "/summary.json" for p in paths]
    files = [f for f in candidates
             if (_uri_exists(spark, f) if _has_scheme(f) else os.path.isfile(f))]
    if not files:
        return spark.createDataFrame(
            [], T.StructType([T.StructField("run", T.StringType())] + _SUMMARY_SCHEMA.fields))
    frame = spark.read.schema(_SUMMARY_SCHEMA).option("multiLine", True).json(files)
    return frame.select(_run_of(F.col("_metadata.file_path")).alias("run"), "*")


# ----------------------------------------------------------------------------- stages

def _bad() -> Column:
    # `event` and `broker` are read too, which also keeps Spark from refusing a query on
    # the corrupt column alone.
    return F.col(CORRUPT).isNotNull() | F.col("event").isNull() | F.col("broker").isNull()


def line_counts(raw: DataFrame) -> DataFrame:
    """Per run: ``lines`` read and ``bad_lines`` (unparseable, or no event/broker)."""
    return raw.groupBy("run").agg(
        F.count(F.lit(1)).alias("lines"),
        F.count(F.when(_bad(), 1)).alias("bad_lines"),
    )


def valid_events(raw: DataFrame) -> DataFrame:
    """The lines the metrics use: parsed, with an event and a broker."""
    return raw.where(~_bad()).drop(CORRUPT)


def run_info(events: DataFrame) -> DataFrame:
    """Per run, from its ``run.started`` line: scenario, mode, engine, brokers, links and
    the params regions, stores_per_region, depth and network_ttl (when given)."""
    started = events.where(_is("run.started"))

    def param(name: str) -> Column:
        # SQL try_cast (Spark >= 3.2): a non-numeric value is null, never an ANSI error.
        return F.expr(f"try_cast(get_json_object(params, '$.{name}') AS BIGINT)")

    first = {c: F.min_by(c, "ts").alias(c)
             for c in ("scenario", "mode", "engine", "brokers", "links", "params")}
    return (started.groupBy("run").agg(*first.values())
            .select("run", "scenario", "mode", "engine", "brokers", "links",
                    param("regions").alias("regions"),
                    param("stores_per_region").alias("stores_per_region"),
                    param("depth").alias("depth"),
                    param("network_ttl").alias("network_ttl")))


def site_tier(broker: Column) -> Column:
    """The site tier from a broker id: hq, country, region, store, another ``<layer>-``
    prefix, or ``other``."""
    prefix = F.regexp_extract(broker, r"^([A-Za-z]+)-", 1)
    tier = F.when(broker.startswith("hq"), F.lit("hq"))
    for known in _KNOWN_TIERS:
        tier = tier.when(prefix == known, F.lit(known))
    return tier.when(prefix != "", prefix).otherwise(F.lit("other"))


def broker_roles(events: DataFrame) -> DataFrame:
    """Per (run, broker), from its latest ``broker.info``: role, node_type, parent."""
    info = events.where(_is("broker.info"))
    return info.groupBy("run", "broker").agg(
        *(F.max_by(c, "ts").alias(c) for c in ("role", "node_type", "parent")))


def _pattern_regex(pattern: Column) -> Column:
    """A Java regex matching the destinations a wildcard destination covers."""
    escaped = F.regexp_replace(pattern, r"([.\[\]{}()\\+?^$|])", r"\\$1")
    one_segment = F.regexp_replace(escaped, r"\*", "[^.]+")
    return F.concat(F.lit("^"), F.regexp_replace(one_segment, ">", ".+"), F.lit("$"))


def interest(events: DataFrame) -> DataFrame:
    """Distinct (run, broker, dst) such that ``interested(broker, dst)`` (DESIGN §5)."""
    direct = (events.where(_is(*_INTEREST_EVENTS) & F.col("dst").isNotNull())
              .select("run", "broker", "dst").distinct())
    patterns = (events.where(F.col("dst").contains("*") | F.col("dst").contains(">"))
                .select("run", F.col("dst").alias("pattern")).distinct()
                .withColumn("pattern_re", _pattern_regex(F.col("pattern"))))
    covered = (patterns.join(direct, "run")
               .where(F.expr("dst rlike pattern_re"))
               .select("run", "broker", F.col("pattern").alias("dst")))
    return direct.unionByName(covered).distinct()


def _against_interest(rows: DataFrame, interested: DataFrame) -> DataFrame:
    """``rows`` with a boolean ``useful``: the broker is interested in the row's dst."""
    flags = interested.select("run", "broker", "dst", F.lit(True).alias("useful"))
    return (rows.join(flags, ["run", "broker", "dst"], "left")
            .withColumn("useful", F.coalesce(F.col("useful"), F.lit(False))))


def _is_add() -> Column:
    return F.coalesce(F.col("kind"), F.lit("add")) == "add"


def advisory_metrics(events: DataFrame, interested: DataFrame) -> DataFrame:
    """Per (run, broker): advisory_frames sent, advisory_receipts, spilled_advisories
    (add advisories only; removals mirror them)."""
    adds = events.where(_is("advisory.sent", "advisory.received") & _is_add())
    flagged = _against_interest(adds.select("run", "broker", "dst", "event"), interested)
    received = _is("advisory.received")
    return flagged.groupBy("run", "broker").agg(
        F.count(F.when(_is("advisory.sent"), 1)).alias("advisory_frames"),
        F.count(F.when(received, 1)).alias("advisory_receipts"),
        F.count(F.when(received & ~F.col("useful"), 1)).alias("spilled_advisories"),
    )


def demand_metrics(events: DataFrame, interested: DataFrame) -> DataFrame:
    """Per (run, broker): demand_created, wasted_demand, max_demand (peak held)."""
    created = events.where(_is("demand.created")).select("run", "broker", "dst")
    counts = _against_interest(created, interested).groupBy("run", "broker").agg(
        F.count(F.lit(1)).alias("demand_created"),
        F.count(F.when(~F.col("useful"), 1)).alias("wasted_demand"),
    )
    changes = (events.where(_is("demand.created", "demand.removed"))
               .groupBy("run", "broker", "ts")
               .agg(F.sum(F.when(_is("demand.created"), 1).otherwise(-1)).alias("net")))
    upto_now = (Window.partitionBy("run", "broker").orderBy("ts")
                .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    peaks = (changes.withColumn("held", F.sum("net").over(upto_now))
             .groupBy("run", "broker")
             .agg(F.greatest(F.max("held"), F.lit(0)).alias("max_demand")))
    return (counts.join(peaks, ["run", "broker"], "full")
            .na.fill(0, ["demand_created", "wasted_demand", "max_demand"]))


def delivery_metrics(events: DataFrame) -> DataFrame:
    """Per run: delivered copies, deliveries, duplicates, stranded (see module doc)."""
    wanted = events.where(_is("message.delivered", "message.stranded"))
    delivered = _is("message.delivered")
    topic = F.col("dst").startswith("topic://") | F.col("dst").startswith("temp-topic://")
    # A topic subscriber is (broker, subscription id): the last part of the consumer id,
    # so a subscriber that reconnected (new conn) is still one subscriber.
    subscriber = F.concat_ws("/", "broker", F.substring_index("consumer", "/", -1))
    copy = F.when(topic, F.concat_ws("\x00", "msg", "dst", subscriber)) \
            .otherwise(F.concat_ws("\x00", "msg", "dst"))
    return wanted.groupBy("run").agg(
        F.count_distinct(F.when(delivered, copy)).alias("delivered"),
        F.count(F.when(delivered, 1)).alias("deliveries"),
        (F.count(F.when(delivered, 1))
         - F.count_distinct(F.when(delivered, copy))).alias("duplicates"),
        F.count(F.when(_is("message.stranded"), 1)).alias("stranded"),
    )


def convergence(events: DataFrame) -> DataFrame:
    """Per run: consumers (distinct ids added), convergence_median_s, convergence_p99_s."""
    qualified = F.when(F.col("consumer").startswith(F.concat(F.col("broker"), F.lit("/"))),
                       F.col("consumer")).otherwise(F.concat_ws("/", "broker", "consumer"))
    added = (events.where(_is("consumer.added"))
             .select("run", qualified.alias("consumer"), F.col("ts").alias("added_ts")))
    next_add = Window.partitionBy("run", "consumer").orderBy("added_ts")
    added = added.withColumn("until", F.lead("added_ts").over(next_add))
    demand = (events.where(_is("demand.created"))
              .select("run", "consumer", F.col("ts").alias("demand_ts")))
    in_window = ((F.col("demand_ts") >= F.col("added_ts"))
                 & (F.col("until").isNull() | (F.col("demand_ts") < F.col("until"))))
    per_add = (added.join(demand, ["run", "consumer"], "left")
               .groupBy("run", "consumer", "added_ts")
               .agg(F.round(F.max(F.when(in_window, F.col("demand_ts")))
                            - F.col("added_ts"), 6).alias("seconds")))
    quantiles = F.percentile_approx("seconds", [0.5, 0.99])
    return (per_add.groupBy("run")
            .agg(F.count_distinct("consumer").alias("consumers"), quantiles.alias("q"))
            .select("run", "consumers",
                    F.col("q")[0].alias("convergence_median_s"),
                    F.col("q")[1].alias("convergence_p99_s")))


def broker_metrics(events: DataFrame, interested: DataFrame) -> DataFrame:
    """Per (run, broker) of every broker that logged: advisory and demand metrics plus
    deliveries and stranded messages at that broker."""
    brokers = (events.where(~F.col("event").startswith("run."))
               .select("run", "broker").distinct())
    messages = (events.where(_is("message.delivered", "message.stranded"))
                .groupBy("run", "broker").agg(
                    F.count(F.when(_is("message.delivered"), 1)).alias("deliveries"),
                    F.count(F.when(_is("message.stranded"), 1)).alias("stranded")))
    joined = brokers
    for part in (advisory_metrics(events, interested), demand_metrics(events, interested),
                 messages):
        joined = joined.join(part, ["run", "broker"], "left")
    counts = [c for c in joined.columns if c not in ("run", "broker")]
    return joined.na.fill(0, counts)


_SUMMED = ("advisory_frames", "advisory_receipts", "spilled_advisories", "demand_created",
           "wasted_demand", "deliveries", "stranded")


def per_role(brokers: DataFrame, roles: DataFrame, info: DataFrame) -> DataFrame:
    """``broker_metrics`` by (run, role, tier); role ``unknown`` where no broker.info."""
    labelled = (brokers.join(roles.select("run", "broker", "role"), ["run", "broker"], "left")
                .withColumn("role", F.coalesce(F.col("role"), F.lit("unknown")))
                .withColumn("tier", site_tier(F.col("broker"))))
    grouped = labelled.groupBy("run", "role", "tier").agg(
        F.count(F.lit(1)).alias("brokers"),
        *(F.sum(c).alias(c) for c in _SUMMED),
        F.max("max_demand").alias("max_demand_per_broker"))
    named = info.select("run", "scenario", "mode", "stores_per_region", _ttl(info))
    return (grouped.join(named, "run", "left").select(*ROLE_COLUMNS)
            .orderBy("run", "tier", "role"))


def _ttl(frame: DataFrame) -> Column:
    """Mesh network TTL: params.network_ttl, else from the mode name (``mesh-ttl2``);
    null for tree mode."""
    from_mode = F.expr("try_cast(regexp_extract(lower(mode), 'ttl[_=-]?(-?[0-9]+)', 1) "
                       "AS BIGINT)")
    given = F.col("network_ttl") if "network_ttl" in frame.columns else F.lit(None)
    ttl = F.coalesce(given.cast("long"), from_mode)
    return F.when(F.lower(F.col("mode")).startswith("tree"), F.lit(None).cast("long")) \
            .otherwise(ttl).alias("ttl")


def runs_table(info: DataFrame, summaries: DataFrame, lines: DataFrame,
               brokers: DataFrame, delivery: DataFrame, converged: DataFrame) -> DataFrame:
    """One row per run with RUN_COLUMNS: log-derived metrics, run.started facts,
    summary.json's expected count (and run cost), bad-line counts."""
    rollup = brokers.groupBy("run").agg(
        F.count(F.lit(1)).alias("brokers_logged"),
        *(F.sum(c).alias(c) for c in _SUMMED if c not in ("deliveries", "stranded")),
        F.max("max_demand").alias("max_demand_per_broker"))
    s = summaries.select(
        "run", *(F.col(c).alias("s_" + c) for c in summaries.columns if c != "run"))
    everyone = lines.select("run").unionByName(s.select("run")).distinct()
    joined = everyone
    for part in (info, s, lines, rollup, delivery, converged):
        joined = joined.join(part, "run", "left")
    joined = (joined
              .withColumn("scenario", F.coalesce("scenario", "s_scenario", "run"))
              .withColumn("mode", F.coalesce("mode", "s_mode", F.lit("unknown")))
              .withColumn("engine", F.coalesce("engine", "s_engine"))
              .withColumn("brokers", F.coalesce("brokers", "s_brokers", "brokers_logged"))
              .withColumn("links", F.coalesce("links", "s_links")))
    zero = ("consumers", "advisory_frames", "advisory_receipts", "spilled_advisories",
            "demand_created", "wasted_demand", "max_demand_per_broker", "delivered",
            "deliveries", "duplicates", "stranded", "lines", "bad_lines")
    joined = joined.na.fill(0, list(zero))
    return (joined.select(
                "run", "scenario", "mode", _ttl(joined),
                "engine", "brokers", "links", "regions", "stores_per_region", "depth",
                "consumers", "advisory_frames", "advisory_receipts", "spilled_advisories",
                F.try_divide(F.col("advisory_receipts").cast("double"),
                             F.col("consumers")).alias("advisories_per_consumer"),
                "demand_created", "wasted_demand", "max_demand_per_broker",
                F.col("s_expected").alias("expected"), "delivered",
                F.try_divide(F.col("delivered").cast("double"),
                             F.col("s_expected")).alias("delivery_ratio"),
                "deliveries", "duplicates", "stranded", "convergence_median_s",
                "convergence_p99_s", "lines", "bad_lines",
                F.col("s_wall_s").alias("run_wall_s"),
                F.col("s_peak_rss_mb").alias("run_peak_rss_mb"))
            .orderBy("scenario", "brokers", F.col("ttl").isNotNull(), "ttl", "mode", "run"))


# ----------------------------------------------------------------------------- driver

@dataclass(frozen=True)
class Tables:
    """The job's outputs (lazy frames) and the persisted parsed log they derive from."""

    runs: DataFrame       # one row per run, RUN_COLUMNS
    per_role: DataFrame   # one row per (run, role, tier), ROLE_COLUMNS
    brokers: DataFrame    # one row per (run, broker): broker_metrics
    cached: tuple[DataFrame, ...]   # persisted intermediates, freed by release()

    def release(self) -> None:
        """Unpersist the cached intermediates."""
        for frame in self.cached:
            frame.unpersist()


#: Local event logs (gzip bytes) past which the parsed log is cached on disk only: the
#: four retail-4x1000 modes are 72 million lines, and building their in-memory columnar
#: cache ran a 3 GB driver out of heap, where the disk cache streams.
DISK_CACHE_BYTES = 128 * 2**20


def log_bytes(paths: list[str]) -> int | None:
    """Bytes of the runs' local event logs; None when some are remote (URIs)."""
    if any(_has_scheme(p) for p in paths):
        return None
    return sum(os.path.getsize(f) for f in event_files(paths))


def cache_level(paths: list[str]) -> StorageLevel:
    """How the parsed log is kept: in memory (spilling) unless it is big and local."""
    size = log_bytes(paths)
    if size is not None and size > DISK_CACHE_BYTES:
        return StorageLevel.DISK_ONLY
    return StorageLevel.MEMORY_AND_DISK


def compute(spark: SparkSession, paths: list[str]) -> Tables:
    """Wire the stages for the given run directories."""
    # Only the columns the metrics read are parsed and kept (link, peer, hops... are
    # half a log line), persisted so the JSON is decoded once, not once per metric, and
    # every stage sees the same corrupt-line verdict.
    parsed = (read_events(spark, paths).select(*USED_COLUMNS)
              .persist(cache_level(paths)))
    events = valid_events(parsed)
    # Small (distinct broker x destination) and joined by both advisory and demand metrics.
    interested = interest(events).persist(StorageLevel.MEMORY_AND_DISK)
    info = run_info(events)
    # Small (one row per broker) and read three times: by its own table, the run rollup
    # and the role rollup.
    brokers = broker_metrics(events, interested).persist(StorageLevel.MEMORY_AND_DISK)
    runs = runs_table(info, read_summaries(spark, paths), line_counts(parsed), brokers,
                      delivery_metrics(events), convergence(events))
    roles = per_role(brokers, broker_roles(events), info)
    return Tables(runs=runs, per_role=roles, brokers=brokers,
                  cached=(parsed, interested, brokers))


def _write_csv(path: Path, columns: tuple[str, ...], rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if row[c] is None else row[c] for c in columns])


def _session(args: argparse.Namespace) -> tuple[SparkSession, bool]:
    """The session to use and whether we own it (stop it at the end)."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    builder = SparkSession.builder.appName("treefed-report") \
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ   # spark-submit chose the master
    master = args.master or (None if under_submit else "local[*]")
    if master is not None:
        builder = builder.master(master)
    if master is not None and master.startswith("local"):
        # A local job talks to nothing but itself: keep the driver on loopback.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.memory", args.driver_memory) \
            .config("spark.driver.bindAddress", "127.0.0.1") \
            .config("spark.driver.host", "127.0.0.1")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    context = spark.sparkContext
    # A runtime SQL setting, so it also applies under `spark-submit --master local[*]`;
    # the default 200 partitions make every tiny aggregate hundreds of tasks.
    if context.master.startswith("local") and \
            not context.getConf().contains("spark.sql.shuffle.partitions"):
        spark.conf.set("spark.sql.shuffle.partitions", str(args.partitions))
    if not context.getConf().contains("spark.sql.autoBroadcastJoinThreshold"):
        # Per-broker and per-destination tables of a 4,000-broker TTL 2 run are millions
        # of rows, and Spark's size estimate after aggregation can pick one to broadcast
        # and exhaust the driver heap; sort-merge joins scale with the data instead.
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    return spark, True


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="treefed report",
        description="Spark job: run event logs -> comparison tables, plots and report")
    p.add_argument("runs", nargs="+", help="run directories (DIR/<run-id>/)")
    p.add_argument("--out", required=True, help="report directory (driver-local)")
    p.add_argument("--master", default=None,
                   help="Spark master (default local[*]; under spark-submit its own)")
    p.add_argument("--tables", default=None,
                   help="where the Parquet tables go (default OUT/tables); on a cluster "
                        "a URI every executor can write, e.g. hdfs:///reports/x")
    p.add_argument("--partitions", type=int, default=4,
                   help="shuffle partitions for a local master")
    p.add_argument("--driver-memory", default="3g", help="driver memory for a local master")
    p.add_argument("--title", default="treefed: tree vs TTL federation")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the job; print where the report is. Returns the exit status."""
    args = _parser().parse_args(argv)
    from treefed.analysis import report   # matplotlib only once arguments are good

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tables_dir = args.tables or str(out.resolve() / "tables")
    started = time.perf_counter()
    try:
        files = event_files(args.runs)
    except FileNotFoundError as e:
        print(f"treefed report: {e}", file=sys.stderr)
        return 2
    spark, owned = _session(args)
    session_s = time.perf_counter() - started
    try:
        job_started = time.perf_counter()
        tables = compute(spark, args.runs)
        run_rows = tables.runs.collect()
        role_rows = tables.per_role.collect()
        # The two small tables are written from what was collected, not recomputed.
        for name, frame in (
                ("runs", spark.createDataFrame(run_rows, tables.runs.schema)),
                ("per_role", spark.createDataFrame(role_rows, tables.per_role.schema)),
                ("brokers", tables.brokers)):
            frame.coalesce(1).write.mode("overwrite").parquet(f"{tables_dir}/{name}.parquet")
        tables.release()
        job_s = time.perf_counter() - job_started
        runs = [r.asDict() for r in run_rows]
        roles = [r.asDict() for r in role_rows]
    finally:
        if owned:
            spark.stop()
    _write_csv(out / "runs.csv", RUN_COLUMNS, runs)
    _write_csv(out / "per_role.csv", ROLE_COLUMNS, roles)
    report.render(runs, roles, out, title=args.title)
    lines = sum(r["lines"] for r in runs)
    for r in runs:
        if r["bad_lines"]:
            print(f"treefed report: {r['run']}: {r['bad_lines']} of {r['lines']} lines "
                  "did not parse and were skipped", file=sys.stderr)
    print(f"{len(runs)} runs, {len(files)} event logs, {lines:,} lines: "
          f"job {job_s:.1f} s ({lines / job_s if job_s else 0:,.0f} lines/s), "
          f"Spark start {session_s:.1f} s")
    print(f"report: {(out / 'index.html').resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
