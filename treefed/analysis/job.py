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
* ``interest`` is where a broker *sends to* a destination: it produced or forwarded a
  message of it.  Interest (an advisory, a demand subscription) in d at b is useful only
  then; a local consumer of b's own on d does not make other consumers of d useful to b.
  A wildcard destination (``*``/``>``) is of interest where a matching concrete one is.
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
* ``convergence`` is the *first* convergence: each consumer's first ``consumer.added`` to
  the last ``demand.created`` for that id before its next add or the run's next fault
  event, whichever is first.  ``fault_events`` are the times a link went down or came back
  after one; ``recovery`` times each, to the last demand change before the next.  A
  ``consumer.added`` carrying a local id is qualified with its broker.  Times are rounded
  to the microsecond, below which epoch-second subtraction is noise.
* Spill is split by the consumer's broker (``origin``): ``sibling_spill`` at a store
  about another store's consumer, ``downward_spill`` at a store about a region's or HQ's.
* The accounting columns come from ``summary.json`` (the runner judged every delivery
  against its plan); ``integrity.run_problems`` refuses a run whose log or accounting is
  not whole.

The job never writes to the run directories.  A few bad lines are counted and skipped;
a run that is not whole evidence (no complete summary.json, a truncated log, more than
``integrity.MAX_BAD_SHARE`` unparseable lines, accounting that does not close) is refused
with exit 2 -- and nothing written -- unless ``--allow-partial`` includes it, flagged.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
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
    "fault_events",
    "recovery",
    "ROLE_COLUMNS",
    "USED_COLUMNS",
    "Tables",
    "event_schema",
    "event_files",
    "parquet_parts",
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
    "stranded_where",
    "convergence",
    "broker_metrics",
    "per_role",
    "runs_table",
    "finish_runs",
    "recovery_text",
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
    # the accounting (summary.json): expected = delivered + stranded + dropped + lost
    "dropped", "dropped_reasons", "lost", "stranded_at", "stranded_log", "summary_lines",
    "finished", "problems",
    # spill by origin, and recovery after fault events apart from the first convergence
    "sibling_spill", "downward_spill", "fault_events", "recovery_max_s", "recovery",
    # the tree variants against the plain tree (variants.py): HQ's demand entries,
    # messages sent down a subtree with no consumer, advisory frames after each fault
    "root_demand", "extra_hops", "recovery_frames", "recovery_frames_by_event",
)

#: Columns of per_role.csv / the per-role table, in order.
ROLE_COLUMNS: tuple[str, ...] = (
    "run", "scenario", "mode", "ttl", "stores_per_region", "role", "tier", "brokers",
    "advisory_frames", "advisory_receipts", "spilled_advisories", "demand_created",
    "wasted_demand", "max_demand_per_broker", "deliveries", "stranded", "sibling_spill",
    "downward_spill",
)

#: The event fields the metrics read; ``compute`` parses and caches only these.
USED_COLUMNS: tuple[str, ...] = (
    "run", "ts", "broker", "event", "kind", "consumer", "dst", "msg", "role", "node_type",
    "origin", "peer",
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
    T.StructField("delivered", T.LongType()),
    T.StructField("stranded", T.LongType()),
    T.StructField("dropped", T.LongType()),
    T.StructField("dropped_by_reason", T.MapType(T.StringType(), T.LongType())),
    T.StructField("lost", T.LongType()),
    T.StructField("events", T.LongType()),
])

# Event-name groups used by more than one stage.
# A broker *sends to* a destination when it produces or forwards a message of it: only
# then is interest in that destination of use to it (a local consumer of its own is not).
_INTEREST_EVENTS = ("message.produced", "message.forwarded")
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
    """The run id of a file: the name of the directory holding it.  (Two substring_index
    calls, not a regex: evaluated on every row, the regex was a third of the two-pass
    job's CPU.)"""
    return F.substring_index(F.substring_index(file_path, "/", -2), "/", 1)


def parquet_parts(path: str) -> list[str] | None:
    """The Parquet parts a local run directory's summary.json lists (parquet_parts.py),
    when it lists some and every one exists; else None: the run is read from its JSON
    lines (an older run, a run made with ``parquet=False``, a remote directory)."""
    if _has_scheme(path) or not os.path.isdir(path):
        return None
    try:
        with open(os.path.join(path, "summary.json"), encoding="utf-8") as f:
            listed = json.load(f).get("parquet_parts")
        files = [os.path.join(path, str(p["file"])) for p in listed or ()]
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return None
    return files if files and all(os.path.isfile(f) for f in files) else None


