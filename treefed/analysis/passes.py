"""The comparison job in two passes over the event rows: the tables of job.py, fast.

Theory of operation
-------------------
job.py's stage functions (one DataFrame per metric, joined per run) are the definitions;
run as one Spark plan they cost ~70 Spark jobs and ~400 stages, and on a 2-core machine
the job's time went to their scheduling and shuffles, not to reading rows (97,374 rows/s
in make run).  Here the same tables come from two scans of the event rows and small
results on the driver:

1. ``dimensions`` -- one aggregation over the few rows that define the others:
   ``broker.info`` (role, node type, parent per broker: max_by ts, as job.broker_roles),
   ``run.started`` (job.run_info's facts and params, min_by ts), the (broker, dst) pairs a
   broker produced or forwarded (job.interest's direct part) and the wildcard
   destinations.  Cached (a few rows per broker), collected; wildcard coverage is
   resolved on the driver with the same regex job.interest builds.
2. ``facts`` -- one aggregation over every row.  Each row is joined (broadcast: the
   dimension tables are small) with its broker's interest and role and its origin's role,
   then exploded into one to three tagged rows and summed by tag and key:

   ``P`` (run, broker)        lines, bad lines, finished, and every per-broker count of
                              job.broker_metrics (advisory frames/receipts/spill split,
                              demand created/wasted, deliveries, stranded)
   ``T`` (run, broker, ts)    demand created minus removed: max_demand, recovery
   ``C`` (run, consumer, ts)  demand created for a consumer: convergence
   ``S`` (run, ts)            advisory frames sent: recovery_frames
   ``M`` (run, broker, copy, msg)  deliveries: delivered copies, duplicates, extra_hops
   ``F`` (run, broker, peer, msg)  forwards in tree-mode runs: extra_hops
   ``A`` (run, consumer, ts)  consumer adds: convergence
   ``L`` (run, event, ts)     link downs/ups: fault events

   With the replay engine's virtual clock a run has a handful of distinct ``ts``, so the
   result is a few rows per broker and per consumer plus one per delivery -- small next
   to the advisories (~2 % of the rows at 4 x 100 TTL 2); it is collected once (Arrow).

3. On the driver, in plain Python over those rows: per-broker and per-role tables, the
   time-window metrics (convergence, recovery, recovery frames: a walk over a few sorted
   times per consumer or fault), extra hops (a walk over the parent table, as
   variants._ancestors already did), stranded_at.  Python and not Spark because the
   inputs are now thousands of rows, where each Spark job costs more than the work; the
   counting is integer arithmetic, and what Spark formats or rounds (``round``,
   ``format_number``, ``%.3g``, the accounting columns) is still done by Spark, by the
   same expressions (``job.finish_runs``, ``job.recovery_text``,
   ``variants.frames_text``) over one local frame of one row per run.

Runs with integer codes (scenario/parquet_parts.py: ``event_code``, ``broker_code``,
``origin_code``, ``dst_code``, ``run_key``, ``consumer_code``, ``msg_code``,
``peer_code`` columns, the dictionaries in the codes file, the rows of events other than
HOT_EVENTS copied to the rest file, the hot demand.created rows' integers to the demand
file, the hot message rows' integers to the message file): the string passes above read
only the rest files' rows (a Parquet reader decodes every selected column of every row,
so the strings of the ~99.7 % that are hot are never read), and of those not the
broker.info rows, which the driver reads by their codes (``_rest_codes``: pass 1's
roles and their P rows).  ``hot_facts`` counts the hot rows by integers alone -- the same
P, S, T, L and A sums, joined with the interest and store sets as (run_key, code) pairs
taken from the codes (``_code_tables``), so it starts at once, beside pass 1 -- mapped
back to broker ids on the driver (``_hot_rows``); the demand and message files are read
on the driver by pyarrow (``_demand_counts``: C sums; ``_run_messages``: the send pairs,
M rows with facts' copy key, F rows of tree runs).  A run without codes, or whose codes
do not check (``run_codes``), is read by its strings; a run coded with an older hot list
(S8_HOT_EVENTS, OLD_HOT_EVENTS) or without a demand file is read by what it has.

``percentile_approx`` is reproduced by ``spark_percentile``: Spark's Greenwald-Khanna
summary (accuracy 10,000) over one partial aggregate -- exact below 5,000 consumers per
run, Spark's own one-rank-lower pick above it.

Where the two plans differ, this module is wrong: tests/analysis/test_passes.py runs
both on fixtures and compares runs.csv and per_role.csv byte for byte.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import sys
import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from treefed.analysis import job
from treefed.analysis.job import _INTEREST_EVENTS, _is, _is_add, _store

__all__ = ["PassTables", "dimensions", "facts", "compute_passes", "spark_percentile",
           "site_tier", "BROKER_COLUMNS"]

#: Columns of the brokers table (job.broker_metrics), in order.
BROKER_COLUMNS = ("run", "broker", "advisory_frames", "advisory_receipts",
                  "spilled_advisories", "sibling_spill", "downward_spill", "demand_created",
                  "wasted_demand", "max_demand", "deliveries", "stranded")

#: The per-broker counts summed in ``P`` rows (besides lines, bad_lines, finished).
_COUNTS = BROKER_COLUMNS[2:9] + ("deliveries", "stranded")

#: per_role's types (job.per_role): the names are strings, the rest counts.
ROLE_SCHEMA = T.StructType([
    T.StructField(c, T.StringType() if c in ("run", "scenario", "mode", "role", "tier")
                  else T.LongType()) for c in job.ROLE_COLUMNS])

BROKER_SCHEMA = T.StructType([T.StructField(c, T.StringType()) for c in BROKER_COLUMNS[:2]]
                             + [T.StructField(c, T.LongType()) for c in BROKER_COLUMNS[2:]])

_RELATIVE_ERROR = 1.0 / 10000     # percentile_approx's default accuracy


# ----------------------------------------------------------------------------- pass 1

def dimensions(events: DataFrame) -> DataFrame:
    """One row per broker.info broker (``info``), run (``start``), (broker, dst) sent to
    (``send``) and wildcard destination (``pattern``), from the valid events."""
    wild = F.col("dst").contains("*") | F.col("dst").contains(">")
    sends = _is(*_INTEREST_EVENTS) & F.col("dst").isNotNull()
    rows = events.where(_is("broker.info", "run.started") | sends | wild)
    kind = (F.when(sends, "send").when(_is("broker.info"), "info")
            .when(_is("run.started"), "start").otherwise("pattern"))

    def key(k: Column | str, broker: Column | None, dst: Column | None) -> Column:
        k = F.lit(k) if isinstance(k, str) else k
        return F.struct(k.alias("kind"),
                        (broker if broker is not None else F.lit(None).cast("string"))
                        .alias("broker"),
                        (dst if dst is not None else F.lit(None).cast("string")).alias("dst"))

    main = key(kind, F.when(kind.isin("send", "info"), F.col("broker")),
               F.when(kind.isin("send", "pattern"), F.col("dst")))
    # a broker.info or run.started line with a wildcard dst is a pattern too
    keys = F.when(wild & ~sends & _is("broker.info", "run.started"),
                  F.array(main, key("pattern", None, F.col("dst")))).otherwise(F.array(main))
    exploded = rows.select("run", "ts", "role", "node_type", "parent", "scenario", "mode",
                           "engine", "brokers", "links", "params", F.inline(keys))
    agg = exploded.groupBy("kind", "run", "broker", "dst").agg(
        *(F.max_by(c, "ts").alias(c) for c in ("role", "node_type", "parent")),
        *(F.min_by(c, "ts").alias(c)
          for c in ("scenario", "mode", "engine", "brokers", "links", "params")))

    def param(name: str) -> Column:
        return F.expr(f"try_cast(get_json_object(params, '$.{name}') AS BIGINT)")

    out = agg.select("kind", "run", "broker", "dst", "role", "node_type", "parent",
                     "scenario", "mode", "engine", "brokers", "links",
                     param("regions").alias("regions"),
                     param("stores_per_region").alias("stores_per_region"),
                     param("depth").alias("depth"),
                     param("network_ttl").alias("network_ttl"),
                     F.when(F.col("dst").contains("*") | F.col("dst").contains(">"),
                            job._pattern_regex(F.col("dst"))).alias("pattern_re"))
    return out.select("*", job._ttl(out))


# ----------------------------------------------------------------------------- pass 2

def _fact(tag: str, broker: Column | None = None, a: Column | None = None,
          b: Column | None = None, ts: Column | None = None, net: int | Column = 1,
          code: Column | None = None) -> Column:
    none = F.lit(None).cast("string")
    return F.struct(F.lit(tag).alias("tag"),
                    (F.lit(0) if code is None else code).alias("code"),
                    (none if broker is None else broker).alias("broker"),
                    (none if a is None else a).alias("a"),
                    (none if b is None else b).alias("b"),
                    (F.lit(None).cast("double") if ts is None else ts).alias("ts"),
                    (F.lit(net) if isinstance(net, int) else net).cast("long").alias("net"))


def facts(raw: DataFrame, interest: DataFrame, roles: DataFrame,
          tree_runs: list[str]) -> DataFrame:
    """The tagged sums of the module doc from every read line (corrupt ones included:
    they count as lines).  ``interest``: (run, broker, dst) distinct; ``roles``: (run,
    broker, role) one row per broker; ``tree_runs``: run ids whose forwards to keep."""
    bad = job._bad()
    valid = ~bad
    adv_add = valid & _is("advisory.sent", "advisory.received") & _is_add()
    created = valid & _is("demand.created")
    origin = F.coalesce(F.col("origin"), F.substring_index("consumer", "/", 1))
    rows = raw.select(
        "run", "ts", "broker", "event", "consumer", "dst", "msg", "peer",
        bad.alias("bad"), adv_add.alias("adv_add"), created.alias("created"),
        F.when(adv_add | created, F.col("dst")).alias("j_dst"),
        F.when(adv_add, F.col("broker")).alias("j_broker"),
        F.when(adv_add, origin).alias("j_origin"))
    i = interest.select(F.col("run").alias("i_run"), F.col("broker").alias("i_broker"),
                        F.col("dst").alias("i_dst"), F.lit(True).alias("i_useful"))
    r = roles.select(F.col("run").alias("r_run"), F.col("broker").alias("r_broker"),
                     F.col("role").alias("role"))
    o = roles.select(F.col("run").alias("o_run"), F.col("broker").alias("o_broker"),
                     F.col("role").alias("origin_role"))
    rows = (rows.join(F.broadcast(i), (F.col("run") == F.col("i_run"))
                      & (F.col("broker") == F.col("i_broker"))
                      & (F.col("j_dst") == F.col("i_dst")), "left")
            .join(F.broadcast(r), (F.col("run") == F.col("r_run"))
                  & (F.col("j_broker") == F.col("r_broker")), "left")
            .join(F.broadcast(o), (F.col("run") == F.col("o_run"))
                  & (F.col("j_origin") == F.col("o_broker")), "left"))
    useful = F.coalesce(F.col("i_useful"), F.lit(False))
    received = F.col("adv_add") & _is("advisory.received")
    spilled = received & ~useful
    at_store = _store(F.col("broker"), F.col("role"))
    from_store = _store(F.col("j_origin"), F.col("origin_role"))
    ok = ~F.col("bad")
    counts = {
        "lines": F.lit(1),
        "bad_lines": F.col("bad"),
        "finished": ok & _is("run.finished"),
        "advisory_frames": F.col("adv_add") & _is("advisory.sent"),
        "advisory_receipts": received,
        "spilled_advisories": spilled,
        "sibling_spill": spilled & at_store & from_store,
        "downward_spill": spilled & at_store & ~from_store,
        "demand_created": F.col("created"),
        "wasted_demand": F.col("created") & ~useful,
        "deliveries": ok & _is("message.delivered"),
        "stranded": ok & _is("message.stranded"),
    }
    topic = F.col("dst").startswith("topic://") | F.col("dst").startswith("temp-topic://")
    subscriber = F.concat_ws("/", "broker", F.substring_index("consumer", "/", -1))
    copy = F.when(topic, F.concat_ws("\x00", "msg", "dst", subscriber)) \
            .otherwise(F.concat_ws("\x00", "msg", "dst"))
    qualified = F.when(F.col("consumer").startswith(F.concat(F.col("broker"), F.lit("/"))),
                       F.col("consumer")).otherwise(F.concat_ws("/", "broker", "consumer"))
    # which of the P counts a line adds to, as bits (one key column and one count
    # instead of a sum per count: the bits of a broker's lines take a few values)
    code = sum((F.coalesce(c.cast("int"), F.lit(0)) * (1 << k)
                for k, c in enumerate(counts.values())
                if k > 0), F.lit(0))
    p = _fact("P", F.when(ok & ~F.col("event").startswith("run."), F.col("broker")),
              code=code)
    in_tree = F.col("run").isin(*tree_runs) if tree_runs else F.lit(False)
    # Every line's P fact, its event's fact (null when none) and demand.created's C fact:
    # one array of three, the nulls dropped after inline.  (Written as one CASE of whole
    # arrays, P's expression was in each of 9 branches: a 58 KB generated method, too long
    # for the JIT -- the stage ran in the bytecode interpreter.)
    second = (F.when(F.col("created"), _fact("T", F.col("broker"), ts=F.col("ts")))
              .when(ok & _is("demand.removed"),
                    _fact("T", F.col("broker"), ts=F.col("ts"), net=-1))
              .when(ok & _is("advisory.sent"), _fact("S", ts=F.col("ts")))
              .when(ok & _is("message.delivered"),
                    _fact("M", F.col("broker"), copy, F.col("msg")))
              .when(ok & _is("message.forwarded") & in_tree,
                    _fact("F", F.col("broker"), F.col("peer"), F.col("msg")))
              .when(ok & _is("consumer.added"), _fact("A", a=qualified, ts=F.col("ts")))
              .when(ok & _is("link.down", "link.up"),
                    _fact("L", a=F.col("event"), ts=F.col("ts"))))
    third = F.when(F.col("created"), _fact("C", a=F.col("consumer"), ts=F.col("ts")))
    exploded = (rows.select(F.col("run"), F.inline(F.array(p, second, third)))
                .where(F.col("tag").isNotNull()))
    return exploded.groupBy("tag", "run", "broker", "a", "b", "ts", "code").agg(
        F.sum("net").alias("n"))


# ----------------------------------------------------------------------------- driver side

def spark_percentile(values: list[float], quantile: float) -> float | None:
    """What Spark's ``percentile_approx(x, quantile)`` (accuracy 10,000) returns for these
    values aggregated in one partial aggregate: the Greenwald-Khanna summary built from the
    sorted values in batches of 50,000, compressed, then queried.  Exact rank pick
    (``ceil(q n)``) below 5,000 values."""
    return spark_percentiles(values, (quantile,))[0]


def spark_percentiles(values: list[float], quantiles: tuple[float, ...]) -> list[float | None]:
    """``spark_percentile`` of the same values at each quantile: the summary, which does
    not depend on the quantile, built once."""
    if not values:
        return [None] * len(quantiles)
    samples, count = _gk_summary(values)
    return [_gk_query(samples, count, q) for q in quantiles]


def _gk_summary(values: list[float]) -> tuple[list[list], int]:
    eps = _RELATIVE_ERROR
    head = 50000
    samples: list[list] = []     # [value, g, delta]
    count = 0
    ordered = sorted(values)
    for start in range(0, len(ordered), head):
        batch = ordered[start:start + head]
        if not samples:
            # nothing to merge with (the first batch): each value a sample, delta
            # floor(2 eps count) but 0 for the first and the last (as below)
            two_eps = 2 * eps
            merged = [[v, 1, math.floor(two_eps * k)]
                      for k, v in enumerate(batch, start=count + 1)]
            merged[0][2] = merged[-1][2] = 0
            count += len(batch)
        else:
            merged = []
            si = 0
            for oi, v in enumerate(batch):
                while si < len(samples) and samples[si][0] <= v:
                    merged.append(samples[si])
                    si += 1
                count += 1
                last = si == len(samples) and oi == len(batch) - 1
                delta = 0 if (not merged or last) else math.floor(2 * eps * count)
                merged.append([v, 1, delta])
            merged.extend(samples[si:])
        samples = merged
        if start + head < len(ordered) and len(samples) >= 10000:
            samples = _compress(samples, 2 * eps * count)
    return _compress(samples, 2 * eps * count), count


def _gk_query(samples: list[list], count: int, quantile: float) -> float:
    eps = _RELATIVE_ERROR
    if quantile <= eps:
        return samples[0][0]
    if quantile >= 1 - eps:
        return samples[-1][0]
    rank = math.ceil(quantile * count)
    target = max(s[1] + s[2] for s in samples) // 2
    min_rank = 0
    for value, g, delta in samples[:-1]:
        min_rank += g
        if min_rank + delta - target <= rank <= min_rank + target:
            return value
    return samples[-1][0]


def _compress(samples: list[list], threshold: float) -> list[list]:
    """The GK COMPRESS step as Spark does it: from the end, fold a sample into the one
    after it while their g's and the latter's delta stay under the threshold; the first
    and last samples are kept."""
    if not samples:
        return samples
    out: list[list] = []
    head = list(samples[-1])
    for s in reversed(samples[1:-1]):
        if s[1] + head[1] + head[2] < threshold:
            head[1] += s[1]
        else:
            out.append(head)
            head = list(s)
    out.append(head)
    out.reverse()
    if len(samples) > 1 and samples[0][0] <= out[0][0]:
        out.insert(0, samples[0])
    return out


_TIER = re.compile(r"^([A-Za-z]+)-")


def site_tier(broker: str | None) -> str:
    """job.site_tier for one broker id."""
    if broker is None:
        return "other"
    if broker.startswith("hq"):
        return "hq"
    found = _TIER.match(broker)
    return found.group(1) if found else "other"


def _window_max(times: list[float], start: float, until: float | None) -> float | None:
    """The largest of the sorted ``times`` in [start, until) (until None: no end)."""
    hi = len(times) if until is None else bisect_left(times, until)
    lo = bisect_left(times, start)
    return times[hi - 1] if hi > lo else None


@dataclass
class PassTables:
    """The job's outputs from compute_passes: collected rows and the brokers table."""

    runs: list[dict]            # RUN_COLUMNS, in the runs table's order
    runs_schema: T.StructType
    per_role: list[dict]        # ROLE_COLUMNS, in order
    brokers: pa.Table           # BROKER_COLUMNS (built from driver rows; BROKER_SCHEMA's types)
    cached: tuple[DataFrame, ...]

    def release(self) -> None:
        for frame in self.cached:
            frame.unpersist()


