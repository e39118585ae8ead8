"""The propagation model on Spark: one join per hop, counts instead of consumers.

Theory of operation
-------------------
The estate is folded into cells (``cells.py``) and loaded as three small tables: link
ends (``qends``), consumer groups per origin cell, and per (connector settings, group)
the filter verdicts.  A *frontier* row is one route of one group's interest:
``(gid, cell, trail, rank, m, src)`` -- the cell it has reached, the cells passed
(origin first, this cell last), its FIFO rank (the emission position at every hop; the
replay order, which decides which duplicate is kept), and ``m``, the number of concrete
instances it stands for (origin member x reached member pairs).  Each hop is one join of
the frontier with the ends of its cell, then the rules of ``exact.py`` as column
expressions:

* offer: routes (``ROUTES`` by the lane it came from), dynamic includes, and on a duplex
  mesh link the sender's ttl / loop checks -- a loop part is ``m`` instances (the
  origin member itself, or every instance when a single broker is on the trail);
* accept: ttl, loop, permission, the tree's ``tree_rule`` / ``malformed`` / ``loop``;
* duplicate suppression: per (group, cell) the lowest rank wins, and anything arriving
  after a kept instance is a ``duplicate``;
* demand: ``m x count`` non-conduit demands, or conduit keys (cell, end, destination)
  counted once each when the hops are done.

Per-hop figures are aggregated per cell and collected (a few rows per cell), then spread
over the members (``per_broker``): by symmetry every member of a cell has the same
figures, and ``fold`` made sure they are integers.  Nothing ever has a row per consumer
or per concrete broker pair, so an estate of 100,000 stores in 10 regions at TTL 2 is
a few dozen rows per hop.

Only Spark SQL column expressions, no Python UDFs: a cluster's executors need nothing
of treefed.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from treefed.model.cells import ROUTES, Folded, group_flags
from treefed.model.exact import Counts, Estate, Group, NotModelled

__all__ = ["propagate_spark", "per_broker"]

_QEND = T.StructType([
    T.StructField("qid", T.IntegerType()), T.StructField("qcell", T.IntegerType()),
    T.StructField("peer_cell", T.IntegerType()), T.StructField("peer_qend", T.IntegerType()),
    T.StructField("lane", T.StringType()), T.StructField("kind", T.StringType()),
    T.StructField("pos", T.LongType()), T.StructField("advertises", T.BooleanType()),
    T.StructField("accepts", T.BooleanType()), T.StructField("forwards", T.BooleanType()),
    T.StructField("duplex", T.BooleanType()), T.StructField("ttl", T.IntegerType()),
    T.StructField("sid", T.IntegerType()), T.StructField("fan", T.LongType()),
    T.StructField("conduit_subs", T.BooleanType()), T.StructField("decrease", T.BooleanType()),
    T.StructField("peer_lane", T.StringType()), T.StructField("peer_size", T.LongType()),
    T.StructField("peer_accepts", T.BooleanType()),
    T.StructField("peer_anc", T.ArrayType(T.IntegerType())),
    T.StructField("peer_desc", T.ArrayType(T.IntegerType())),
    T.StructField("peer_leaf", T.BooleanType()), T.StructField("peer_fan", T.LongType()),
    T.StructField("peer_forwards", T.BooleanType()),
])
_GROUP = T.StructType([
    T.StructField("gid", T.IntegerType()), T.StructField("origin", T.IntegerType()),
    T.StructField("k", T.LongType()), T.StructField("templated", T.BooleanType()),
    T.StructField("dst", T.StringType()), T.StructField("origin_size", T.LongType()),
])
_FLAGS = T.StructType([
    T.StructField("fsid", T.IntegerType()), T.StructField("fgid", T.IntegerType()),
    T.StructField("skip", T.BooleanType()), T.StructField("permit", T.StringType()),
    T.StructField("static", T.BooleanType()), T.StructField("suppress", T.BooleanType()),
    T.StructField("topic", T.BooleanType()),
    T.StructField("skip_self", T.BooleanType()), T.StructField("permit_self", T.StringType()),
    T.StructField("static_self", T.BooleanType()), T.StructField("split", T.BooleanType()),
])


def _tables(spark: SparkSession, folded: Folded) -> tuple[DataFrame, DataFrame, DataFrame]:
    cells = folded.cells
    qrows = []
    q_by_id = {q.id: q for q in folded.qends}
    for q in folded.qends:
        s = folded.settings[q.sid]
        peer = cells[q.peer_cell]
        back = q_by_id[q.peer_qend]
        qrows.append((q.id, q.cell, q.peer_cell, q.peer_qend, q.lane, q.kind, q.pos,
                      q.advertises, q.accepts, q.forwards, q.duplex, q.ttl, q.sid,
                      q.fan, s.conduit_subscriptions, s.decrease_network_consumer_priority,
                      back.lane, len(peer.members), back.accepts, list(peer.ancestors),
                      list(peer.descendants), peer.leaf, back.fan, back.forwards))
    grows = [(g.id, g.origin, g.count, g.templated, g.template,
              len(cells[g.origin].members)) for g in folded.groups]
    frows = list(group_flags(folded))
    return (spark.createDataFrame(qrows, _QEND), spark.createDataFrame(grows, _GROUP),
            spark.createDataFrame(frows, _FLAGS))


def _lane_allowed(src_lane, lane):
    cond = F.lit(False)
    for src, lanes in ROUTES.items():
        cond = cond | ((src_lane == src) & lane.isin(*lanes))
    return cond


def _priority(kind, decrease, hops):
    return (F.when(kind == "tree", -hops)
            .when(~decrease, F.lit(0))
            .when(hops <= 1, F.lit(-5))
            .otherwise(-5 - (hops + 1)))


def propagate_spark(spark: SparkSession, folded: Folded, *, max_hops: int = 64,
                    held: list | None = None) -> dict:
    """Per-cell figures of the folded estate: ``{"cells": {cell: {figure: n}},
    "dst": [(cell, gid, received, demand)]}``.  Raises NotModelled like ``exact``.
    ``held``: a list that receives, per hop, the demand kept (``spark_messages.py``
    reads it): (gid, holder cell, holder's end, the cell it points to, priority, and
    whether it is a static conduit's instance)."""
    qends, groups, flags = _tables(spark, folded)
    qends = F.broadcast(qends)
    flags = F.broadcast(flags)
    groups = groups.cache()
    per_cell: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    by_dst: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    # local consumers: interest at the origin
    for row in groups.groupBy("origin").agg(F.sum(F.col("k") * F.col("origin_size"))
                                              .alias("n")).collect():
        per_cell[row.origin]["interest"] += row.n
    frontier = groups.select(
        "gid", F.col("origin").alias("cell"),
        F.array(F.col("origin")).alias("trail"),
        F.array().cast(T.ArrayType(T.LongType())).alias("rank"),
        F.col("origin_size").alias("m"),
        F.lit(None).cast(T.IntegerType()).alias("src"),
        F.lit("local").alias("src_lane"),
        F.lit(None).cast(T.IntegerType()).alias("prio"))
    kept = None          # (gid, cell, prio): instances held under duplicate suppression
    conduit_parts = []
    hop = 0
    rows = len(folded.groups)       # frontier rows; then the active rows of each hop
    while rows:
        # small hops in one partition (a job per partition is most of the cost)
        frontier = frontier.coalesce(rows // 200_000 + 1)
        hop += 1
        if hop > max_hops:
            raise NotModelled(f"interest still travelling after {max_hops} hops")
        g = groups.select("gid", "origin", "k", "templated", "dst", "origin_size")
        x = (frontier.join(qends, frontier.cell == qends.qcell)
             .where((F.col("src").isNull() | (F.col("qid") != F.col("src"))
                     | (F.col("fan") > 1))
                    & F.col("advertises")
                    & _lane_allowed(F.col("src_lane"), F.col("lane")))
             .join(g, "gid")
             .join(flags, (F.col("fsid") == F.col("sid")) & (F.col("fgid") == F.col("gid"))))
        plen = F.size("trail") - 1
        # back into the leaf cell it came from: every member but the sender (which is
        # the origin: a leaf only sends its own interest) -- not offered, not a loop
        back = F.col("src").isNotNull() & (F.col("qid") == F.col("src"))
        x = _own_or_other(x, back, bool(folded.owner)) \
             .where(~(F.col("skip") & ((F.col("kind") == "mesh")
                                       | (F.col("lane") == "child")))) \
             .withColumn("ttl_fail", (F.col("kind") == "mesh") & (F.col("ttl") != -1)
                         & (plen >= F.col("ttl"))) \
             .withColumn("checks", (F.col("kind") == "mesh") & F.col("duplex"))
        # sender side of a duplex mesh link: ttl, then loop, refused before sending
        sent = F.when(F.col("checks"),
                      F.when(F.col("ttl_fail"), 0).otherwise(F.col("total") - F.col("loop_n"))
                      ).otherwise(F.col("total"))
        x = x.withColumn("sent", sent) \
             .withColumn("s_ttl", F.when(F.col("checks") & F.col("ttl_fail"),
                                         F.col("total")).otherwise(0)) \
             .withColumn("s_loop", F.when(F.col("checks") & ~F.col("ttl_fail"),
                                          F.col("loop_n")).otherwise(0))
        # receiver side
        recv_loop = F.when(F.col("checks"), 0).otherwise(F.col("loop_n"))
        r_ttl = F.when(~F.col("checks") & F.col("ttl_fail") & F.col("peer_accepts"),
                       F.col("sent")).otherwise(0)
        x = x.withColumn("r_malformed", F.when(~F.col("peer_accepts"), F.col("sent"))
                         .otherwise(0)) \
             .withColumn("r_ttl", r_ttl) \
             .withColumn("r_loop", F.when(F.col("peer_accepts") & (F.col("r_ttl") == 0),
                                          recv_loop).otherwise(0))
        ok = F.col("sent") - F.col("r_malformed") - F.col("r_ttl") - F.col("r_loop")
        x = x.withColumn("ok", ok)
        # receiving-side rules on the rest
        origin_c = F.col("origin")
        tree_child = (F.col("kind") == "tree") & (F.col("peer_lane") == "child")
        tree_parent = (F.col("kind") == "tree") & (F.col("peer_lane") == "parent")
        reason = (F.when((F.col("kind") == "mesh") & F.col("permit").isNotNull(),
                         F.col("permit"))
                  .when(tree_child & (F.arrays_overlap("trail", "peer_anc")),
                        F.lit("tree_rule"))
                  .when(tree_child & ((origin_c == F.col("peer_cell")) & ~F.col("peer_leaf")
                                      | F.array_contains("peer_anc", origin_c)),
                        F.lit("malformed"))
                  .when(tree_parent & F.array_contains("peer_desc", origin_c),
                        F.lit("loop")))
        x = x.withColumn("r_reason", F.when(F.col("ok") > 0, reason)) \
             .withColumn("hops", F.size("trail")) \
             .withColumn("prio", _priority(F.col("kind"), F.col("decrease"), F.col("hops"))) \
             .withColumn("rank2", F.concat("rank", F.array(F.col("pos"))))
        # duplicate suppression: per (group, reached cell) the first in FIFO order wins;
        # a route arriving after one kept at an earlier hop is a duplicate too
        accepted = (F.col("ok") > 0) & F.col("r_reason").isNull()
        x = x.withColumn("contest", accepted & F.col("suppress"))
        if kept is not None:
            x = x.join(F.broadcast(kept), (x.gid == kept.kgid) & (x.peer_cell == kept.kcell),
                       "left").drop("kgid", "kcell")
        else:
            x = x.withColumn("kprio", F.lit(None).cast(T.IntegerType()))
        w = Window.partitionBy("gid", "peer_cell", "contest").orderBy("rank2")
        x = x.withColumn("nth", F.row_number().over(w)) \
             .withColumn("first_prio", F.first("prio").over(w))
        contest = F.col("contest")
        x = x.withColumn("dup", contest & (F.col("kprio").isNotNull() | (F.col("nth") > 1))) \
             .withColumn("displaces", contest & (
                 F.col("kprio").isNotNull() & (F.col("prio") > F.col("kprio"))
                 | (F.col("nth") > 1) & (F.col("prio") > F.col("first_prio")))) \
             .withColumn("active", accepted & ~F.col("dup"))
        conduit = F.when(F.col("kind") == "tree", True).otherwise(
            F.col("conduit_subs") & ((F.col("hops") == 1) | F.col("topic")))
        static = (F.col("kind") == "mesh") & F.col("static") & F.col("peer_forwards")
        x = x.withColumn("conduit", conduit & ~static) \
             .withColumn("demand_n", F.when(F.col("active") & ~conduit, F.col("ok")).otherwise(0))
        # two Spark jobs a hop: the checkpoint and the collected figures (which also
        # count the next frontier's rows and any displacing duplicate)
        x = x.localCheckpoint()
        rows, displacing = _collect(x, per_cell, by_dst)
        if displacing:
            raise NotModelled("a later, shorter route displaces a kept duplicate")
        active = x.where("active")
        new_kept = active.where("contest").select(
            F.col("gid").alias("kgid"), F.col("peer_cell").alias("kcell"),
            F.col("prio").alias("kprio"))
        kept = new_kept if kept is None else kept.unionByName(new_kept)
        if held is not None:
            held.append(active.select(
                "gid", F.col("peer_cell").alias("hcell"), F.col("peer_qend").alias("hq"),
                F.col("cell").alias("tcell"), "prio", (static & conduit).alias("static")))
        conduit_parts.append(active.where("conduit").select(
            "peer_cell", "peer_qend", "dst", "templated", "origin", "ok",
            "peer_leaf", "peer_fan", "peer_size"))
        frontier = active.select(
            "gid", F.col("peer_cell").alias("cell"),
            F.concat("trail", F.array(F.col("peer_cell"))).alias("trail"),
            F.col("rank2").alias("rank"), F.col("ok").alias("m"),
            F.col("peer_qend").alias("src"), F.col("peer_lane").alias("src_lane"),
            "prio")
    # conduit demand: one per distinct (cell, end, concrete destination)
    if conduit_parts:
        keys = conduit_parts[0]
        for part in conduit_parts[1:]:
            keys = keys.unionByName(part)
        key_origin = F.when(F.col("templated"), F.col("origin"))
        per_key = keys.groupBy("peer_cell", "peer_qend", "dst", key_origin.alias("korigin")) \
            .agg(F.max("ok").alias("ok"), F.first("templated").alias("templated"),
                 F.first("peer_leaf").alias("leaf"), F.first("peer_fan").alias("fan"),
                 F.first("peer_size").alias("size"))
        n = F.when(F.col("templated"), F.col("ok")) \
             .when(F.col("leaf"), F.col("size")) \
             .otherwise(F.col("fan"))
        for row in per_key.groupBy("peer_cell").agg(F.sum(n).alias("n")).collect():
            per_cell[row.peer_cell]["demand"] += row.n
    groups.unpersist()
    return {"cells": {c: dict(v) for c, v in per_cell.items()},
            "dst": [(c, gid, r) for (c, gid), (r, _d) in by_dst.items()]}


def _own_or_other(x: DataFrame, back, relative: bool) -> DataFrame:
    """``total`` instances a row offers and ``loop_n`` of them looping back to their
    origin, with the filter verdicts (``skip``, ``permit``, ``static``) that apply.
    A leaf's own connector naming it (``cells.group_flags``' ``split``) judges the
    member's own destination apart from its cell-mates': the origin's first hop is its
    own (all of it); going down into the origin's cell the instance reaching the origin
    member is its own (the loop instance), the rest are cell-mates'.  Such a row is
    split in two; any other row is one.  ``relative``: the estate has such connectors
    (``Folded.owner``); without them nothing is split and nothing exploded."""
    zero = F.lit(0).cast("long")
    total = F.col("m") * (F.col("fan") - F.when(back, 1).otherwise(0))
    loop_n = F.when(~back & F.array_contains("trail", F.col("peer_cell")),
                    F.col("m")).otherwise(zero)
    if not relative:
        return x.withColumn("total", total).withColumn("loop_n", loop_n) \
            .drop("skip_self", "permit_self", "static_self", "split")
    first = F.col("src").isNull()
    own = F.struct(F.lit(True).alias("own"), F.when(first, total).otherwise(loop_n)
                   .alias("total"), loop_n.alias("loop_n"))
    other = F.struct(F.lit(False).alias("own"), (total - loop_n).alias("total"),
                     zero.alias("loop_n"))
    whole = F.struct(F.lit(False).alias("own"), total.alias("total"), loop_n.alias("loop_n"))
    parts = F.when(~F.col("split"), F.array(whole)) \
        .when(first, F.array(own)).otherwise(F.array(own, other))
    x = x.withColumn("part", F.explode(parts))
    own_c = F.col("part.own")
    return x.withColumn("total", F.col("part.total")) \
        .withColumn("loop_n", F.col("part.loop_n")) \
        .where(F.col("total") > 0) \
        .withColumn("skip", F.when(own_c, F.col("skip_self")).otherwise(F.col("skip"))) \
        .withColumn("permit", F.when(own_c, F.col("permit_self")).otherwise(F.col("permit"))) \
        .withColumn("static", F.when(own_c, F.col("static_self")).otherwise(F.col("static"))) \
        .drop("part", "skip_self", "permit_self", "static_self", "split")


def _collect(x: DataFrame, per_cell: dict, by_dst: dict) -> tuple[int, int]:
    """One hop's figures, per cell, in one Spark job: frames sent and refused at the
    sender; received, refused, duplicates, demand and interest at the receiver.
    Returns (active rows: the next frontier's size, rows whose duplicate displaces a
    kept one)."""
    k = F.col("k")
    zero = F.lit(0).cast("long")
    refused = F.when(F.col("r_reason").isNotNull(), F.col("ok")).otherwise(zero)
    loop_name = F.when(F.col("peer_lane") == "child", "tree_rule").otherwise("loop")
    def fact(cell: str, name, n):
        return F.struct(F.col(cell).alias("c"),
                        (F.lit(name) if isinstance(name, str) else name).alias("f"),
                        n.cast("long").alias("n"))

    facts = F.array(
        fact("cell", "adds_sent", F.col("sent") * k),
        fact("cell", "dropped_ttl", F.col("s_ttl") * k),
        fact("cell", "dropped_loop", F.col("s_loop") * k),
        fact("peer_cell", "adds_received", F.col("sent") * k),
        fact("peer_cell", "dropped_malformed", F.col("r_malformed") * k),
        fact("peer_cell", "dropped_ttl", F.col("r_ttl") * k),
        fact("peer_cell", F.concat(F.lit("dropped_"), loop_name), F.col("r_loop") * k),
        fact("peer_cell", F.concat(F.lit("dropped_"), F.coalesce(F.col("r_reason"),
                                                                 F.lit("none"))),
             refused * k),
        fact("peer_cell", "dropped_duplicate",
             F.when(F.col("dup"), F.col("ok")).otherwise(zero) * k),
        fact("peer_cell", "demand", F.col("demand_n") * k),
        fact("peer_cell", "interest", F.when(F.col("active"), F.col("ok")).otherwise(zero) * k),
        fact("peer_cell", F.concat(F.lit("rx:"), F.col("gid").cast("string")),
             F.col("sent") * k),
        F.struct(F.lit(-1).alias("c"), F.lit("#active").alias("f"),
                 F.col("active").cast("long").alias("n")),
        F.struct(F.lit(-1).alias("c"), F.lit("#displaces").alias("f"),
                 F.col("displaces").cast("long").alias("n")),
    )
    union = x.select(F.explode(facts).alias("t")).select("t.*")
    meta = {"#active": 0, "#displaces": 0}
    for row in union.where(F.col("n") > 0).groupBy("c", "f").agg(F.sum("n").alias("n")) \
            .collect():
        if row.f.startswith("rx:"):
            by_dst[row.c, int(row.f[3:])][0] += row.n
        elif row.f.startswith("#"):
            meta[row.f] = row.n
        else:
            per_cell[row.c][row.f] += row.n
    return meta["#active"], meta["#displaces"]


def per_broker(folded: Folded, result: dict) -> Counts:
    """Spread per-cell figures over the members (every member has the same figures)."""
    counts = Counts()
    for cid, figures in result["cells"].items():
        cell = folded.cells[cid]
        n = len(cell.members)
        for name, value in figures.items():
            if not value:
                continue
            if value % n:
                raise NotModelled(f"cell {cid}: {name} = {value} does not split over "
                                  f"{n} members")
            share = value // n
            for b in cell.members:
                if name.startswith("dropped_"):
                    counts.dropped[b, name[len("dropped_"):]] += share
                else:
                    getattr(counts, name)[b] += share
    return counts


def model_counts(spark: SparkSession, estate: Estate, groups: Sequence[Group], *,
                 cells: bool = True) -> Counts:
    """Fold, propagate on Spark, spread: per-broker counts comparable with ``exact``."""
    from treefed.model.cells import fold

    folded = fold(estate, groups, cells=cells)
    return per_broker(folded, propagate_spark(spark, folded))
