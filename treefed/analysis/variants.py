"""The report's figures for the tree variants against the plain tree (issue 18).

Per run, from its event log (Spark, like job.py):

* ``root_demand`` -- the most demand subscriptions the root broker (HQ: the broker
  whose latest ``broker.info`` names no parent) held at once: its interest entries.
  Summarisation (``tree-summary``) replaces a region's precise entries by a few
  aggregate entries and ownership covers, so this is where it shows.
* ``extra_hops`` -- forwards from a broker down to one of its children
  (``message.forwarded`` whose ``peer`` names the sender as its parent) of a message
  no broker in that child's subtree delivered: a message sent down a subtree that had
  no consumer for it (bench/tree_summary.py's count).  What summarisation costs: a
  store queue nobody consumes now waits at its region, one hop down.  Computed for
  runs whose mode starts with ``tree`` only (the figure is about the tree variants,
  and message forwards are the log's largest part).
* ``recovery_frames`` / ``recovery_frames_by_event`` -- the advisory frames
  (``advisory.sent``) sent from each fault event (job.fault_events) to the next (the
  last one: to the end of the run), in total and per event ("10.000 s: 12, 20.000 s:
  3").  Delta resync (``tree-resync``) re-sends only the difference after a link comes
  back within its grace, so this is where it shows.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

__all__ = ["VARIANT_COLUMNS", "root_demand", "extra_hops", "recovery_frames",
           "frames_text", "variant_metrics"]

#: The run columns this module adds (job.RUN_COLUMNS ends with them).
VARIANT_COLUMNS = ("root_demand", "extra_hops", "recovery_frames", "recovery_frames_by_event")


def root_demand(brokers: DataFrame, roles: DataFrame) -> DataFrame:
    """(run, root_demand): ``max_demand`` of job.broker_metrics at the parentless
    broker(s) of job.broker_roles."""
    root = roles.where(F.col("parent").isNull()).select("run", "broker")
    return (brokers.join(root, ["run", "broker"])
            .groupBy("run").agg(F.max("max_demand").alias("root_demand")))


def _ancestors(spark: SparkSession, roles: DataFrame) -> DataFrame:
    """(run, broker, above): every broker and each of its ancestors, itself included.
    The parent table is one row per broker (4,005 at 4 x 1,000), so it is walked on the
    driver."""
    parent: dict[tuple[str, str], str | None] = {
        (r["run"], r["broker"]): r["parent"]
        for r in roles.select("run", "broker", "parent").collect()}
    rows = []
    for (run, broker) in parent:
        seen, node = set(), broker
        while node is not None and node not in seen:
            seen.add(node)
            rows.append((run, broker, node))
            node = parent.get((run, node))
    return spark.createDataFrame(rows, "run string, broker string, above string")


def extra_hops(events: DataFrame, roles: DataFrame, runs: DataFrame) -> DataFrame:
    """(run, extra_hops) for the ``runs`` given (a frame with a ``run`` column)."""
    spark = events.sparkSession
    tree_events = events.join(runs.select("run"), "run")
    parents = roles.select("run", F.col("broker").alias("peer"),
                           F.col("parent").alias("broker"))
    down = (tree_events.where(F.col("event") == "message.forwarded")
            .select("run", "broker", "peer", "msg")
            .join(parents, ["run", "broker", "peer"]))
    delivered_under = (tree_events.where(F.col("event") == "message.delivered")
                       .select("run", "broker", "msg")
                       .join(_ancestors(spark, roles), ["run", "broker"])
                       .select("run", "msg", F.col("above").alias("peer")).distinct())
    wasted = down.join(delivered_under, ["run", "msg", "peer"], "left_anti")
    counted = wasted.groupBy("run").agg(F.count(F.lit(1)).alias("extra_hops"))
    return (runs.select("run").join(counted, "run", "left")
            .na.fill(0, ["extra_hops"]))


def recovery_frames(events: DataFrame, faults: DataFrame) -> DataFrame:
    """(run, recovery_frames, recovery_frames_by_event) for runs with fault events."""
    nxt = Window.partitionBy("run").orderBy("fault_ts")
    spans = faults.select("run", "fault_ts").withColumn(
        "until", F.lead("fault_ts").over(nxt))
    sent = (events.where(F.col("event") == "advisory.sent")
            .select("run", F.col("ts").alias("sent_ts")))
    inside = ((F.col("sent_ts") >= F.col("fault_ts"))
              & (F.col("until").isNull() | (F.col("sent_ts") < F.col("until"))))
    per = (spans.join(sent, "run", "left").groupBy("run", "fault_ts")
           .agg(F.count(F.when(inside, 1)).alias("frames")))
    listed = F.sort_array(F.collect_list(F.struct("fault_ts", "frames")))
    return per.groupBy("run").agg(F.sum("frames").alias("recovery_frames"),
                                  frames_text(listed).alias("recovery_frames_by_event"))


def frames_text(listed: Column) -> Column:
    """"10.000 s: 12, 20.000 s: 3" from an array of (fault_ts, frames) structs in order
    (also used by passes.py)."""
    return F.array_join(F.transform(listed, lambda x: F.concat(
        F.format_number(x["fault_ts"], 3), F.lit(" s: "), x["frames"].cast("string"))),
        ", ")


def variant_metrics(events: DataFrame, brokers: DataFrame, roles: DataFrame,
                    info: DataFrame, faults: DataFrame) -> DataFrame:
    """(run, *VARIANT_COLUMNS) for every run of ``info``; extra_hops null outside the
    tree modes, the recovery frames null in a run without fault events."""
    tree_runs = info.where(F.lower(F.col("mode")).startswith("tree")).select("run")
    out = info.select("run")
    for part in (root_demand(brokers, roles), extra_hops(events, roles, tree_runs),
                 recovery_frames(events, faults)):
        out = out.join(part, "run", "left")
    return out.select("run", *VARIANT_COLUMNS)