def _interest(rows: list, sends: dict[str, set[tuple[str, str]]] | None = None
              ) -> dict[str, set[tuple[str, str]]]:
    """job.interest on the driver: direct (broker, dst) pairs (pass 1's ``send`` rows and
    ``sends``, a run's pairs read by codes) plus, per wildcard destination, the brokers
    sending to a destination it matches (the same regex)."""
    direct: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for run, pairs in (sends or {}).items():
        direct[run] |= pairs
    patterns: dict[str, dict[str, str]] = defaultdict(dict)
    for row in rows:
        if row["kind"] == "send":
            direct[row["run"]].add((row["broker"], row["dst"]))
        if row["pattern_re"] is not None:
            patterns[row["run"]][row["dst"]] = row["pattern_re"]
    covered: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for run, found in patterns.items():
        for pattern, regex in found.items():
            compiled = re.compile(regex)
            for broker, dst in direct.get(run, ()):
                if compiled.search(dst):
                    covered[run].add((broker, pattern))
    return {run: pairs - direct.get(run, set()) for run, pairs in covered.items()}


# ----------------------------------------------------------------------------- coded rows

# parquet_parts.HOT_EVENTS: the events whose rows the integer path counts (99.7 % of make
# run's rows): P counts, advisory.sent's S, demand.created's and demand.removed's T,
# demand.created's C (demand file), link events' L, consumer.added's A, the messages' M
# and F and send pairs (message file).  (S8_HOT_EVENTS / OLD_HOT_EVENTS in runs written
# before the messages / the link, consumer and stranded events were hot.)
#: The events pass 1 reads (besides wildcard destinations).
_DIM_EVENTS = ("broker.info", "run.started") + _INTEREST_EVENTS
_CODE_TYPES = {"event_code": T.IntegerType(), "broker_code": T.IntegerType(),
               "origin_code": T.IntegerType(), "dst_code": T.IntegerType(),
               "run_key": T.LongType(), "consumer_code": T.IntegerType()}