def _parquet_schema() -> T.StructType:
    return T.StructType([T.StructField(name, _SPARK_TYPES[kind])
                         for name, kind in schema.FIELD_TYPES.items()])


def read_events(spark: SparkSession, paths: list[str], *,
                json_only: frozenset[str] = frozenset()) -> DataFrame:
    """Every line of the runs' event logs, typed, with ``run`` = its run directory name.

    A run directory with Parquet parts (``parquet_parts``) is read from them -- typed
    columns, nothing to decode -- unless it is in ``json_only``; the others from their
    JSON lines, where unparseable lines are kept with ``_corrupt_record`` set (see
    ``line_counts``).  Both give the same rows: the runner writes one from the other."""
    parquet: list[str] = []
    text: list[str] = []
    for path in paths:
        parts = None if path in json_only else parquet_parts(path)
        if parts is None:
            text.append(path)
        else:
            parquet.extend(parts)
    frames = []
    if text:
        frames.append(spark.read.schema(event_schema())
                      .option("mode", "PERMISSIVE")
                      .option("columnNameOfCorruptRecord", CORRUPT)
                      .json(event_files(text)))
    if parquet:
        frames.append(spark.read.schema(_parquet_schema()).parquet(*parquet)
                      .withColumn(CORRUPT, F.lit(None).cast("string")))
    # the run column from each file source, before a union hides its _metadata
    frames = [f.withColumn("run", _run_of(F.col("_metadata.file_path"))) for f in frames]
    return frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])


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
    """Per run: ``lines`` read, ``bad_lines`` (unparseable, or no event/broker) and
    ``finished`` (parseable ``run.finished`` lines: a whole log has one)."""
    return raw.groupBy("run").agg(
        F.count(F.lit(1)).alias("lines"),
        F.count(F.when(_bad(), 1)).alias("bad_lines"),
        F.count(F.when(~_bad() & _is("run.finished"), 1)).alias("finished"),
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
    """Distinct (run, broker, dst) such that the broker *sends to* dst: it produced or
    forwarded a message of it.  A wildcard dst counts where a matching concrete one does.
    Interest in dst -- an advisory, a demand subscription -- is useful at such a broker
    only."""
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


def _store(broker: Column, role: Column) -> Column:
    """A store: a tree leaf by its broker.info, else a ``store-`` site by its id."""
    return (F.coalesce(role, F.lit("")) == "leaf") | (site_tier(broker) == "store")


def advisory_metrics(events: DataFrame, interested: DataFrame,
                     roles: DataFrame | None = None) -> DataFrame:
    """Per (run, broker): advisory_frames sent, advisory_receipts, spilled_advisories
    (add advisories only; removals mirror them), and the spill split by where it comes
    from: ``sibling_spill`` (a store receiving about another store's consumer) and
    ``downward_spill`` (a store receiving region or HQ interest, AMQ-2875 rule 4); the rest
    of the spill lands at regions and HQ.  The consumer's broker is the advisory's
    ``origin`` (else the first part of the consumer id); stores as ``_store``."""
    adds = events.where(_is("advisory.sent", "advisory.received") & _is_add())
    origin = F.coalesce(F.col("origin"), F.substring_index("consumer", "/", 1))
    flagged = _against_interest(
        adds.select("run", "broker", "dst", "event", origin.alias("origin")), interested)
    if roles is None:
        roles = events.where(F.lit(False)).select(
            "run", "broker", F.lit(None).cast("string").alias("role"))
    r = roles.select("run", "broker", "role")
    flagged = (flagged.join(r, ["run", "broker"], "left")
               .join(r.select("run", F.col("broker").alias("origin"),
                              F.col("role").alias("origin_role")), ["run", "origin"], "left"))
    received = _is("advisory.received")
    spilled = received & ~F.col("useful")
    at_store = _store(F.col("broker"), F.col("role"))
    from_store = _store(F.col("origin"), F.col("origin_role"))
    return flagged.groupBy("run", "broker").agg(
        F.count(F.when(_is("advisory.sent"), 1)).alias("advisory_frames"),
        F.count(F.when(received, 1)).alias("advisory_receipts"),
        F.count(F.when(spilled, 1)).alias("spilled_advisories"),
        F.count(F.when(spilled & at_store & from_store, 1)).alias("sibling_spill"),
        F.count(F.when(spilled & at_store & ~from_store, 1)).alias("downward_spill"),
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


#: Brokers named per run in ``stranded_at`` (most stranded first).
STRANDED_BROKERS_SHOWN = 3


def stranded_where(events: DataFrame) -> DataFrame:
    """Per run with stranded messages: ``stranded_at``, the brokers holding the most
    ("store-r1-0002: 3, hq: 1"; ties by name; "+N more brokers" when there are more)."""
    per = (events.where(_is("message.stranded")).groupBy("run", "broker")
           .agg(F.count(F.lit(1)).alias("n")))
    listed = per.groupBy("run").agg(
        F.sort_array(F.collect_list(F.struct((-F.col("n")).alias("k"), "broker", "n")))
        .alias("all"))
    top = F.slice("all", 1, STRANDED_BROKERS_SHOWN)
    named = F.array_join(F.transform(top, lambda x: F.concat_ws(
        ": ", x["broker"], x["n"].cast("string"))), ", ")
    more = F.size("all") - STRANDED_BROKERS_SHOWN
    return listed.select("run", F.when(more > 0, F.concat(
        named, F.lit(", +"), more.cast("string"), F.lit(" more brokers")))
        .otherwise(named).alias("stranded_at"))


def fault_events(events: DataFrame) -> DataFrame:
    """Per run, the distinct times at which the estate changed under the consumers:
    a ``link.down`` (a cut, a killed broker), or a ``link.up`` after the run's first
    link.down (a restore, a restart).  (run, fault_ts, downs, ups)."""
    first_down = (events.where(_is("link.down")).groupBy("run")
                  .agg(F.min("ts").alias("first_down")))
    links = events.where(_is("link.down", "link.up")).join(first_down, "run")
    changes = links.where(_is("link.down") | (F.col("ts") > F.col("first_down")))
    return changes.groupBy("run", F.col("ts").alias("fault_ts")).agg(
        F.count(F.when(_is("link.down"), 1)).alias("downs"),
        F.count(F.when(_is("link.up"), 1)).alias("ups"))


def recovery(events: DataFrame, faults: DataFrame | None = None) -> DataFrame:
    """Per run with fault events: ``fault_events`` (how many), ``recovery_max_s`` and
    ``recovery`` ("10.000 s: 0.00200, 20.000 s: 0.00400"): for each fault event, the time from it to
    the last demand created or removed before the next one (0 when none changed)."""
    faults = fault_events(events) if faults is None else faults
    nxt = Window.partitionBy("run").orderBy("fault_ts")
    spans = faults.withColumn("until", F.lead("fault_ts").over(nxt))
    changes = (events.where(_is("demand.created", "demand.removed"))
               .select("run", F.col("ts").alias("demand_ts")))
    inside = ((F.col("demand_ts") >= F.col("fault_ts"))
              & (F.col("until").isNull() | (F.col("demand_ts") < F.col("until"))))
    per = (spans.join(changes, "run", "left")
           .groupBy("run", "fault_ts")
           .agg(F.coalesce(F.round(F.max(F.when(inside, F.col("demand_ts")))
                                   - F.col("fault_ts"), 6), F.lit(0.0)).alias("s")))
    listed = F.sort_array(F.collect_list(F.struct("fault_ts", "s")))
    return per.groupBy("run").agg(F.count(F.lit(1)).alias("fault_events"),
                                  F.max("s").alias("recovery_max_s"),
                                  recovery_text(listed).alias("recovery"))


def recovery_text(listed: Column) -> Column:
    """"10.000 s: 0.00200, 20.000 s: 0.00400" from an array of (fault_ts, s) structs in
    order (also used by passes.py, so both plans format alike)."""
    return F.array_join(F.transform(listed, lambda x: F.concat(
        F.format_number(x["fault_ts"], 3), F.lit(" s: "),
        F.format_string("%.3g", x["s"]))), ", ")


def convergence(events: DataFrame, faults: DataFrame | None = None) -> DataFrame:
    """Per run: consumers (distinct ids added), convergence_median_s, convergence_p99_s
    -- the *first* convergence: each consumer's first add, to its last demand created
    before its next add or the run's next fault event (``fault_events``), whichever comes
    first; what follows a fault is ``recovery``."""
    qualified = F.when(F.col("consumer").startswith(F.concat(F.col("broker"), F.lit("/"))),
                       F.col("consumer")).otherwise(F.concat_ws("/", "broker", "consumer"))
    added = (events.where(_is("consumer.added"))
             .select("run", qualified.alias("consumer"), F.col("ts").alias("added_ts")))
    next_add = Window.partitionBy("run", "consumer").orderBy("added_ts")
    added = (added.withColumn("until", F.lead("added_ts").over(next_add))
             .withColumn("nth", F.row_number().over(next_add)))
    faults = fault_events(events) if faults is None else faults
    cut = (added.join(faults.select("run", "fault_ts"), "run", "left")
           .where(F.col("fault_ts") > F.col("added_ts"))
           .groupBy("run", "consumer", "added_ts").agg(F.min("fault_ts").alias("fault")))
    added = (added.join(cut, ["run", "consumer", "added_ts"], "left")
             .withColumn("until", F.least("until", "fault"))
             .withColumn("first", F.col("nth") == 1))
    demand = (events.where(_is("demand.created"))
              .select("run", "consumer", F.col("ts").alias("demand_ts")))
    in_window = ((F.col("demand_ts") >= F.col("added_ts"))
                 & (F.col("until").isNull() | (F.col("demand_ts") < F.col("until"))))
    per_add = (added.join(demand, ["run", "consumer"], "left")
               .groupBy("run", "consumer", "added_ts", "first")
               .agg(F.round(F.max(F.when(in_window, F.col("demand_ts")))
                            - F.col("added_ts"), 6).alias("seconds")))
    first_only = F.percentile_approx(F.when(F.col("first"), F.col("seconds")), [0.5, 0.99])
    return (per_add.groupBy("run")
            .agg(F.count_distinct("consumer").alias("consumers"), first_only.alias("q"))
            .select("run", "consumers",
                    F.col("q")[0].alias("convergence_median_s"),
                    F.col("q")[1].alias("convergence_p99_s")))


def broker_metrics(events: DataFrame, interested: DataFrame,
                   roles: DataFrame | None = None) -> DataFrame:
    """Per (run, broker) of every broker that logged: advisory and demand metrics plus
    deliveries and stranded messages at that broker."""
    brokers = (events.where(~F.col("event").startswith("run."))
               .select("run", "broker").distinct())
    messages = (events.where(_is("message.delivered", "message.stranded"))
                .groupBy("run", "broker").agg(
                    F.count(F.when(_is("message.delivered"), 1)).alias("deliveries"),
                    F.count(F.when(_is("message.stranded"), 1)).alias("stranded")))
    joined = brokers
    for part in (advisory_metrics(events, interested, roles),
                 demand_metrics(events, interested),
                 messages):
        joined = joined.join(part, ["run", "broker"], "left")
    counts = [c for c in joined.columns if c not in ("run", "broker")]
    return joined.na.fill(0, counts)


_SUMMED = ("advisory_frames", "advisory_receipts", "spilled_advisories", "demand_created",
           "wasted_demand", "deliveries", "stranded", "sibling_spill", "downward_spill")


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
               brokers: DataFrame, delivery: DataFrame, converged: DataFrame,
               where: DataFrame | None = None,
               recovered: DataFrame | None = None) -> DataFrame:
    """One row per run with RUN_COLUMNS: log-derived metrics, run.started facts,
    summary.json's accounting (and run cost), bad-line counts.

    ``delivered`` and ``stranded`` are summary.json's (the runner judged deliveries against
    the plan) when there is one, else the log's; ``stranded_log`` is always the log's, so
    the integrity check can compare them.  ``problems`` is left null for the driver's
    integrity verdict (integrity.run_problems)."""
    rollup = brokers.groupBy("run").agg(
        F.count(F.lit(1)).alias("brokers_logged"),
        *(F.sum(c).alias(c) for c in _SUMMED if c not in ("deliveries", "stranded")),
        F.max("max_demand").alias("max_demand_per_broker"))
    for field in _SUMMARY_SCHEMA.fields:    # a frame with fewer summary fields
        if field.name not in summaries.columns:
            summaries = summaries.withColumn(field.name, F.lit(None).cast(field.dataType))
    if "finished" not in lines.columns:
        lines = lines.withColumn("finished", F.lit(0).cast("long"))
    s = summaries.select(
        "run", *(F.col(c).alias("s_" + c) for c in summaries.columns if c != "run"))
    everyone = lines.select("run").unionByName(s.select("run")).distinct()
    joined = everyone
    delivery = delivery.withColumnRenamed("delivered", "delivered_log") \
        .withColumnRenamed("stranded", "stranded_log")
    parts = [info, s, lines, rollup, delivery, converged]
    if where is not None:
        parts.append(where)
    if recovered is not None:
        parts.append(recovered)
    else:
        joined = joined.withColumn("recovery_max_s", F.lit(None).cast("double")) \
            .withColumn("recovery", F.lit(None).cast("string")) \
            .withColumn("fault_events", F.lit(0).cast("long"))
    for part in parts:
        joined = joined.join(part, "run", "left")
    if where is None:
        joined = joined.withColumn("stranded_at", F.lit(None).cast("string"))
    return finish_runs(joined)


#: The runs table's order (finish_runs; passes._runs_rows sorts its few rows the same way
#: on the driver): ascending, nulls first.
RUNS_ORDER = ("scenario", "brokers", "ttl is not null", "ttl", "mode", "run")


def finish_runs(joined: DataFrame, extra: tuple[str, ...] = (), *,
                ordered: bool = True) -> DataFrame:
    """The runs table from one frame per run holding run.started's facts, ``s_``-prefixed
    summary.json fields and the log's metrics (``runs_table``'s join, or passes.py's
    frame built on the driver): coalesced facts, zeros for absent counts, the accounting
    columns; ``extra`` columns are carried at the end.  In RUNS_ORDER unless not
    ``ordered`` (a Spark sort is a sampling job and a shuffle)."""
    joined = (joined
              .withColumn("scenario", F.coalesce("scenario", "s_scenario", "run"))
              .withColumn("mode", F.coalesce("mode", "s_mode", F.lit("unknown")))
              .withColumn("engine", F.coalesce("engine", "s_engine"))
              .withColumn("brokers", F.coalesce("brokers", "s_brokers", "brokers_logged"))
              .withColumn("links", F.coalesce("links", "s_links")))
    zero = ("consumers", "advisory_frames", "advisory_receipts", "spilled_advisories",
            "demand_created", "wasted_demand", "max_demand_per_broker", "delivered_log",
            "deliveries", "duplicates", "stranded_log", "lines", "bad_lines", "finished",
            "sibling_spill", "downward_spill", "fault_events")
    joined = joined.na.fill(0, list(zero))
    joined = (joined.withColumn("delivered", F.coalesce("s_delivered", "delivered_log"))
              .withColumn("stranded", F.coalesce("s_stranded", "stranded_log")))
    reasons = F.array_join(F.transform(
        F.array_sort(F.map_entries("s_dropped_by_reason")),
        lambda e: F.concat_ws(" ", e["key"], e["value"].cast("string"))), ", ")
    table = (joined.select(
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
                F.col("s_peak_rss_mb").alias("run_peak_rss_mb"),
                F.col("s_dropped").alias("dropped"),
                F.when(F.size("s_dropped_by_reason") > 0, reasons).alias("dropped_reasons"),
                F.col("s_lost").alias("lost"), "stranded_at", "stranded_log",
                F.col("s_events").alias("summary_lines"), "finished",
                F.lit(None).cast("string").alias("problems"),
                "sibling_spill", "downward_spill", "fault_events", "recovery_max_s",
                "recovery", *extra))
    if not ordered:
        return table
    return table.orderBy(*(F.expr(c) for c in RUNS_ORDER))


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


#: All-Parquet sets up to this many rows are cached in memory (869,490 rows: 1.6x faster
#: than uncached); above it they are re-read per stage (6.1 million cached: out of heap
#: at 1 GB, the heap make run gives the driver).
PARQUET_CACHE_ROWS = 2_000_000


def _parquet_rows(paths: list[str]) -> int:
    """Rows the runs' summary.json files list for their Parquet parts."""
    total = 0
    for path in paths:
        with open(os.path.join(path, "summary.json"), encoding="utf-8") as f:
            total += sum(int(p["rows"]) for p in json.load(f).get("parquet_parts") or ())
    return total


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


def compute(spark: SparkSession, paths: list[str], *,
            json_only: frozenset[str] = frozenset()) -> Tables:
    """Wire the stages for the given run directories (``json_only``: read from their JSON
    lines even if they have Parquet parts)."""
    # Only the columns the metrics read are parsed and kept (link, peer, hops... are
    # half a log line), persisted so the JSON is decoded once, not once per metric, and
    # every stage sees the same corrupt-line verdict.
    parsed = read_events(spark, paths, json_only=json_only).select(*USED_COLUMNS)
    if any(p in json_only or parquet_parts(p) is None for p in paths):
        parsed = parsed.persist(cache_level(paths))
    elif _parquet_rows(paths) <= PARQUET_CACHE_ROWS:
        parsed = parsed.persist(StorageLevel.MEMORY_AND_DISK)
    # else: many rows, all Parquet -- typed columns read again per stage: caching the 6.1
    # million rows of the 4x5..4x250 sweep ran a 1 GB driver out of heap
    events = valid_events(parsed)
    # Small (distinct broker x destination) and joined by both advisory and demand metrics.
    interested = interest(events).persist(StorageLevel.MEMORY_AND_DISK)
    info = run_info(events)
    # Small (one row per broker) and read three times: by its own table, the run rollup
    # and the role rollup.
    roles_of = broker_roles(events)
    brokers = broker_metrics(events, interested, roles_of) \
        .persist(StorageLevel.MEMORY_AND_DISK)
    faults = fault_events(events)
    runs = runs_table(info, read_summaries(spark, paths), line_counts(parsed), brokers,
                      delivery_metrics(events), convergence(events, faults),
                      stranded_where(events), recovery(events, faults))
    from treefed.analysis.variants import variant_metrics

    runs = (runs.join(variant_metrics(events, brokers, roles_of, info, faults), "run", "left")
            .select(*RUN_COLUMNS)
            .orderBy("scenario", "brokers", F.col("ttl").isNotNull(), "ttl", "mode", "run"))
    roles = per_role(brokers, roles_of, info)
    return Tables(runs=runs, per_role=roles, brokers=brokers,
                  cached=(parsed, interested, brokers))


def _arrow_table(rows: list[dict], schema: T.StructType):
    """Collected rows as an Arrow table of ``schema``'s types and nullability (as Spark
    writes them: the runs table's ``mode`` is never null)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow = to_arrow_schema(schema)
    return pa.Table.from_pylist([{f.name: r[f.name] for f in schema.fields} for r in rows],
                                schema=arrow)


def _write_local_tables(tables_dir: str, tables: dict) -> None:
    """Arrow tables written as Spark's ``coalesce(1).write.mode("overwrite").parquet``
    lays them out in a local directory: ``NAME.parquet/`` holding one snappy part and
    ``_SUCCESS``, any earlier one replaced."""
    import shutil
    import uuid

    import pyarrow.parquet as pq

    for name, table in tables.items():
        where = Path(tables_dir) / f"{name}.parquet"
        if where.is_dir():
            shutil.rmtree(where)
        where.mkdir(parents=True)
        pq.write_table(table, where / f"part-00000-{uuid.uuid4()}-c000.snappy.parquet",
                       compression="snappy")
        (where / "_SUCCESS").touch()


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
        # The JIT's C1 tier only: with C2 the compiler threads took 39-47 of the job's
        # ~91 JVM CPU seconds on make run's 15.9 M rows (each Spark job's generated code
        # is compiled anew, and run too briefly to repay C2); with C1 alone 52 s in all.
        # The collector: JIT_OPTIONS.  The class archive: cds.py.
        builder = builder.config("spark.driver.extraJavaOptions", driver_java_options())
        # Jobs from two threads share the task slots (passes.compute_passes runs the
        # integer pass beside the string pass): under FIFO the first job's 44 tasks took
        # both slots and the other waited.
        builder = builder.config("spark.scheduler.mode", "FAIR") \
            .config("spark.scheduler.allocation.file", str(SCHEDULER_POOLS))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    context = spark.sparkContext
    # A runtime SQL setting, so it also applies under `spark-submit --master local[*]`;
    # the default 200 partitions make every tiny aggregate hundreds of tasks.
    if context.master.startswith("local") and \
            not context.getConf().contains("spark.sql.shuffle.partitions"):
        spark.conf.set("spark.sql.shuffle.partitions", str(args.partitions))
    if context.master.startswith("local") and not context.getConf().contains(
            "spark.sql.sources.parallelPartitionDiscovery.threshold"):
        # Local files are listed on the driver: above 32 paths (make run passes 87 runs)
        # Spark lists them in a Spark job of one task per path, three such jobs a report.
        spark.conf.set("spark.sql.sources.parallelPartitionDiscovery.threshold", "100000")
    if not context.getConf().contains("spark.sql.autoBroadcastJoinThreshold"):
        # Per-broker and per-destination tables of a 4,000-broker TTL 2 run are millions
        # of rows, and Spark's size estimate after aggregation can pick one to broadcast
        # and exhaust the driver heap; sort-merge joins scale with the data instead.
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    return spark, True


#: The scheduler pools of a local session (FAIR between them): ``CODES_POOL`` is the
#: integer pass's (passes.compute_passes).
SCHEDULER_POOLS = Path(__file__).with_name("fairscheduler.xml")
CODES_POOL = "treefed-codes"

#: The local driver JVM's JIT and GC options (see _session).  -XX:-DontCompileHugeMethods: a
#: generated method over HotSpot's 8,000 bytes is otherwise never compiled, and runs in the
#: bytecode interpreter (the string pass's per-row method is ~8.8 KB; passes.facts).
#: -XX:+UseParallelGC: the JVM picks G1 on a 2-core machine, whose concurrent marking and
#: barriers cost 4.0-4.4 of the job's 44-45 JVM CPU seconds on make run's 15.9 M rows at a
#: 768 MB heap; the parallel collector ~1.5-1.9 s (job 37.8-39.8 s; Serial: 41.5 s).
#: The job's objects are short-lived batches: throughput, not pause times, matters.
JIT_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:-DontCompileHugeMethods -XX:+UseParallelGC"


def driver_java_options() -> str:
    """A local driver JVM's options: JIT_OPTIONS, and class-data sharing when this JDK
    and pyspark have an archive (cds.py; ``python -m treefed.analysis.cds`` builds it)."""
    from treefed.analysis import cds

    return " ".join(filter(None, (JIT_OPTIONS, cds.java_options())))


def _jvm_cpu_s(spark: SparkSession) -> float | None:
    """CPU seconds the driver JVM has used (with a local master: all of Spark's work),
    None where the JVM does not say.  A figure the machine's load does not inflate."""
    try:
        pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except Exception:   # no /proc (not Linux), no gateway (Spark Connect)
        return None


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
    p.add_argument("--allow-partial", action="store_true",
                   help="include runs that are not whole evidence (no complete "
                        "summary.json, truncated log, unparseable lines, accounting that "
                        "does not close), flagged in every table, instead of refusing")
    # the stage-per-metric plan (compute) instead of the two passes (passes.py): kept to
    # check the passes against and to measure them (bench/spark_rows.py)
    p.add_argument("--legacy-plan", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", action="append", default=[], metavar="DIR",
                   help="also show the modelled estates of a `treefed model ... --out DIR` "
                        "(its runs.csv), marked as modelled (repeatable)")
    return p


def _refuse(problems: dict[str, list[str]]) -> None:
    for run, said in problems.items():
        for problem in said:
            print(f"treefed report: {run}: {problem}", file=sys.stderr)
    print(f"treefed report: refused {len(problems)} run(s) that are not whole evidence; "
          "run them again, or pass --allow-partial to include them flagged",
          file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run the job; print where the report is. Returns the exit status."""
    args = _parser().parse_args(argv)
    from treefed.analysis import integrity
    from treefed.analysis import report   # matplotlib only once arguments are good

    out = Path(args.out)
    tables_dir = args.tables or str(out.resolve() / "tables")
    started = time.perf_counter()
    try:
        files = event_files(args.runs)
    except FileNotFoundError as e:
        print(f"treefed report: {e}", file=sys.stderr)
        return 2
    from treefed.analysis.modelled import mark_emulated, read_model_runs
    try:
        modelled = read_model_runs(args.model, RUN_COLUMNS)
    except ValueError as e:
        print(f"treefed report: {e}", file=sys.stderr)
        return 2
    early = {Path(r).name: p for r in args.runs if (p := integrity.summary_problems(r))}
    # Parquet parts that are not the whole log: refused, or (--allow-partial) that run is
    # read from its JSON lines and flagged.
    bad_parts = {r: p for r in args.runs if (p := integrity.parquet_problems(r))}
    for r, said in bad_parts.items():
        early.setdefault(Path(r).name, []).extend(said)
    if early and not args.allow_partial:
        _refuse(early)
        return 2
    if SparkSession.getActiveSession() is None and "PYSPARK_GATEWAY_PORT" not in os.environ \
            and (problem := integrity.java_problem()) is not None:
        print(f"treefed report: {problem}", file=sys.stderr)
        return 2
    spark, owned = _session(args)
    from treefed.analysis.progress import StageProgress

    progress = StageProgress(spark.sparkContext.statusTracker())
    # A truncated gzip log is read up to the cut instead of failing the job: the line count
    # against summary.json then names the run as truncated (integrity.run_problems).
    spark.conf.set("spark.sql.files.ignoreCorruptFiles", "true")
    session_s = time.perf_counter() - started
    cpu_started = _jvm_cpu_s(spark)
    try:
        job_started = time.perf_counter()
        progress.__enter__()
        if args.legacy_plan:
            tables = compute(spark, args.runs, json_only=frozenset(bad_parts))
            runs = [r.asDict() for r in tables.runs.collect()]
            role_rows = [r.asDict() for r in tables.per_role.collect()]
            runs_schema, roles_schema = tables.runs.schema, tables.per_role.schema
        else:
            from treefed.analysis.passes import BROKER_SCHEMA, ROLE_SCHEMA, compute_passes

            tables = compute_passes(spark, args.runs, json_only=frozenset(bad_parts))
            runs, role_rows = tables.runs, tables.per_role
            runs_schema, roles_schema = tables.runs_schema, ROLE_SCHEMA
        verdict = {r["run"]: p for r in runs if (p := integrity.run_problems(r))}
        for r, said in bad_parts.items():
            verdict.setdefault(Path(r).name, []).extend(said)
        for r in runs:
            r["problems"] = "; ".join(verdict.get(r["run"], ())) or None
        if verdict and not args.allow_partial:
            tables.release()
            _refuse(verdict)
            return 2
        if not args.legacy_plan and not _has_scheme(tables_dir):
            # all three on the driver already: written by pyarrow, no Spark job (three
            # one-task write jobs and their planning were ~1 s of the job's serial tail)
            _write_local_tables(tables_dir, {
                "runs": _arrow_table(runs, runs_schema),
                "per_role": _arrow_table(role_rows, roles_schema),
                "brokers": tables.brokers})
            frames = ()
        else:
            # The two small tables are written from what was collected, not recomputed;
            # the three writes (a one-task Spark job each) at once, from threads.
            frames = (
                ("runs", spark.createDataFrame(
                    [tuple(r[f.name] for f in runs_schema.fields) for r in runs],
                    runs_schema)),
                ("per_role", spark.createDataFrame(
                    [tuple(r[f.name] for f in roles_schema.fields) for r in role_rows],
                    roles_schema)),
                ("brokers", tables.brokers if args.legacy_plan
                 else spark.createDataFrame(tables.brokers, BROKER_SCHEMA)))
        if frames:
            with ThreadPoolExecutor(len(frames), thread_name_prefix="treefed-write") as pool:
                for done in [pool.submit(frame.coalesce(1).write.mode("overwrite").parquet,
                                         f"{tables_dir}/{name}.parquet")
                             for name, frame in frames]:
                    done.result()
        tables.release()
        job_s = time.perf_counter() - job_started
        roles = [dict(r) for r in role_rows]
        flagged = {r["run"] for r in runs if r["problems"]}
        for r in roles:
            r["partial"] = r["run"] in flagged
        from treefed.analysis.progress import work_done

        spark_jobs, spark_stages = work_done(spark.sparkContext.statusTracker())
        jvm_cpu = _jvm_cpu_s(spark)
        jvm_cpu = None if jvm_cpu is None or cpu_started is None else jvm_cpu - cpu_started
    finally:
        progress.__exit__()
        if owned:
            spark.stop()
    out.mkdir(parents=True, exist_ok=True)
    shown = mark_emulated(runs) + modelled   # modelled rows: marked in every table
    _write_csv(out / "runs.csv", (*RUN_COLUMNS, "source"), shown)
    _write_csv(out / "per_role.csv", ROLE_COLUMNS, roles)
    report.render(shown, roles, out, title=args.title)
    lines = sum(r["lines"] for r in runs)
    for r in runs:
        if r["bad_lines"]:
            print(f"treefed report: {r['run']}: {r['bad_lines']} of {r['lines']} lines "
                  "did not parse and were skipped", file=sys.stderr)
        if r["problems"]:
            print(f"treefed report: {r['run']}: included although partial: "
                  f"{r['problems']}", file=sys.stderr)
    print(f"{len(runs)} runs, {len(files)} event logs, {lines:,} lines: "
          f"job {job_s:.1f} s ({lines / job_s if job_s else 0:,.0f} lines/s), "
          f"Spark start {session_s:.1f} s, {spark_jobs} Spark jobs, {spark_stages} stages"
          + (f", driver JVM CPU {jvm_cpu:.1f} s" if jvm_cpu is not None else ""))
    print(f"report: {(out / 'index.html').resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
