"""Where messages go, on Spark cells: delivered / stranded / dropped per sender class.

Theory of operation
-------------------
``messages.py`` routes every send over every broker's consumers, one message at a time;
that stops at a few thousand stores.  Here the same dispatch rules run over the *cells*
of ``cells.py``, with counts: messages alike up to the cells' symmetry form a **class**
-- (sender cell, queue or topic, the consumer groups the destination matches and, for a
group whose destination names its store (``Store.{broker}.Incoming``), whether the sender
is that store, the static includes that name it) -- and one row carries all of a class's
messages.  A row's place is a cell and, inside a leaf cell, *which* member: ``sender``
(the send's own store), ``owner`` (the store its destination names) or ``member`` (one
reached by a copy to every member).  Because a leaf member has one link, a message that
enters a leaf cell ends there.

``spark.propagate_spark(..., held=[...])`` hands over the demand each cell's core holds
(per hop: group, holder cell, the holder's link end, the cell it points to, priority).
With the local consumers, the static consumers of ``statically_included`` and a tree
child's fallbacks (``route_unknown_up``) it is the *consumer table* per class and cell.
Then one join per hop of the frontier (class rows) with the consumer table, and the
core's rules as column expressions (``core/dispatch.py``, as ``messages.py`` replays
them):

* eligible: a local consumer always; a network one unless its peer is on the path
  (a cell on the trail; in a leaf cell the sender) or the path is ``message_ttl`` long;
* queue: the eligible consumers of the highest priority (fallbacks only when no regular
  one is eligible); a local one delivers, a network one forwards; none: the class waits
  here, *stranded*.  Where that level holds consumers that lead to *different* places,
  the core's round robin decides message by message in send order -- counts cannot say
  which message goes where, so the model refuses (``NotModelled``) instead of guessing;
* topic: a copy per eligible link (the fallback pass on links not used yet), local
  consumers deliver, a broker where nothing is eligible drops it; the core's duplicate
  key (over mesh: the broker, over tree links: the broker and the path length) drops a
  later copy.  Two copies reaching one broker in one hop by different paths would make
  FIFO order decide the onward path: refused likewise.

Per hop the outcome facts are aggregated per (class, cell, place) and collected (a few
rows), so nothing is ever a row per message, consumer or store.  Spreading the classes'
outcomes back over the sends (``outcomes``) is a driver loop over the sends, not over
the estate.  Only Spark SQL column expressions, no Python UDFs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from treefed.core.destinations import is_topic, is_wildcard, matches
from treefed.model.cells import Folded
from treefed.model.exact import NotModelled
from treefed.model.messages import MAX_HOPS, Send

__all__ = ["Classes", "classify", "route_spark", "MessageResult"]


@dataclass
class Classes:
    """The sends folded into classes: ``of_send[i]`` is send i's class; per class its
    sender cell, topic flag, matched (group, relation) and static ends; per send the
    owner store of its destination (``None`` unless a store-named group matches)."""

    keys: list = field(default_factory=list)
    of_send: list = field(default_factory=list)
    owner: list = field(default_factory=list)
    count: list = field(default_factory=list)


def classify(folded: Folded, sends: Sequence[Send]) -> Classes:
    """Fold ``sends`` into classes (driver side: one dict look-up per send)."""
    by_dst: dict[str, list] = defaultdict(list)     # concrete dst -> [(gid, owner|None)]
    wild = []
    for g in folded.groups:
        if is_wildcard(g.template):
            if g.templated:
                raise NotModelled(f"group {g.template}: a per-store wildcard is not "
                                  f"modelled for messages on cells")
            wild.append(g)
            continue
        if g.templated:
            for m in folded.cells[g.origin].members:
                by_dst[g.dst(m)].append((g.id, m))
        else:
            by_dst[g.template].append((g.id, None))
    statics: dict[str, list] = defaultdict(list)    # dst -> [qend ids]
    for q in folded.qends:
        s = folded.settings[q.sid]
        if q.kind == "mesh" and q.forwards:
            for d in s.statically_included:
                statics[d].append(q.id)
    out = Classes()
    index: dict[tuple, int] = {}
    wild_cache: dict[str, tuple] = {}
    for send in sends:
        cs = folded.cell_of[send.broker]
        matched, owner = [], None
        for gid, o in by_dst.get(send.dst, ()):
            g = folded.groups[gid]
            if g.selector is not None:
                raise NotModelled(f"group {g.template}: selectors are not modelled for "
                                  f"messages")
            if o is None:
                matched.append((gid, ""))
            else:
                if owner is not None and owner != o:
                    raise NotModelled(f"{send.dst} names two stores")
                owner = o
                matched.append((gid, "self" if o == send.broker else "other"))
        if wild:
            if send.dst not in wild_cache:
                wild_cache[send.dst] = tuple((g.id, "") for g in wild
                                             if matches(g.template, send.dst))
            for gid, rel in wild_cache[send.dst]:
                if folded.groups[gid].selector is not None:
                    raise NotModelled("selectors are not modelled for messages")
                matched.append((gid, rel))
        key = (cs, is_topic(send.dst), tuple(sorted(matched)),
               tuple(sorted(statics.get(send.dst, ()))))
        c = index.get(key)
        if c is None:
            c = index[key] = len(out.keys)
            out.keys.append(key)
            out.count.append(0)
        out.count[c] += 1
        out.of_send.append(c)
        out.owner.append(owner)
    return out


@dataclass
class MessageResult:
    """Per class: ``delivered`` (queue: messages delivered; topic: deliveries), where
    they were delivered / stranded / dropped as {(cell, place): n}."""

    classes: Classes
    delivered: list
    delivered_at: list
    stranded_at: list
    dropped_at: list
    hops: int = 0


_CONS = T.StructType([
    T.StructField("ccls", T.IntegerType()), T.StructField("hcell", T.IntegerType()),
    T.StructField("hq", T.IntegerType()), T.StructField("tcell", T.IntegerType()),
    T.StructField("prio", T.IntegerType()), T.StructField("kind", T.StringType()),
    T.StructField("ttl", T.IntegerType()), T.StructField("tmode", T.StringType()),
    T.StructField("local", T.BooleanType()), T.StructField("fallback", T.BooleanType()),
    T.StructField("need_owner", T.BooleanType()), T.StructField("not_owner", T.BooleanType()),
    T.StructField("count", T.LongType()),
])
_CLASS = T.StructType([
    T.StructField("cls", T.IntegerType()), T.StructField("scell", T.IntegerType()),
    T.StructField("topic", T.BooleanType()), T.StructField("self_owner", T.BooleanType()),
    T.StructField("n", T.LongType()), T.StructField("sleaf", T.BooleanType()),
])
_CG = T.StructType([
    T.StructField("gcls", T.IntegerType()), T.StructField("gid", T.IntegerType()),
])


def _consumers(spark: SparkSession, folded: Folded, classes: Classes,
               held: list, trees: dict) -> DataFrame:
    """The consumer table: per class and holder cell, every consumer a message of the
    class can meet there (local, network from ``held``, static, fallback)."""
    cells, groups, qends = folded.cells, folded.groups, folded.qends
    rows = []
    cg = []
    for c, (cs, _topic, matched, static_q) in enumerate(classes.keys):
        for gid, _rel in matched:
            g = groups[gid]
            cg.append((c, gid))
            # local consumers: the group's members (a store-named one: the owner only)
            rows.append((c, g.origin, -1, -1, 0, "local", -1, "local", True, False,
                         g.templated, False, g.count))
        for qid in static_q:
            q = qends[qid]
            rows.append(_network_row(folded, c, q, 0, False))
        # tree fallbacks (route_unknown_up): a child's parent end, for any destination
        for q in qends:
            tree = trees.get(cells[q.cell].members[0]) if q.lane == "parent" else None
            if tree is not None and tree.route_unknown_up:
                rows.append(_network_row(folded, c, q, 0, True))
    base = spark.createDataFrame(rows, _CONS)
    if not held:
        return base
    info = spark.createDataFrame(
        [(q.id, q.kind, _mttl(folded, q), q.peer_cell, cells[q.peer_cell].leaf)
         for q in qends],
        "iq int, ikind string, ittl int, ipeer int, ileaf boolean")
    ginfo = spark.createDataFrame(
        [(g.id, g.origin, g.templated) for g in groups],
        "ggid int, gorigin int, gtemplated boolean")
    h = held[0]
    for part in held[1:]:
        h = h.unionByName(part)
    # a static conduit's instance is the static consumer (messages.py's _Cores)
    h = h.where(~F.col("static")).groupBy("gid", "hcell", "hq", "tcell") \
        .agg(F.max("prio").alias("prio"))
    cgdf = spark.createDataFrame(cg, _CG)
    net = (cgdf.join(h, "gid").join(F.broadcast(info), F.col("hq") == F.col("iq"))
           .join(F.broadcast(ginfo), F.col("gid") == F.col("ggid")))
    into_origin = F.col("gorigin") == F.col("tcell")
    tmode = (F.when(~F.col("ileaf"), F.lit("single"))
             .when(into_origin & F.col("gtemplated"), F.lit("owner"))
             .when(into_origin, F.lit("each"))
             .otherwise(F.lit("bad")))
    net = net.select(
        F.col("gcls").alias("ccls"), "hcell", "hq", "tcell", F.col("prio").cast("int"),
        F.col("ikind").alias("kind"), F.col("ittl").alias("ttl"), tmode.alias("tmode"),
        F.lit(False).alias("local"), F.lit(False).alias("fallback"),
        F.lit(False).alias("need_owner"),
        (F.col("gtemplated") & (F.col("gorigin") == F.col("hcell"))).alias("not_owner"),
        F.lit(0).cast("long").alias("count"))
    return base.unionByName(net)


def _mttl(folded: Folded, q) -> int:
    if q.kind != "mesh":
        return -1
    t = folded.settings[q.sid].message_ttl
    return -1 if t is None else t


def _network_row(folded: Folded, c: int, q, prio: int, fallback: bool) -> tuple:
    peer = folded.cells[q.peer_cell]
    tmode = "each" if peer.leaf else "single"
    kind = q.kind if fallback else "mesh"
    ttl = -1 if fallback else _mttl(folded, q)
    return (c, q.cell, q.id, q.peer_cell, prio, kind, ttl, tmode, False, fallback,
            False, False, 0)


def route_spark(spark: SparkSession, folded: Folded, classes: Classes, held: list,
                trees: dict | None = None) -> MessageResult:
    """Route every class hop by hop (module docstring).  ``trees``: broker -> its
    TreeSettings (the estate's ``tree``), for the fallback consumers."""
    n_cls = len(classes.keys)
    res = MessageResult(classes, [0] * n_cls, [defaultdict(int) for _ in range(n_cls)],
                        [defaultdict(int) for _ in range(n_cls)],
                        [defaultdict(int) for _ in range(n_cls)])
    if not n_cls:
        return res
    cons = _consumers(spark, folded, classes, held, trees or {}).localCheckpoint()
    if cons.where(F.col("tmode") == "bad").limit(1).collect():
        raise NotModelled("demand leads into a leaf cell for another cell's consumer")
    cons = F.broadcast(cons)
    crow = []
    for c, (cs, topic, matched, _s) in enumerate(classes.keys):
        crow.append((c, cs, topic, any(rel == "self" for _g, rel in matched),
                     classes.count[c], folded.cells[cs].leaf))
    cls_df = F.broadcast(spark.createDataFrame(crow, _CLASS))
    sizes = F.broadcast(spark.createDataFrame(
        [(c.id, len(c.members)) for c in folded.cells], "zcell int, tsize long"))
    frontier = cls_df.select(
        "cls", F.col("scell").alias("cell"),
        F.when(F.col("sleaf"), F.lit("sender")).otherwise(F.lit("")).alias("who"),
        F.array(F.col("scell")).alias("trail"), F.col("n").alias("m"))
    seen = None
    hop = 0
    rows_q = sum(1 for k in classes.keys if not k[1])
    rows_t = n_cls - rows_q
    while rows_q or rows_t:
        hop += 1
        if hop > MAX_HOPS:
            raise NotModelled(f"messages still travelling after {MAX_HOPS} hops")
        frontier = frontier.coalesce(1).withColumn("fid", F.monotonically_increasing_id())
        x = (frontier.join(cls_df.select("cls", "scell", "topic", "self_owner"), "cls")
             .join(cons, (F.col("cls") == F.col("ccls")) & (F.col("cell") == F.col("hcell")),
                   "left")
             .join(sizes, F.col("tcell") == F.col("zcell"), "left"))
        is_owner = (F.col("who") == "owner") | ((F.col("who") == "sender")
                                                & F.col("self_owner"))
        applies = F.col("ccls").isNotNull() & F.when(
            F.col("local"), ~F.col("need_owner") | is_owner
        ).otherwise(~(F.col("not_owner") & is_owner))
        plen = F.size("trail") - 1
        # eligible members of a leaf cell a copy goes to every member of
        each_n = F.col("tsize") - F.when(F.col("tcell") == F.col("scell"), 1).otherwise(0)
        on_path = (F.when(F.col("tmode") == "single", F.array_contains("trail", F.col("tcell")))
                   .when(F.col("tmode") == "owner",
                         (F.col("tcell") == F.col("scell")) & F.col("self_owner"))
                   .when(F.col("tmode") == "each", each_n <= 0)
                   .otherwise(F.lit(False)))
        eligible = F.col("local") | (~on_path & ((F.col("ttl") < 0) | (plen < F.col("ttl"))))
        x = x.withColumn("ok", applies & eligible) \
             .withColumn("e", F.when(F.col("tmode") == "each", each_n).otherwise(F.lit(1)))
        x = x.localCheckpoint()
        parts = []
        if rows_q:
            nxt_q, rows_q = _queue_hop(x.where(~F.col("topic")), res)
            parts.append(nxt_q)
        if rows_t:
            nxt_t, rows_t, seen = _topic_hop(x.where(F.col("topic")), res, plen, seen)
            parts.append(nxt_t)
        frontier = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    res.hops = hop
    return res


def _target_who(tmode):
    return (F.when(tmode == "owner", F.lit("owner")).when(tmode == "each", F.lit("member"))
            .otherwise(F.lit("")))


def _queue_hop(x: DataFrame, res: MessageResult) -> tuple[DataFrame, int]:
    """One hop of the queue classes: collected facts (delivered / stranded / how many
    rows move on) in one Spark job; returns the next frontier and its size."""
    w = Window.partitionBy("fid")
    cand = x.where("ok").withColumn("pass", F.col("fallback").cast("int"))
    cand = cand.withColumn("best", F.min("pass").over(w)).where(F.col("pass") == F.col("best"))
    cand = cand.withColumn("top", F.max("prio").over(w)).where(F.col("prio") == F.col("top"))
    tkey = F.when(F.col("local"), F.lit("L")).otherwise(
        F.concat_ws(":", F.col("tcell").cast("string"), F.col("tmode")))
    dec = cand.groupBy("fid").agg(
        F.countDistinct(tkey).alias("nt"), F.max("e").alias("emax"),
        F.first("local").alias("dlocal"), F.first("tcell").alias("dtcell"),
        F.first("tmode").alias("dtmode"))
    rows = x.select("fid", "cls", "cell", "who", "trail", "m").dropDuplicates(["fid"]) \
        .join(dec, "fid", "left")
    rows = rows.withColumn(
        "fate", F.when(F.col("nt").isNull(), F.lit("stranded"))
        .when((F.col("nt") > 1) | (F.col("emax") > 1), F.lit("ambiguous"))
        .when(F.col("dlocal"), F.lit("delivered")).otherwise(F.lit("moved"))).localCheckpoint()
    moving = F.col("fate") == "moved"
    facts = rows.groupBy("fate", F.when(moving, -1).otherwise(F.col("cls")).alias("cls"),
                         F.when(moving, -1).otherwise(F.col("cell")).alias("cell"),
                         F.when(moving, "").otherwise(F.col("who")).alias("who")) \
        .agg(F.sum("m").alias("n"), F.count(F.lit(1)).alias("rows")).collect()
    moved = 0
    for r in facts:
        if r.fate == "ambiguous":
            raise NotModelled(f"class {r.cls}: at cell {r.cell} the consumers of the "
                              f"highest priority lead to different places (the round "
                              f"robin decides per message)")
        if r.fate == "moved":
            moved = r.rows
        elif r.fate == "stranded":
            res.stranded_at[r.cls][r.cell, r.who] += r.n
        else:
            res.delivered[r.cls] += r.n
            res.delivered_at[r.cls][r.cell, r.who] += r.n
    nxt = rows.where(moving).select(
        "cls", F.col("dtcell").alias("cell"), _target_who(F.col("dtmode")).alias("who"),
        F.concat("trail", F.array(F.col("dtcell"))).alias("trail"), "m")
    return nxt, moved


def _topic_hop(x: DataFrame, res: MessageResult, plen, seen):
    """One hop of the topic classes: deliveries and drops in one collected job, the
    copies' arrivals (duplicates dropped by the core's key) checkpointed."""
    cand = x.where("ok")
    regular = cand.where(~F.col("fallback"))
    used = regular.where(~F.col("local")).select(F.col("fid").alias("ufid"),
                                                 F.col("hq").alias("uhq")).distinct()
    fb = cand.where(F.col("fallback")).join(
        used, (F.col("fid") == F.col("ufid")) & (F.col("hq") == F.col("uhq")), "left_anti")
    # one copy per link: the first consumer of each (fid, link) decides
    links = regular.where(~F.col("local")).unionByName(fb.select(regular.columns)) \
        .dropDuplicates(["fid", "hq"])
    taken = cand.select(F.col("fid").alias("tfid")).distinct()
    rows = x.select("fid", "cls", "cell", "who", "m").dropDuplicates(["fid"])
    dropped = rows.join(taken, F.col("fid") == F.col("tfid"), "left_anti") \
        .select(F.lit("dropped").alias("what"), "cls", "cell", "who", "m")
    delivered = regular.where("local").select(
        F.lit("delivered").alias("what"), "cls", "cell", "who",
        (F.col("m") * F.col("count")).alias("m"))
    for r in dropped.unionByName(delivered).groupBy("what", "cls", "cell", "who") \
            .agg(F.sum("m").alias("n")).collect():
        if r.what == "dropped":
            res.dropped_at[r.cls][r.cell, r.who] += r.n
        else:
            res.delivered[r.cls] += r.n
            res.delivered_at[r.cls][r.cell, r.who] += r.n
    arrive = links.select(
        "cls", F.col("tcell").alias("cell"), _target_who(F.col("tmode")).alias("who"),
        F.concat("trail", F.array(F.col("tcell"))).alias("trail"),
        (F.col("m") * F.col("e")).alias("m"),
        F.when(F.col("kind") == "tree", plen + 1).otherwise(F.lit(-1)).alias("klen"))
    # the core's duplicate key: a copy arriving where one was seen is dropped; two
    # copies reaching one place in one hop by different paths: FIFO order would decide
    # the onward path -- refused
    key = ["cls", "cell", "who", "klen"]
    if seen is not None:
        arrive = arrive.join(F.broadcast(seen), key, "left_anti")
    arrive = arrive.groupBy(*key).agg(
        F.first("trail").alias("trail"), F.first("m").alias("m"),
        F.countDistinct("trail").alias("paths")).localCheckpoint()
    stats = arrive.agg(F.count(F.lit(1)).alias("n"), F.max("paths").alias("paths")).first()
    if stats.n and stats.paths > 1:
        raise NotModelled("topic copies reach one broker in one hop by different paths "
                          "(FIFO order decides the onward path)")
    keys = arrive.select(*key)
    seen = keys if seen is None else seen.unionByName(keys)
    return arrive.select("cls", "cell", "who", "trail", "m"), stats.n, seen


def _place(folded: Folded, cell: int, who: str, send: Send, owner: str | None) -> str:
    members = folded.cells[cell].members
    if who == "sender":
        return send.broker
    if who == "owner":
        return owner
    if who == "member" and len(members) > 1:
        rest = [b for b in members if b != send.broker]
        if len(rest) != 1:
            raise NotModelled(f"cell {cell}: which member took {send.id} is not one")
        return rest[0]
    return members[0]


def outcomes(folded: Folded, res: MessageResult, sends: Sequence[Send]) -> list[dict]:
    """Per send: delivered (queue 0/1, topic: deliveries), delivered_at, stranded_at,
    dropped (topic copies dropped for want of a route) -- spread from the classes."""
    cls = res.classes
    out = []
    for i, send in enumerate(sends):
        c = cls.of_send[i]
        n = cls.count[c]
        row = {"send": send, "delivered": 0, "delivered_at": None, "stranded_at": None}
        if cls.keys[c][1]:      # topic
            if res.delivered[c] % n:
                raise NotModelled(f"class {c}: {res.delivered[c]} deliveries over {n} sends")
            row["delivered"] = res.delivered[c] // n
        else:
            places = {**{("d",) + k: v for k, v in res.delivered_at[c].items()},
                      **{("s",) + k: v for k, v in res.stranded_at[c].items()}}
            if len(places) != 1 or next(iter(places.values())) != n:
                raise NotModelled(f"class {c}: its {n} sends part ways ({places})")
            (what, cell, who), = places
            where = _place(folded, cell, who, send, cls.owner[i])
            if what == "d":
                row["delivered"], row["delivered_at"] = 1, where
            else:
                row["stranded_at"] = where
        out.append(row)
    return out


def summary(rows: Sequence[dict], units: dict, tiers: dict | None = None) -> dict:
    """``messages.summarise``'s figures from ``outcomes`` rows, plus where stranded
    messages wait per tier (``stranded_tiers``: "store: n, region: n")."""
    delivered = stranded = expected = 0
    where: dict[str, int] = defaultdict(int)
    for r in rows:
        send = r["send"]
        u = units.get(send.id)
        if u is None:
            u = r["delivered"] if is_topic(send.dst) else 1
        expected += u
        delivered += min(r["delivered"], u)
        if r["stranded_at"] is not None:
            stranded += 1
            where[r["stranded_at"]] += 1
    top = sorted(where.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{b}: {n}" for b, n in top[:3])
    if len(top) > 3:
        text += f", +{len(top) - 3} more brokers"
    fig = {"expected": expected, "delivered": delivered, "stranded": stranded,
           "dropped": expected - delivered - stranded, "stranded_at": text,
           "messages": len(rows)}
    if tiers is not None:
        per: dict[str, int] = defaultdict(int)
        for b, n in where.items():
            per[tiers.get(b, "?")] += n
        fig["stranded_tiers"] = ", ".join(f"{t}: {n}" for t, n in
                                          sorted(per.items(), key=lambda kv: -kv[1]))
    return fig


def class_rows(folded: Folded, res: MessageResult, tiers: dict) -> list[dict]:
    """One row per class: sender cell / tier, kind, destination groups, messages,
    delivered, and where the rest wait or are dropped (cell: tier x members)."""
    out = []
    for c, (cs, topic, matched, statics) in enumerate(res.classes.keys):
        cell = folded.cells[cs]

        def places(d: dict) -> str:
            return " ".join(f"{cid}/{tiers.get(folded.cells[cid].members[0], '?')}"
                            f"{'/' + who if who else ''}:{n}"
                            for (cid, who), n in sorted(d.items()))
        out.append({
            "class": c, "sender_cell": cs, "sender_tier": tiers.get(cell.members[0], "?"),
            "sender_brokers": len(cell.members), "kind": "topic" if topic else "queue",
            "groups": " ".join(f"{folded.groups[g].template}@{folded.groups[g].origin}"
                               f"{'/' + rel if rel else ''}" for g, rel in matched),
            "messages": res.classes.count[c], "delivered": res.delivered[c],
            "delivered_at": places(res.delivered_at[c]),
            "stranded": sum(res.stranded_at[c].values()),
            "stranded_at": places(res.stranded_at[c]),
            "dropped_at": places(res.dropped_at[c])})
    return out


def message_figures_spark(spark: SparkSession, plan, mode, folded: Folded, held: list,
                          estate, out_dir=None) -> dict:
    """The workload's sends (not timeline sends) under ``mode`` on Spark cells: the
    run's accounting figures (as ``cli.message_figures`` gives them, without the
    report-definition spill, which needs every message's path), ``stranded_tiers``, and
    ``message-classes-<mode>.csv`` in ``out_dir`` when given."""
    sends = [Send(m.id, m.broker, m.dst) for m in plan.messages.values()
             if m.kind != "timeline"]
    units = {m.id: m.units for m in plan.messages.values()}
    tiers = {b.id: b.kind for b in plan.topology.brokers}
    classes = classify(folded, sends)
    res = route_spark(spark, folded, classes, held, estate.tree)
    fig = summary(outcomes(folded, res, sends), units, tiers)
    fig["message_classes"] = len(classes.keys)
    if out_dir is not None:
        import csv

        rows = class_rows(folded, res, tiers)
        with (out_dir / f"message-classes-{mode.label}.csv").open(
                "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["class"])
            w.writeheader()
            w.writerows(rows)
    return fig