@dataclass
class RunCodes:
    """A run's dictionaries (parquet_parts.Coder's codes file)."""

    run: str
    key: int
    brokers: list[str]
    dsts: dict[str, int]
    consumers: list[str]
    parts: list[str]      # every row, with the code columns
    rest: str             # the rows that are not hot (parquet_parts.REST_FILE)
    demand: str | None = None   # the hot demand.created rows' integers (DEMAND_FILE)
    hot: tuple[str, ...] = ()   # the events counted by codes (the codes file's ``hot``)
    messages: str | None = None  # the hot message rows' integers (MESSAGE_FILE)
    msgs: list[str] = field(default_factory=list)    # the message dictionary
    rest_rows: int = 0


def _checked_file(path: str, entry: dict, columns) -> str | None:
    """The codes file's ``{file, rows}`` entry's path when that file holds those rows and
    ``columns``; else None."""
    if "/" in str(entry["file"]):
        return None
    found = os.path.join(path, str(entry["file"]))
    meta = pq.read_metadata(found)
    if meta.num_rows != int(entry["rows"]) or not set(columns) <= set(meta.schema.names):
        return None
    return found


def run_codes(path: str) -> RunCodes | None:
    """The codes of a local run directory whose every Parquet part carries the code
    columns and whose codes file numbers the events this job knows; else None (the run
    is read by its strings: an older run, or codes from another version).  A run coded
    with an older hot list (S8_HOT_EVENTS, OLD_HOT_EVENTS) is read by what it has: its
    rest file holds the events that list leaves out."""
    from treefed.scenario.parquet_parts import (DEMAND_COLUMNS, EVENT_CODES, HOT_EVENTS,
                                                MESSAGE_COLUMNS, OLD_HOT_EVENTS,
                                                S8_HOT_EVENTS)

    parts = job.parquet_parts(path)
    if parts is None:
        return None
    try:
        with open(os.path.join(path, "summary.json"), encoding="utf-8") as f:
            name = json.load(f).get("parquet_codes")
        if not isinstance(name, str) or "/" in name:
            return None
        with open(os.path.join(path, name), encoding="utf-8") as f:
            data = json.load(f)
        hot = data.get("hot")
        if data.get("events") != list(EVENT_CODES) or \
                hot not in (list(HOT_EVENTS), list(S8_HOT_EVENTS), list(OLD_HOT_EVENTS)):
            return None
        rest = data["rest"]
        rest_path = _checked_file(path, rest, _CODE_TYPES)
        if rest_path is None:
            return None
        for part in parts:       # the columns the integer pass reads (older runs: these)
            if not set(_CODE_TYPES) <= set(pq.read_schema(part).names):
                return None
        demand_path = None        # older runs have no demand file: their parts are read
        if "demand" in data:
            demand_path = _checked_file(path, data["demand"], DEMAND_COLUMNS)
            if demand_path is None:
                return None
        messages_path, msgs = None, []
        if hot == list(HOT_EVENTS):   # the message rows are in no rest file: here
            messages_path = _checked_file(path, data["messages"], MESSAGE_COLUMNS)
            if messages_path is None:
                return None
            msgs = [str(m) for m in data["msgs"]]
        return RunCodes(run=os.path.basename(os.path.normpath(path)),
                        key=int(data["run_key"]), brokers=[str(b) for b in data["brokers"]],
                        dsts={str(k): int(v) for k, v in data["dsts"].items()},
                        consumers=[str(c) for c in data["consumers"]],
                        parts=parts, rest=rest_path, demand=demand_path,
                        hot=tuple(hot), messages=messages_path, msgs=msgs,
                        rest_rows=int(rest["rows"]))
    except (OSError, ValueError, TypeError, KeyError, AttributeError, pa.ArrowException):
        return None


def _event_in(names: tuple[str, ...]) -> Column:
    """The coded row is one of these events (either kind)."""
    from treefed.scenario.parquet_parts import EVENT_CODES

    return F.shiftright(F.col("event_code"), 1).isin(*(EVENT_CODES.index(n) for n in names))


def _coded_frame(spark: SparkSession, files: list[str]) -> DataFrame:
    """Coded Parquet files (parts or rest files) with their code columns, the run of each
    row and a null corrupt-line column."""
    fields = T.StructType(job._parquet_schema().fields
                          + [T.StructField(c, t) for c, t in _CODE_TYPES.items()])
    frame = (spark.read.schema(fields).parquet(*files)
             .withColumn(job.CORRUPT, F.lit(None).cast("string")))
    return frame.withColumn("run", job._run_of(F.col("_metadata.file_path")))


def _read(spark: SparkSession, paths: list[str], coded: dict[str, RunCodes],
          json_only: frozenset[str], skip_info: list[int] | None = None) -> DataFrame:
    """The rows read by their strings: job.read_events' rows of the runs without codes
    and the coded runs' REST_FILE rows (with null / their code columns), but the
    broker.info rows (with a broker) of the runs whose keys ``skip_info`` lists (the
    driver reads those: ``_RestCodes``)."""
    frames = []
    rest = [p for p in paths if p not in coded]
    if rest:
        frames.append(job.read_events(spark, rest, json_only=json_only).select(
            *job.USED_COLUMNS, *(F.lit(None).cast(t).alias(c) for c, t in _CODE_TYPES.items())))
    if coded:
        frame = _coded_frame(spark, [coded[p].rest for p in paths if p in coded])
        if skip_info:
            frame = frame.where(~(_event_in(("broker.info",))
                                  & F.col("broker_code").isNotNull()
                                  & F.col("run_key").isin(*skip_info)))
        frames.append(frame.select(*job.USED_COLUMNS, *_CODE_TYPES))
    strings = frames[0]
    for more in frames[1:]:
        strings = strings.unionByName(more)
    return strings


def _parts(spark: SparkSession, paths: list[str], coded: dict[str, RunCodes]) -> DataFrame:
    """Every row of the coded runs' parts (hot_facts reads only their integer columns)."""
    return _coded_frame(spark, [f for p in paths if p in coded for f in coded[p].parts])


def _hot(narrow: dict[tuple[str, ...], list[int]] | None = None) -> Column:
    """The coded row is one its run's Coder left out of the rest file: a hot event (of
    the older hot list ``hot`` for the runs whose keys ``narrow[hot]`` lists) with a
    broker and no wildcard destination."""
    from treefed.scenario.parquet_parts import HOT_EVENTS

    events = _event_in(HOT_EVENTS)
    for hot, keys in (narrow or {}).items():
        events = events & ~(_event_in(tuple(e for e in HOT_EVENTS if e not in hot))
                            & F.col("run_key").isin(*keys))
    return (events & F.col("broker_code").isNotNull()
            & F.coalesce(F.col("dst_code") >= 0, F.lit(True)))


def _narrow(coded: dict[str, RunCodes]) -> dict[tuple[str, ...], list[int]]:
    """The keys of the coded runs whose codes file lists an older hot list, by list."""
    from treefed.scenario.parquet_parts import HOT_EVENTS

    found: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for c in coded.values():
        if c.hot != HOT_EVENTS:
            found[c.hot].append(c.key)
    return dict(found)


#: HOT_EVENTS whose rows add to no count of a P row and make no other fact (facts: code
#: 0, no second fact) -- with advisory.received removals; hot_facts gives them one
#: event code, _PLAIN_CODE (no event's: _hot_rows makes a code-0 P row of it).
_PLAIN_HOT = ("advisory.dropped", "consumer.removed", "message.dropped", "message.produced",
              "message.forwarded")
_PLAIN_CODE = -1


def hot_facts(parsed: DataFrame, interest: DataFrame, stores: DataFrame,
              narrow: dict[tuple[str, ...], list[int]] | None = None) -> DataFrame:
    """What the P (and S, T, L, A) sums of ``facts`` need of the coded HOT_EVENTS rows, by
    integers: (run_key, broker_code, event_code, ts of an advisory.sent, a demand or
    link event or a consumer.added, consumer_code of a consumer.added, ``useful``,
    ``from_store``) -> count (``narrow``: the keys of the runs coded with an older hot
    list, by list).  ``useful``: the broker sends
    to the destination of its advisory.received add or demand.created (``interest``:
    (run_key, broker_code, dst_code)); ``from_store``: such an advisory's origin is a
    store (``stores``: (run_key, code) of the brokers that are, job._store).  The count
    bits of facts' P code and whether the broker itself is a store are worked out on
    the driver (``_hot_rows``) over these grouped rows: per row, two joins and a hash
    aggregate are all the JVM does (a third join and the code's arithmetic over every
    row cost ~4 of 11 CPU s on make run's 15.2 M hot rows)."""
    from treefed.scenario.parquet_parts import EVENT_CODES

    event = F.shiftright(F.col("event_code"), 1)
    add = (F.col("event_code").bitwiseAND(1) == 0)
    sent = event == EVENT_CODES.index("advisory.sent")
    received = add & (event == EVENT_CODES.index("advisory.received"))
    created = event == EVENT_CODES.index("demand.created")
    added = event == EVENT_CODES.index("consumer.added")
    timed = event.isin(*(EVENT_CODES.index(e) for e in (
        "advisory.sent", "demand.created", "demand.removed", "link.up", "link.down",
        "consumer.added")))
    # the rows whose only fact is a P row with no count bit (code 0) are one group per
    # broker (make run: -115,000 grouped rows, mostly the messages produced and forwarded)
    plain = (event.isin(*(EVENT_CODES.index(e) for e in _PLAIN_HOT))
             | (~add & (event == EVENT_CODES.index("advisory.received"))))
    rows = parsed.where(_hot(narrow)).select(
        "run_key", "broker_code",
        F.when(plain, F.lit(_PLAIN_CODE)).otherwise(F.col("event_code")).alias("event_code"),
        F.when(timed, F.col("ts")).alias("ts"),
        F.when(added, F.col("consumer_code")).alias("consumer_code"),
        F.when(received | created, F.col("broker_code")).alias("ji_broker"),
        F.when(received | created, F.col("dst_code")).alias("j_dst"),
        F.when(received, F.col("origin_code")).alias("j_origin"))
    i = interest.select(F.col("run_key").alias("i_key"), F.col("broker_code").alias("i_b"),
                        F.col("dst_code").alias("i_d"), F.lit(True).alias("i_useful"))
    fr = stores.select(F.col("run_key").alias("f_key"), F.col("code").alias("f_code"),
                       F.lit(True).alias("f_store"))
    rows = (rows.join(F.broadcast(i), (F.col("run_key") == F.col("i_key"))
                      & (F.col("ji_broker") == F.col("i_b"))
                      & (F.col("j_dst") == F.col("i_d")), "left")
            .join(F.broadcast(fr), (F.col("run_key") == F.col("f_key"))
                  & (F.col("j_origin") == F.col("f_code")), "left"))
    return rows.groupBy("run_key", "broker_code", "event_code", "ts", "consumer_code",
                        F.col("i_useful").isNotNull().alias("useful"),
                        F.col("f_store").isNotNull().alias("from_store")).count()


def consumer_facts(parsed: DataFrame) -> DataFrame:
    """facts' C sums for the coded demand.created rows of runs without a DEMAND_FILE:
    (run_key, consumer_code, ts) -> n (apart from hot_facts: a joint key with the broker
    would not collapse).  ``parsed``: those runs' parts (their hot demand.created rows
    are picked out here).  The runs with one: ``_demand_counts``."""
    return (parsed.where(_hot() & _event_in(("demand.created",)))
            .select("run_key", "consumer_code", "ts")
            .groupBy("run_key", "consumer_code", "ts").count())


def _demand_parts(spark: SparkSession, coded: dict[str, RunCodes],
                  paths: list[str]) -> DataFrame | None:
    """consumer_facts' input: the parts of the coded runs that have no DEMAND_FILE (None:
    there are none)."""
    parts = [f for p in paths if p in coded and coded[p].demand is None
             for f in coded[p].parts]
    if not parts:
        return None
    schema = T.StructType(job._parquet_schema().fields
                          + [T.StructField(c, t) for c, t in _CODE_TYPES.items()])
    return spark.read.schema(schema).parquet(*parts)


def _demand_counts(coded: dict[str, RunCodes]) -> pa.Table:
    """consumer_facts' sums for the coded runs with a DEMAND_FILE, on the driver (pyarrow:
    make run's 851,661 rows of three integers; a Spark job's planning, code generation
    and tasks cost more than the grouping): (run_key, consumer_code, ts, count)."""
    import pyarrow.compute as pc

    from treefed.scenario.parquet_parts import DEMAND_COLUMNS

    files = [c.demand for c in coded.values() if c.demand is not None]
    if not files:
        return pa.table({"run_key": pa.array([], pa.int64()),
                         "consumer_code": pa.array([], pa.int32()),
                         "ts": pa.array([], pa.float64()), "count": pa.array([], pa.int64())})
    rows = pa.concat_tables([pq.read_table(f, columns=list(DEMAND_COLUMNS)) for f in files])
    counted = rows.group_by(list(DEMAND_COLUMNS), use_threads=False).aggregate(
        [("run_key", "count", pc.CountOptions(mode="all"))])
    return pa.table({**{n: counted.column(n) for n in DEMAND_COLUMNS},
                     "count": counted.column("run_key_count")})


@dataclass
class _RestCodes:
    """What the driver takes of a coded run's REST_FILE by its codes (pyarrow): the send
    rows' (broker, dst) pairs, each broker's latest broker.info (pass 1's max_by over ts:
    a null ts never wins, of equal times the first read) and its broker.info row count.
    ``own_info``: no broker.info row has a wildcard destination (pass 1 would make a
    pattern of it), so the string passes can leave the run's broker.info rows to the
    driver: its ``info`` rows and a code-0 P row per broker, as facts counts them."""

    sends: pa.Table                     # (broker_code, dst_code)
    info: dict[int, tuple]              # broker_code -> (ts, role, node_type, parent)
    counts: dict[int, int]              # broker_code -> broker.info rows
    own_info: bool


def _rest_codes(c: RunCodes) -> _RestCodes:
    import pyarrow.compute as pc

    from treefed.scenario.parquet_parts import EVENT_CODES

    rest = pq.read_table(c.rest, columns=["event_code", "broker_code", "dst_code", "role",
                                           "node_type", "parent", "ts"])
    event = pc.shift_right(rest.column("event_code"), 1)
    sending = pa.array([EVENT_CODES.index(e) for e in _INTEREST_EVENTS], pa.int32())
    sent = rest.filter(pc.and_(pc.and_(pc.is_in(event, sending),
                                       pc.is_valid(rest.column("broker_code"))),
                               pc.greater_equal(rest.column("dst_code"), 0)))
    infos = rest.filter(pc.and_(pc.equal(event, EVENT_CODES.index("broker.info")),
                                pc.is_valid(rest.column("broker_code"))))
    latest: dict[int, tuple] = {}
    counts: dict[int, int] = defaultdict(int)
    for b, ts, role, node_type, parent in zip(*(infos.column(n).to_pylist() for n in (
            "broker_code", "ts", "role", "node_type", "parent"))):
        counts[b] += 1
        if b not in latest:
            latest[b] = (ts, role, node_type, parent) if ts is not None else \
                (None, None, None, None)
        elif ts is not None and (latest[b][0] is None or ts > latest[b][0]):
            latest[b] = (ts, role, node_type, parent)
    own = pc.sum(pc.less(infos.column("dst_code"), 0)).as_py() in (None, 0)
    return _RestCodes(sends=sent.select(["broker_code", "dst_code"]), info=latest,
                      counts=dict(counts), own_info=own)


def _code_tables(spark: SparkSession, coded: dict[str, RunCodes],
                 rests: dict[str, _RestCodes], messages: dict[str, _RunMessages]
                 ) -> tuple[DataFrame, DataFrame, set[tuple[int, int]]]:
    """hot_facts' interest and stores tables for the coded runs from their codes alone
    (so the integer pass need not wait for pass 1), and the stores as a set of
    (run_key, code) for ``_hot_rows``.  Interest: the (broker, destination) pairs a
    broker produced or forwarded to (pass 1's ``send`` rows): a run's MESSAGE_FILE pairs
    and its rest file's message rows (all of them in runs coded with an older hot list;
    only those with a wildcard destination otherwise, which no hot row has).  Stores
    (job._store): a broker whose latest broker.info (``_rest_codes``: max_by role, ts, as
    pass 1) names it a leaf, or a ``store-`` site by its id."""
    names = ["run_key", "broker_code", "dst_code"]
    tables = []
    stores: set[tuple[int, int]] = set()
    for c in coded.values():
        rest = rests[c.run]
        found = messages.get(c.run)
        for pairs in [rest.sends] + ([found.sends] if found is not None else []):
            tables.append(pa.Table.from_arrays(
                [pa.array([c.key] * pairs.num_rows, pa.int64()),
                 pairs.column("broker_code"), pairs.column("dst_code")], names))
        stores.update((c.key, b) for b, (_, role, _, _) in rest.info.items() if role == "leaf")
        stores.update((c.key, k) for k, name in enumerate(c.brokers)
                      if site_tier(name) == "store")
    interest = (pa.concat_tables(tables).group_by(names).aggregate([]) if tables
                else pa.table([pa.array([], t) for t in (pa.int64(), pa.int32(), pa.int32())],
                              names=names))
    ordered = sorted(stores)
    store_table = pa.table([pa.array([k for k, _ in ordered], pa.int64()),
                            pa.array([b for _, b in ordered], pa.int32())],
                           names=["run_key", "code"])
    return (spark.createDataFrame(interest.select(names),
                                  "run_key long, broker_code int, dst_code int"),
            spark.createDataFrame(store_table, "run_key long, code int"), stores)


def _info_rows(coded: dict[str, RunCodes], rests: dict[str, _RestCodes]) -> dict:
    """pass 1's ``info`` rows (roles) of the runs whose broker.info rows the driver read
    (``_RestCodes.own_info``), keyed by (run, broker) as compute_passes' ``roles``."""
    return {(c.run, c.brokers[b]): {"kind": "info", "run": c.run, "broker": c.brokers[b],
                                    "dst": None, "role": role, "node_type": node_type,
                                    "parent": parent}
            for c in coded.values() if rests[c.run].own_info
            for b, (_, role, node_type, parent) in rests[c.run].info.items()}


def _info_facts(coded: dict[str, RunCodes], rests: dict[str, _RestCodes]) -> Iterator[tuple]:
    """facts' P rows of those broker.info rows: a line each, code 0, at its broker."""
    for c in coded.values():
        if rests[c.run].own_info:
            for b, n in rests[c.run].counts.items():
                yield ("P", c.run, c.brokers[b], None, None, None, 0, n)


def _named_sends(coded: dict[str, RunCodes], found: dict[str, _RunMessages],
                 runs: set[str]) -> dict[str, set[tuple[str, str]]]:
    """The message files' send pairs by name, (broker, destination), of ``runs`` only
    (the runs with a wildcard destination: ``_interest`` resolves their coverage)."""
    named: dict[str, set[tuple[str, str]]] = {}
    for c in coded.values():
        if c.run in runs and c.run in found:
            dst_names = {code: name for name, code in c.dsts.items()}
            sent = found[c.run].sends
            named[c.run] = {(c.brokers[b], dst_names[d]) for b, d in zip(
                sent.column("broker_code").to_pylist(), sent.column("dst_code").to_pylist())}
    return named


def _coded(paths: list[str], json_only: frozenset[str]) -> dict[str, RunCodes]:
    """The runs read by their codes: coded, not JSON-only, and a key no other run has."""
    found = {p: c for p in paths if p not in json_only and (c := run_codes(p)) is not None}
    keys: dict[int, int] = defaultdict(int)
    for c in found.values():
        keys[c.key] += 1
    return {p: c for p, c in found.items() if keys[c.key] == 1}


def compute_passes(spark: SparkSession, paths: list[str], *,
                   json_only: frozenset[str] = frozenset()) -> PassTables:
    """The runs, per-role and brokers tables of job.compute, in two scans.

    What does not depend on another step runs beside it, from helper threads (PySpark
    pins each Python thread to its own JVM thread; Spark schedules the jobs side by
    side): the integer pass (which needs nothing of pass 1), then the summaries, from
    the start; the demand and message files' pyarrow reads on the driver meanwhile.  On
    2 cores one pass alone leaves a task slot idle through its serial parts (planning,
    code generation, a last long task, the collect and its conversion)."""
    coded = _coded(paths, json_only)
    # the coded runs' rest files by their codes (driver, pyarrow: make run's 46,893 rows):
    # hot_facts' interest and stores, and the broker.info rows the string passes then
    # leave to the driver (98 % of those files' rows)
    rests = {c.run: _rest_codes(c) for c in coded.values()}
    own_info = [c for c in coded.values() if rests[c.run].own_info]
    parsed = _read(spark, paths, coded, json_only, [c.key for c in own_info])
    cached: list[DataFrame] = []
    if any(p not in coded and (p in json_only or job.parquet_parts(p) is None)
           for p in paths):
        # JSON lines: decoded once for both passes, one corrupt-line verdict (job.compute)
        parsed = parsed.persist(job.cache_level(paths))
        cached.append(parsed)
    events = job.valid_events(parsed)
    if coded:
        # pass 1 needs only the defining events and wildcard destinations
        events = events.where(F.col("event_code").isNull() | _event_in(_DIM_EVENTS)
                              | (F.col("dst_code") < 0))

    step = _Steps(spark)
    with ThreadPoolExecutor(1, thread_name_prefix="treefed-pass") as helper, \
            ThreadPoolExecutor(1, thread_name_prefix="treefed-messages") as reader:
        # the coded runs' message rows, read on the driver by pyarrow (no Spark job)
        messages = reader.submit(_message_codes, coded)
        by_consumer = hot = by_consumer_parts = None
        if coded:
            # its own session: the ~1 MB read splits (_split_session) for its scans only
            split = _split_session(spark)
            every = _parts(split, paths, coded)

            # needs nothing of pass 1 (its interest and stores come from the codes): from
            # the start, beside pass 1 (mostly the JVM's warm-up: planning and generating
            # code on one thread)
            def integer_pass() -> tuple:
                code_interest, stores, store_codes = _code_tables(split, coded, rests,
                                                                  messages.result())
                return (hot_facts(every, code_interest, stores, _narrow(coded)).toArrow(),
                        store_codes)

            hot = helper.submit(_in_pool, spark, integer_pass)
            by_consumer = reader.submit(_demand_counts, coded)
            old_parts = _demand_parts(split, coded, paths)
            if old_parts is not None:     # runs coded before the demand file
                by_consumer_parts = helper.submit(_in_pool, spark,
                                                  consumer_facts(old_parts).toArrow)
        summaries = helper.submit(
            lambda: [r.asDict() for r in job.read_summaries(spark, paths).collect()])
        dims = dimensions(events).persist(StorageLevel.MEMORY_AND_DISK)
        cached.append(dims)
        # Arrow, not collect(): Row objects cost ~2 s of the driver's Python for make
        # run's dimension rows (the same values: strings, longs, nulls)
        dim_rows = dims.toArrow().to_pylist()
        step(f"pass 1 (dimensions, {len(dim_rows):,} rows; the integer pass, consumer "
             "facts and summaries beside it)")
        info = {r["run"]: r for r in dim_rows if r["kind"] == "start"}
        roles = {(r["run"], r["broker"]): r for r in dim_rows if r["kind"] == "info"}
        driver_roles = _info_rows(coded, rests)
        roles.update(driver_roles)
        tree_runs = sorted(run for run, r in info.items()
                           if r["mode"] is not None and r["mode"].lower().startswith("tree"))
        found = messages.result()
        with_patterns = {r["run"] for r in dim_rows if r["pattern_re"] is not None}
        covered = _interest(dim_rows, _named_sends(coded, found, with_patterns))
        interest = dims.where(F.col("kind") == "send").select("run", "broker", "dst")
        extra = [(run, b, d) for run, pairs in covered.items() for b, d in sorted(pairs)]
        if extra:
            interest = interest.unionByName(
                spark.createDataFrame(extra, "run string, broker string, dst string"))
        role_frame = dims.where(F.col("kind") == "info").select("run", "broker", "role")
        # the string pass joins roles only for rows with a wildcard destination: the
        # driver's of the runs with one
        wanted = [(r["run"], r["broker"], r["role"]) for r in driver_roles.values()
                  if r["run"] in with_patterns]
        if wanted:
            role_frame = role_frame.unionByName(
                spark.createDataFrame(wanted, "run string, broker string, role string"))

        table = facts(parsed, interest, role_frame, tree_runs).toArrow()
        uncoded = sum(p not in coded for p in paths)
        strings = sum(c.rest_rows for c in coded.values()) - sum(
            sum(rests[c.run].counts.values()) for c in own_info)
        step(f"pass 2 by strings ({table.num_rows:,} fact rows from {strings:,} coded "
             "rest rows"
             + (f" and {uncoded} runs without codes" if uncoded else "") + ")"
             + ("; the integer pass beside it" if coded else ""))

        def coded_rows() -> Iterator[tuple]:
            # the message rows and the consumer facts (on the driver), then the integer
            # pass's rows as they come (_assemble's sums and sets do not depend on the
            # rows' order)
            if hot is None or by_consumer is None:
                return
            yield from _info_facts(coded, rests)
            yield from _message_rows(found, coded, tree_runs)
            consumer_table = by_consumer.result()
            yield from _consumer_rows(consumer_table, coded)
            hot_table, store_codes = hot.result()
            step(f"pass 2 by codes ({hot_table.num_rows:,} + {consumer_table.num_rows:,} "
                 "rows), after the string pass's, message and consumer rows were counted")
            yield from _hot_rows(hot_table, coded, store_codes)
            if by_consumer_parts is not None:
                yield from _consumer_rows(by_consumer_parts.result(), coded)

        out = _assemble(spark, itertools.chain(_fact_rows(table), coded_rows()), info,
                        roles, summaries.result(), cached)
    step("assembly and the runs frame")
    return out


def _in_pool(spark: SparkSession, action):
    """``action()`` with this thread's Spark jobs in the integer pass's scheduler pool
    (job._session: FAIR with the main thread's jobs in a local session)."""
    spark.sparkContext.setLocalProperty("spark.scheduler.pool", job.CODES_POOL)
    try:
        return action()
    finally:
        spark.sparkContext.setLocalProperty("spark.scheduler.pool", None)


#: Read splits of the coded parts' scans (``_split_session``): a coded advisory row is
#: ~1.4 bytes of Parquet, so Spark's default packing (128 MB, 4 MB per file opened) put
#: make run's 15.9 M rows in 3 tasks, two of them with 14.4 M rows: one core did most of it.
_CODED_SPLIT_BYTES = 1 << 20
_CODED_OPEN_BYTES = 1 << 18


def _split_session(spark: SparkSession) -> SparkSession:
    """A session of the same SparkContext and SQL settings whose file scans split the
    coded parts in ~1 MB pieces (row groups), unless the Spark configuration (``--conf``)
    sets either split size.  Its own session, so a scan the string pass plans meanwhile
    keeps the default splits (87 rest-file tasks cost +2 s CPU of per-task overhead)."""
    split = spark.newSession()
    for k, v in spark.conf.getAll.items():
        if k.startswith("spark.sql.") and split.conf.isModifiable(k) \
                and split.conf.get(k, None) != v:
            split.conf.set(k, v)
    conf = spark.sparkContext.getConf()
    keys = {"spark.sql.files.maxPartitionBytes": _CODED_SPLIT_BYTES,
            "spark.sql.files.openCostInBytes": _CODED_OPEN_BYTES}
    if not any(conf.contains(k) for k in keys):
        for k, v in keys.items():
            split.conf.set(k, str(v))
    return split


class _Steps:
    """With TREEFED_REPORT_STEPS set: each step's wall and driver JVM CPU seconds on
    stderr (where the job's time goes; bench/spark_rows.py)."""

    def __init__(self, spark: SparkSession) -> None:
        self.on = bool(os.environ.get("TREEFED_REPORT_STEPS"))
        self.spark = spark
        self.last = (time.perf_counter(), job._jvm_cpu_s(spark) if self.on else None)

    def __call__(self, name: str) -> None:
        if not self.on:
            return
        now = (time.perf_counter(), job._jvm_cpu_s(self.spark))
        cpu = "" if None in (now[1], self.last[1]) else f", JVM CPU {now[1] - self.last[1]:.1f} s"
        print(f"treefed report: step {name}: {now[0] - self.last[0]:.1f} s{cpu}",
              file=sys.stderr, flush=True)
        self.last = now


def _fact_rows(table) -> Iterator[tuple]:
    """facts' rows (tag, run, broker, a, b, ts, code, n), a batch at a time."""
    for batch in table.to_batches(max_chunksize=65536):
        cols = [batch.column(n).to_pylist()
                for n in ("tag", "run", "broker", "a", "b", "ts", "code", "n")]
        yield from zip(*cols)


def _hot_rows(table, coded: dict[str, RunCodes],
              stores: set[tuple[int, int]]) -> Iterator[tuple]:
    """hot_facts' rows as facts' rows: a P row each, and the event's own fact as facts
    makes it (T per demand.created / demand.removed time, S per advisory.sent time, L per
    link event time, A per consumer.added).  The P code's count bits (facts' ``counts``,
    from bit 3 up) come from the event code, ``useful``, ``from_store`` and whether the
    broker is a store (worked out once per distinct combination: a few)."""
    from treefed.scenario.parquet_parts import EVENT_CODES

    sent, received, created, removed, stranded, added, up, down, delivered = (
        EVENT_CODES.index(e) for e in (
            "advisory.sent", "advisory.received", "demand.created", "demand.removed",
            "message.stranded", "consumer.added", "link.up", "link.down",
            "message.delivered"))
    by_key = {c.key: c for c in coded.values()}
    bits: dict[tuple, int] = {}
    cols = [table.column(n).to_pylist() for n in (
        "run_key", "broker_code", "event_code", "ts", "consumer_code", "useful",
        "from_store", "count")]
    for key, broker_code, event_code, ts, consumer, useful, from_store, n in zip(*cols):
        c = by_key[key]
        at_store = (key, broker_code) in stores
        shape = (event_code, useful, from_store, at_store)
        code = bits.get(shape)
        event = event_code >> 1
        if code is None:
            add = not event_code & 1
            is_received = add and event == received
            spilled = is_received and not useful
            code = bits[shape] = (
                (1 << 3 if add and event == sent else 0)
                | (1 << 4 if is_received else 0)
                | (1 << 5 if spilled else 0)
                | (1 << 6 if spilled and at_store and from_store else 0)
                | (1 << 7 if spilled and at_store and not from_store else 0)
                | (1 << 8 if event == created else 0)
                | (1 << 9 if event == created and not useful else 0)
                | (1 << 10 if event == delivered else 0)
                | (1 << 11 if event == stranded else 0))
        broker = c.brokers[broker_code]
        yield ("P", c.run, broker, None, None, None, code, n)
        if event == created:      # +n held at the broker at ts
            yield ("T", c.run, broker, None, None, ts, 0, n)
        elif event == removed:
            yield ("T", c.run, broker, None, None, ts, 0, -n)
        elif event == sent:
            yield ("S", c.run, None, None, None, ts, 0, n)
        elif event == up or event == down:
            yield ("L", c.run, None, EVENT_CODES[event], None, ts, 0, n)
        elif event == added:      # facts' qualified consumer id
            name = None if consumer is None else c.consumers[consumer]
            if name is None:
                name = broker
            elif not name.startswith(broker + "/"):
                name = broker + "/" + name
            yield ("A", c.run, None, name, None, ts, 0, n)


@dataclass
class _RunMessages:
    """One run's MESSAGE_FILE rows, by codes: what facts makes of the message rows
    (besides their P counts, which hot_facts counts with the other hot rows)."""

    sends: pa.Table    # (broker_code, dst_code) produced or forwarded to, distinct
    copies: list[tuple]           # facts' M rows
    forwards: pa.Table            # (broker_code, peer_code, msg_code, n): F rows in a tree run


def _copy_key(msg: str | None, dst: str | None, broker: str, consumer: str | None) -> str:
    """facts' ``copy`` of a delivery: concat_ws over msg, dst and, for a topic, the
    subscriber (the broker + "/" + the consumer id's last segment; nulls skipped)."""
    if dst is not None and (dst.startswith("topic://") or dst.startswith("temp-topic://")):
        subscriber = broker if consumer is None else broker + "/" + consumer.rsplit("/", 1)[-1]
        parts: tuple = (msg, dst, subscriber)
    else:
        parts = (msg, dst)
    return "\x00".join(p for p in parts if p is not None)


def _run_messages(c: RunCodes) -> _RunMessages:
    """A run's MESSAGE_FILE read on the driver (pyarrow: a few thousand rows per run, each
    a message's send, forward or delivery): the send pairs, facts' M rows (the copy key
    made as facts makes it, merged by facts' key), the forwards grouped by code."""
    import pyarrow.compute as pc

    from treefed.scenario.parquet_parts import EVENT_CODES

    table = pq.read_table(c.messages, columns=[
        "event_code", "broker_code", "dst_code", "msg_code", "peer_code", "consumer_code"])
    event = pc.shift_right(table.column("event_code"), 1)
    count = [("event_code", "count", pc.CountOptions(mode="all"))]
    sent = table.filter(pc.and_(
        pc.is_in(event, pa.array([EVENT_CODES.index("message.produced"),
                                  EVENT_CODES.index("message.forwarded")], pa.int32())),
        pc.is_valid(table.column("dst_code"))))
    sends = sent.group_by(["broker_code", "dst_code"]).aggregate([])
    delivered = (table.filter(pc.equal(event, EVENT_CODES.index("message.delivered")))
                 .group_by(["broker_code", "msg_code", "dst_code", "consumer_code"])
                 .aggregate(count))
    dst_names = {code: name for name, code in c.dsts.items() if code >= 0}
    merged: dict[tuple, int] = defaultdict(int)
    brokers, msgs, consumers = c.brokers, c.msgs, c.consumers
    for b, m, d, k, n in zip(*(delivered.column(n).to_pylist() for n in (
            "broker_code", "msg_code", "dst_code", "consumer_code", "event_code_count"))):
        broker = brokers[b]
        msg = None if m is None else msgs[m]
        merged[(broker, _copy_key(msg, None if d is None else dst_names[d], broker,
                                  None if k is None else consumers[k]), msg)] += n
    copies = [("M", c.run, broker, copy, msg, None, 0, n)
              for (broker, copy, msg), n in merged.items()]
    forwards = (table.filter(pc.equal(event, EVENT_CODES.index("message.forwarded")))
                .group_by(["broker_code", "peer_code", "msg_code"]).aggregate(count))
    return _RunMessages(sends=sends, copies=copies, forwards=forwards)


def _message_codes(coded: dict[str, RunCodes]) -> dict[str, _RunMessages]:
    """``_run_messages`` of each coded run with a MESSAGE_FILE, by run id."""
    return {c.run: _run_messages(c) for c in coded.values() if c.messages is not None}


def _message_rows(messages: dict[str, _RunMessages], coded: dict[str, RunCodes],
                  tree_runs: list[str]) -> Iterator[tuple]:
    """facts' M rows of the runs read from MESSAGE_FILEs, and their F rows in the tree
    runs (broker, peer, msg; facts keeps the forwards of tree-mode runs only)."""
    by_run = {c.run: c for c in coded.values()}
    tree = set(tree_runs)
    for run, found in messages.items():
        yield from found.copies
        if run not in tree:
            continue
        brokers, msgs = by_run[run].brokers, by_run[run].msgs
        f = found.forwards
        for b, p, m, n in zip(*(f.column(n).to_pylist() for n in (
                "broker_code", "peer_code", "msg_code", "event_code_count"))):
            yield ("F", run, brokers[b], None if p is None else brokers[p],
                   None if m is None else msgs[m], None, 0, n)


def _consumer_rows(table, coded: dict[str, RunCodes]) -> Iterator[tuple]:
    """consumer_facts' rows as facts' C rows."""
    by_key = {c.key: c for c in coded.values()}
    cols = [table.column(n).to_pylist() for n in ("run_key", "consumer_code", "ts", "count")]
    for key, consumer, ts, n in zip(*cols):
        c = by_key[key]
        yield ("C", c.run, None, None if consumer is None else c.consumers[consumer], None,
               ts, 0, n)


def _assemble(spark: SparkSession, rows: Iterable[tuple], info: dict, roles: dict,
              summaries: list[dict], cached: list[DataFrame]) -> PassTables:
    lines: dict[str, list[int]] = {}
    brokers: dict[tuple[str, str], dict] = {}
    held: dict[tuple[str, str], dict[float, int]] = defaultdict(lambda: defaultdict(int))
    demand_ts: dict[str, set[float]] = defaultdict(set)
    demanded: dict[tuple[str, str], set[float]] = defaultdict(set)
    sent: dict[str, dict[float, int]] = defaultdict(lambda: defaultdict(int))
    copies: dict[str, set[str]] = defaultdict(set)
    delivered_at: dict[str, set[tuple[str, str]]] = defaultdict(set)
    forwards: dict[str, list[tuple]] = defaultdict(list)
    adds: dict[tuple[str, str], list[float]] = defaultdict(list)
    links: dict[str, list[tuple[str, float]]] = defaultdict(list)
    names = ("bad_lines", "finished") + _COUNTS     # the code's bits, from 1 up
    counted_by: dict[int, list[str]] = {}
    for tag, run, broker, a, b, ts, code, n in rows:
        if tag == "P":
            total = lines.get(run)
            if total is None:
                total = lines[run] = [0, 0, 0]
            total[0] += n
            if code & 6:
                if code & 2:
                    total[1] += n
                if code & 4:
                    total[2] += n
            if broker is not None:
                m = brokers.get((run, broker))
                if m is None:
                    m = brokers[(run, broker)] = dict.fromkeys(_COUNTS, 0)
                counted = counted_by.get(code)
                if counted is None:     # the counts a code's bits name (a few codes)
                    counted = counted_by[code] = [
                        name for k, name in enumerate(names[2:], start=3) if code & (1 << k)]
                for name in counted:
                    m[name] += n
        elif tag == "T":
            held[(run, broker)][ts] += n
            if ts is not None:
                demand_ts[run].add(ts)
        elif tag == "C":
            if a is not None and ts is not None:
                demanded[(run, a)].add(ts)
        elif tag == "S":
            if ts is not None:
                sent[run][ts] += n
        elif tag == "M":
            copies[run].add(a)
            if b is not None:
                delivered_at[run].add((broker, b))
        elif tag == "F":
            forwards[run].append((broker, a, b, n))
        elif tag == "A":
            if n == 1:
                adds[(run, a)].append(ts)
            else:
                adds[(run, a)].extend([ts] * n)
        elif tag == "L":
            if ts is not None:
                links[run].append((a, ts))

    # per broker: max_demand = peak of the running sum of net changes in ts order
    for key, changes in held.items():
        running, peak = 0, None
        for ts in sorted(changes, key=lambda t: (t is not None, t or 0.0)):
            running += changes[ts]
            peak = running if peak is None else max(peak, running)
        if key in brokers:
            brokers[key]["max_demand"] = max(peak, 0)
    for metrics in brokers.values():
        metrics.setdefault("max_demand", 0)

    faults: dict[str, list[float]] = {}
    for run, rows in links.items():
        downs = [ts for event, ts in rows if event == "link.down"]
        if downs:
            first = min(downs)
            faults[run] = sorted({ts for event, ts in rows
                                  if event == "link.down" or ts > first})

    per_run: dict[str, dict] = defaultdict(dict)
    # brokers rollup
    for (run, _), m in brokers.items():
        roll = per_run[run]
        roll["brokers_logged"] = roll.get("brokers_logged", 0) + 1
        for c in ("advisory_frames", "advisory_receipts", "spilled_advisories",
                  "demand_created", "wasted_demand", "sibling_spill", "downward_spill"):
            roll[c] = roll.get(c, 0) + m[c]
        roll["max_demand_per_broker"] = max(roll.get("max_demand_per_broker", 0),
                                            m["max_demand"])
        if m["deliveries"] or m["stranded"]:   # a run job.delivery_metrics has a row for
            roll["deliveries"] = roll.get("deliveries", 0) + m["deliveries"]
    # deliveries, stranded (job.delivery_metrics, stranded_where)
    for run, roll in per_run.items():
        if "deliveries" in roll:
            roll["delivered_log"] = len(copies.get(run, ()))
            roll["duplicates"] = roll["deliveries"] - roll["delivered_log"]
    stranded_by_run: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for (run, broker), m in brokers.items():
        if m["stranded"]:
            stranded_by_run[run].append((broker, m["stranded"]))
    for run, held_at in stranded_by_run.items():
        ordered = sorted(held_at, key=lambda x: (-x[1], x[0]))
        shown = ", ".join(f"{b}: {n}" for b, n in ordered[:job.STRANDED_BROKERS_SHOWN])
        more = len(ordered) - job.STRANDED_BROKERS_SHOWN
        per_run[run]["stranded_at"] = (shown + f", +{more} more brokers") if more > 0 \
            else shown
        per_run[run]["stranded_log"] = sum(n for _, n in held_at)
    # convergence: each consumer's first add to its last demand created before its next
    # add or the next fault event
    firsts: dict[str, list[float]] = defaultdict(list)
    consumers: dict[str, int] = defaultdict(int)
    for (run, consumer), times in adds.items():
        times.sort(key=lambda t: (t is not None, t or 0.0))
        consumers[run] += 1
        start = times[0]
        if start is None:      # no time: no window (Spark: null seconds)
            continue
        until = times[1] if len(times) > 1 else None
        run_faults = faults.get(run, ())
        k = bisect_left(run_faults, start)
        while k < len(run_faults) and run_faults[k] <= start:
            k += 1
        cut = run_faults[k] if k < len(run_faults) else None
        if cut is not None:
            until = cut if until is None else min(until, cut)
        last = _window_max(sorted(demanded.get((run, consumer), ())), start, until)
        if last is not None:
            firsts[run].append(last - start)
    for run, n in consumers.items():
        per_run[run]["consumers"] = n
        values = firsts.get(run, [])
        per_run[run]["c50"], per_run[run]["c99"] = spark_percentiles(values, (0.5, 0.99))
    # recovery and recovery frames per fault event
    for run, times in faults.items():
        changes = sorted(demand_ts.get(run, ()))
        sent_at = sorted(sent.get(run, {}).items())
        sent_times = [t for t, _ in sent_at]
        rec, frames = [], []
        for k, start in enumerate(times):
            until = times[k + 1] if k + 1 < len(times) else None
            last = _window_max(changes, start, until)
            rec.append((start, None if last is None else last - start))
            lo = bisect_left(sent_times, start)
            hi = len(sent_times) if until is None else bisect_left(sent_times, until)
            frames.append((start, sum(n for _, n in sent_at[lo:hi])))
        per_run[run]["rec_list"] = rec
        per_run[run]["frames_list"] = frames
        per_run[run]["recovery_frames"] = sum(n for _, n in frames)
    # variants: root demand, extra hops in tree-mode runs
    parent = {key: r["parent"] for key, r in roles.items()}
    for (run, broker), r in roles.items():
        if r["parent"] is None and (run, broker) in brokers:
            m = brokers[(run, broker)]["max_demand"]
            per_run[run]["root_demand"] = max(per_run[run].get("root_demand", m), m)
    for run, r in info.items():
        if r["mode"] is None or not r["mode"].lower().startswith("tree"):
            continue
        under: set[tuple[str, str]] = set()
        for broker, msg in delivered_at.get(run, ()):
            seen, node = set(), broker
            if (run, broker) not in parent:
                continue
            while node is not None and node not in seen:
                seen.add(node)
                under.add((msg, node))
                node = parent.get((run, node))
        per_run[run]["extra_hops"] = sum(
            n for broker, peer, msg, n in forwards.get(run, ())
            if peer is not None and parent.get((run, peer)) == broker
            and (msg is None or (msg, peer) not in under))

    # the runs frame's Spark job (~0.6 s for make run, mostly waiting) beside the role rows'
    # and the brokers table's Python (~0.3 s): neither reads what the other writes
    with ThreadPoolExecutor(1, thread_name_prefix="treefed-runs") as helper:
        runs_done = helper.submit(_runs_rows, spark, lines, summaries, info, per_run)
        role_rows = _role_rows(brokers, roles, info)
        # Arrow columns, not Python rows: make run's 46,116 brokers took ~1 s of the
        # driver's Python to verify and pickle one row at a time
        keys = list(brokers)
        metrics = list(brokers.values())
        columns = [pa.array([run for run, _ in keys], pa.string()),
                   pa.array([broker for _, broker in keys], pa.string())]
        columns += [pa.array([m[c] for m in metrics], pa.int64())
                    for c in BROKER_COLUMNS[2:]]
        broker_table = pa.Table.from_arrays(columns, names=list(BROKER_COLUMNS))
        runs, runs_schema = runs_done.result()
    return PassTables(runs=runs, runs_schema=runs_schema, per_role=role_rows,
                      brokers=broker_table, cached=tuple(cached))


_REC = T.ArrayType(T.StructType([T.StructField("fault_ts", T.DoubleType()),
                                 T.StructField("d", T.DoubleType())]))
_FRAMES = T.ArrayType(T.StructType([T.StructField("fault_ts", T.DoubleType()),
                                    T.StructField("frames", T.LongType())]))

#: The per-run frame handed to job.finish_runs: name -> type.
_RUN_INPUT = (
    [("run", T.StringType()), ("scenario", T.StringType()), ("mode", T.StringType()),
     ("engine", T.StringType()), ("brokers", T.LongType()), ("links", T.LongType()),
     ("regions", T.LongType()), ("stores_per_region", T.LongType()),
     ("depth", T.LongType()), ("network_ttl", T.LongType())]
    + [("s_" + f.name, f.dataType) for f in job._SUMMARY_SCHEMA.fields]
    + [(c, T.LongType()) for c in (
        "lines", "bad_lines", "finished", "brokers_logged", "advisory_frames",
        "advisory_receipts", "spilled_advisories", "demand_created", "wasted_demand",
        "sibling_spill", "downward_spill", "max_demand_per_broker", "delivered_log",
        "deliveries", "duplicates", "stranded_log", "consumers")]
    + [("c50", T.DoubleType()), ("c99", T.DoubleType()), ("stranded_at", T.StringType()),
       ("rec_list", _REC), ("frames_list", _FRAMES), ("root_demand", T.LongType()),
       ("extra_hops", T.LongType()), ("recovery_frames", T.LongType())])


def _runs_rows(spark: SparkSession, lines: dict, summaries: list[dict], info: dict,
               per_run: dict) -> tuple[list[dict], T.StructType]:
    by_summary = {s["run"]: s for s in summaries}
    everyone = sorted(set(lines) | set(by_summary))
    tree = {run for run, r in info.items()
            if r["mode"] is not None and r["mode"].lower().startswith("tree")}
    rows = []
    for run in everyone:
        i = info.get(run, {})
        s = by_summary.get(run, {})
        m = per_run.get(run, {})
        counted = lines.get(run)
        values = {"run": run, **{c: i.get(c) for c in (
            "scenario", "mode", "engine", "brokers", "links", "regions",
            "stores_per_region", "depth", "network_ttl")}}
        values.update({"s_" + f.name: s.get(f.name) for f in job._SUMMARY_SCHEMA.fields})
        if counted is not None:
            values.update(lines=counted[0], bad_lines=counted[1], finished=counted[2])
        values.update(m)
        if run in tree and "extra_hops" not in m:
            values["extra_hops"] = 0
        if run not in info:   # variants are computed for the runs with run.started only
            for c in ("root_demand", "extra_hops", "recovery_frames", "frames_list"):
                values[c] = None
        rows.append(tuple(values.get(name) for name, _ in _RUN_INPUT))
    schema = T.StructType([T.StructField(n, t) for n, t in _RUN_INPUT])
    frame = spark.createDataFrame(rows, schema)
    rec = F.transform("rec_list", lambda x: F.struct(
        x["fault_ts"].alias("fault_ts"),
        F.coalesce(F.round(x["d"], 6), F.lit(0.0)).alias("s")))
    frame = (frame
             .withColumn("convergence_median_s", F.round("c50", 6))
             .withColumn("convergence_p99_s", F.round("c99", 6))
             .withColumn("fault_events", F.size("rec_list"))
             .withColumn("fault_events", F.when(F.col("rec_list").isNotNull(),
                                                F.col("fault_events").cast("long")))
             .withColumn("recovery_max_s", F.array_max(F.transform(rec, lambda x: x["s"])))
             .withColumn("recovery", F.when(F.col("rec_list").isNotNull(),
                                            job.recovery_text(rec)))
             .withColumn("recovery_frames_by_event", F.when(
                 F.col("frames_list").isNotNull(),
                 _frames_text(F.col("frames_list")))))
    from treefed.analysis.variants import VARIANT_COLUMNS

    out = job.finish_runs(frame, extra=VARIANT_COLUMNS, ordered=False).select(*job.RUN_COLUMNS)
    # job.RUNS_ORDER on the driver: Spark's sort of these ~100 rows was two more jobs
    # (the range partitioner's sample, a shuffle) on the job's serial tail
    return sorted((r.asDict() for r in out.collect()), key=_runs_order), out.schema


def _runs_order(row: dict) -> tuple:
    """job.RUNS_ORDER as Spark sorts it: ascending, nulls first; strings by code point
    (UTF-8 byte order), booleans false first.  ``run`` is unique: a total order."""
    return tuple((True, row["ttl"] is not None) if c == "ttl is not null"
                 else (row[c] is not None, row[c]) for c in job.RUNS_ORDER)


def _frames_text(listed: Column) -> Column:
    from treefed.analysis.variants import frames_text

    return frames_text(listed)


def _role_rows(brokers: dict, roles: dict, info: dict) -> list[dict]:
    groups: dict[tuple[str, str, str], dict] = {}
    summed = ("advisory_frames", "advisory_receipts", "spilled_advisories",
              "demand_created", "wasted_demand", "deliveries", "stranded", "sibling_spill",
              "downward_spill")
    tiers: dict[str, str] = {}      # the same broker names recur in every mode's run
    for (run, broker), m in brokers.items():
        role = roles.get((run, broker), {}).get("role") or "unknown"
        tier = tiers.get(broker)
        if tier is None:
            tier = tiers[broker] = site_tier(broker)
        key = (run, role, tier)
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"brokers": 0, **{c: 0 for c in summed},
                               "max_demand_per_broker": m["max_demand"]}
        g["brokers"] += 1
        for c in summed:
            g[c] += m[c]
        g["max_demand_per_broker"] = max(g["max_demand_per_broker"], m["max_demand"])
    rows = []
    for (run, role, tier), g in groups.items():
        i = info.get(run, {})
        rows.append({"run": run, "scenario": i.get("scenario"), "mode": i.get("mode"),
                     "ttl": i.get("ttl"), "stores_per_region": i.get("stores_per_region"),
                     "role": role, "tier": tier, **g})
    rows.sort(key=lambda r: (r["run"], r["tier"], r["role"]))
    return [{c: r[c] for c in job.ROLE_COLUMNS} for r in rows]
