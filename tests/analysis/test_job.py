"""The Spark job: stage functions on tiny frames, and a hand-checked five-store estate.

The estate: HQ, one region, five stores, one consumer per store on its own queue, HQ sends
one message to each store queue.  Counts worked out by hand, per mode:

* tree: each store consumer's advisory goes store -> region -> HQ: 2 frames, 2 receipts,
  2 demand (region, HQ), none spilled; all 5 messages delivered.
* mesh TTL 1: store -> region only (the region's re-advertisement is refused for TTL):
  1 frame, 1 receipt, 1 demand at the region.  HQ has no demand, so its 5 messages are
  stranded; the region never forwards a message, so its receipts and demand are spilled.
* mesh TTL 2: store -> region, region -> HQ and the 4 sibling stores: 6 frames, 6
  receipts, 6 demand per consumer; the 4 sibling receipts are spilled (20 in all).
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
from pathlib import Path

import pytest
from pyspark.sql import Row
from pyspark.sql import types as T
from pyspark.testing import assertDataFrameEqual

from treefed import events as schema
from treefed.analysis import job

pytestmark = pytest.mark.spark

VALID_SCHEMA = T.StructType([f for f in job.event_schema().fields if f.name != job.CORRUPT])
HQ, REGION = "hq", "region-1"
STORES = [f"store-r1-{i:04d}" for i in range(1, 6)]


def frame(spark, *records: dict):
    """A valid-events frame (``valid_events`` shape) from partial records."""
    rows = [tuple(r.get(f.name, 1 if f.name == "v" else None) for f in VALID_SCHEMA.fields)
            for r in records]
    return spark.createDataFrame(rows, VALID_SCHEMA)


def ev(ts, broker, event, run="r", **fields) -> dict:
    return {"ts": float(ts), "broker": broker, "event": event, "run": run, **fields}


# ----------------------------------------------------------------------------- estate

def estate_log(mode: str) -> tuple[list[dict], dict]:
    """Event lines and summary.json of the five-store estate in ``mode``."""
    ttl = None if mode == "tree" else int(mode[-1])
    lines: list[dict] = []

    def add(ts, broker, event, **fields):
        lines.append(ev(ts, broker, event, run=f"tiny-{mode}", v=1, **fields))

    add(0, "runner", "run.started", scenario="tiny", mode=mode, engine="replay",
        brokers=7, links=6,
        params=json.dumps({"regions": 1, "stores_per_region": 5, "depth": 2}))
    for broker, role, parent in ([(HQ, "root", None), (REGION, "branch", HQ)]
                                 + [(s, "leaf", REGION) for s in STORES]):
        add(0, broker, "broker.info", role=role if ttl is None else "mesh",
            node_type=role, parent=parent)

    def advisory(ts, sender, receiver, consumer, dst, hops):
        common = dict(consumer=consumer, dst=dst, origin=consumer.split("/")[0],
                      kind="add", hops=hops)
        add(ts, sender, "advisory.sent", link=f"{sender}>{receiver}", peer=receiver,
            **common)
        add(ts, receiver, "advisory.received", link=f"{receiver}>{sender}", peer=sender,
            **common)
        add(ts, receiver, "demand.created", link=f"{receiver}>{sender}", peer=sender,
            consumer=consumer, dst=dst, origin=common["origin"], priority=0,
            conduit=True)

    for i, store in enumerate(STORES, start=1):
        consumer, dst, t0 = f"{store}/c1/1", f"queue://STORE.{i}", 10.0 * i
        add(t0, store, "consumer.added", consumer=consumer, dst=dst)
        # the last demand for consumer i lands 0.25 * i s after it was added
        if ttl == 1:
            advisory(t0 + 0.25 * i, store, REGION, consumer, dst, 1)
            for peer in [HQ] + [s for s in STORES if s != store]:
                add(t0 + 0.25 * i, REGION, "advisory.dropped", link=f"{REGION}>{peer}",
                    peer=peer, consumer=consumer, dst=dst, origin=store, kind="add",
                    reason="ttl")
        else:
            advisory(t0 + 0.125 * i, store, REGION, consumer, dst, 1)
            onward = [HQ] if ttl is None else [HQ] + [s for s in STORES if s != store]
            for peer in onward:
                advisory(t0 + 0.25 * i, REGION, peer, consumer, dst, 2)
    for i, store in enumerate(STORES, start=1):
        msg, dst = f"m-{i}", f"queue://STORE.{i}"
        add(100 + i, HQ, "message.produced", msg=msg, dst=dst)
        if ttl == 1:
            add(200, HQ, "message.stranded", msg=msg, dst=dst)
            continue
        add(100 + i, HQ, "message.forwarded", msg=msg, dst=dst, link="hq>region-1",
            peer=REGION, hops=1)
        add(100 + i, REGION, "message.forwarded", msg=msg, dst=dst,
            link=f"region-1>{store}", peer=store, hops=2)
        add(100 + i, store, "message.delivered", msg=msg, dst=dst,
            consumer=f"{store}/c1/1")
    add(200, "runner", "run.finished", scenario="tiny", mode=mode, engine="replay",
        brokers=7, links=6, params="{}")
    for line in lines:
        assert schema.validate_event(line) == [], line
    delivered = 0 if ttl == 1 else 5
    summary = dict(scenario="tiny", mode=mode, engine="replay", brokers=7, links=6,
                   advisory_frames=0, advisory_receipts=0, demand_created=0, expected=5,
                   delivered=delivered, duplicates=0, stranded=5 - delivered,
                   dropped=0, lost=0, events=len(lines), wall_s=0.5, peak_rss_mb=60.0)
    return lines, summary


BAD_LINES = ['{"ts": 3.0, "broker": "hq", "event": "consumer.added", "dst": ',
             '{"ts": 4.0, "broker": "hq"}']


def write_run(root: Path, mode: str, *, gz: bool = False, bad: bool = False) -> Path:
    lines, summary = estate_log(mode)
    text = "\n".join([json.dumps(line) for line in lines] + (BAD_LINES if bad else [])) + "\n"
    run = root / f"tiny-{mode}"
    run.mkdir()
    if gz:
        (run / "events.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    else:
        (run / "events.jsonl").write_text(text)
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "scenario.toml").write_text('name = "tiny"\n')
    return run


@pytest.fixture(scope="module")
def estate_dirs(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("runs")
    return [write_run(root, "tree"), write_run(root, "mesh-ttl1", bad=True),
            write_run(root, "mesh-ttl2", gz=True)]


@pytest.fixture(scope="module")
def report_run(spark, estate_dirs, tmp_path_factory):
    """``main`` run once over the three estate runs: (out dir, status, stdout, stderr)."""
    out = tmp_path_factory.mktemp("report")
    printed, complained = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(complained):
        status = job.main([str(d) for d in estate_dirs]
                          + ["--out", str(out), "--allow-partial"])
    return out, status, printed.getvalue(), complained.getvalue()


@pytest.fixture(scope="module")
def estate(spark, report_run):
    """(runs by mode, per-role rows), typed, read back from main's Parquet tables."""
    tables = report_run[0] / "tables"
    runs = {r["mode"]: r.asDict()
            for r in spark.read.parquet(str(tables / "runs.parquet")).collect()}
    roles = [r.asDict()
             for r in spark.read.parquet(str(tables / "per_role.parquet")).collect()]
    return runs, roles


# ----------------------------------------------------------------------------- stages

class TestReadEvents:
    def test_corrupt_and_eventless_lines_are_counted_and_skipped(self, spark, tmp_path):
        """A line that does not parse, or has no event, is counted per run, not fatal."""
        run = tmp_path / "run-a"
        run.mkdir()
        good = [json.dumps(ev(1, "hq", "consumer.added", consumer="hq/c1/1", dst="queue://A")),
                json.dumps(ev(2, "hq", "message.produced", msg="m", dst="queue://A"))]
        payload = "\n".join(good[:1] + BAD_LINES + good[1:]) + "\n"
        (run / "events.jsonl.gz").write_bytes(gzip.compress(payload.encode()))
        raw = job.read_events(spark, [str(run)]).cache()
        assertDataFrameEqual(job.line_counts(raw),
                             [Row(run="run-a", lines=4, bad_lines=2, finished=0)])
        valid = job.valid_events(raw).select("run", "event").collect()
        assert sorted(r.event for r in valid) == ["consumer.added", "message.produced"]
        assert {r.run for r in valid} == {"run-a"}

    def test_parts_are_read_with_the_first_file(self, spark, tmp_path):
        """A run written in parts (events.jsonl.gz, events.part-0001.jsonl.gz...) is one
        run: every part's lines, attributed to the directory."""
        run = tmp_path / "run-p"
        run.mkdir()
        for i, name in enumerate(["events.jsonl.gz", "events.part-0001.jsonl.gz",
                                  "events.part-0002.jsonl.gz"]):
            line = json.dumps(ev(i, "hq", "message.produced", msg=f"m{i}", dst="queue://A"))
            (run / name).write_bytes(gzip.compress((line + "\n").encode()))
        raw = job.read_events(spark, [str(run)])
        assertDataFrameEqual(job.line_counts(raw), [Row(run="run-p", lines=3, bad_lines=0, finished=0)])

    def test_a_big_local_log_is_cached_on_disk(self, tmp_path, monkeypatch):
        """The parsed log stays in memory (spilling) unless the local logs are big; a
        remote (URI) input keeps the memory level -- its executors have their own."""
        from pyspark import StorageLevel

        run = tmp_path / "run-big"
        run.mkdir()
        (run / "events.jsonl.gz").write_bytes(gzip.compress(b"{}\n" * 1000))
        assert job.log_bytes([str(run)]) == (run / "events.jsonl.gz").stat().st_size
        assert job.cache_level([str(run)]) == StorageLevel.MEMORY_AND_DISK
        monkeypatch.setattr(job, "DISK_CACHE_BYTES", 10)
        assert job.cache_level([str(run)]) == StorageLevel.DISK_ONLY
        assert job.log_bytes(["hdfs:///runs/x"]) is None
        assert job.cache_level(["hdfs:///runs/x"]) == StorageLevel.MEMORY_AND_DISK

    def test_directory_without_log_is_refused(self, tmp_path):
        """A run directory with no events file raises FileNotFoundError naming it."""
        with pytest.raises(FileNotFoundError, match="empty-run"):
            job.event_files([str(tmp_path / "empty-run")])


class TestRunInfo:
    def test_params_and_first_run_started(self, spark):
        """Scenario facts come from run.started; params JSON gives sizes and TTL."""
        params = json.dumps({"regions": 2, "stores_per_region": 50, "depth": 3,
                             "network_ttl": 2})
        events = frame(spark,
                       ev(1, "runner", "run.started", scenario="s", mode="mesh",
                          engine="replay", brokers=103, links=102, params=params),
                       ev(0, "hq", "broker.info", role="root"))
        assertDataFrameEqual(job.run_info(events), [Row(
            run="r", scenario="s", mode="mesh", engine="replay", brokers=103, links=102,
            regions=2, stores_per_region=50, depth=3, network_ttl=2)])


class TestInterest:
    def test_producers_forwarders_and_wildcards(self, spark):
        """A broker is interested where it sends: produces or forwards (a consumer of its
        own, or a delivery to one, is not sending); wildcards match concrete."""
        events = frame(
            spark,
            ev(1, "s1", "consumer.added", consumer="s1/c1/1", dst="queue://A"),
            ev(1, "hq", "message.produced", msg="m1", dst="queue://A"),
            ev(2, "r1", "message.forwarded", msg="m2", dst="topic://P.X"),
            ev(2, "r1", "advisory.received", dst="topic://P.>", kind="add"),
            ev(2, "s2", "advisory.received", dst="topic://P.>", kind="add"),
            ev(3, "s3", "message.delivered", msg="m3", dst="queue://B", consumer="c"),
            ev(3, "s4", "demand.created", consumer="x", dst="queue://C"),
        )
        assertDataFrameEqual(job.interest(events), [
            Row(run="r", broker="hq", dst="queue://A"),
            Row(run="r", broker="r1", dst="topic://P.X"),
            Row(run="r", broker="r1", dst="topic://P.>"),
        ])


def interest_of(spark, *pairs):
    return spark.createDataFrame([("r", b, d) for b, d in pairs],
                                 "run string, broker string, dst string")


class TestAdvisoryMetrics:
    def test_frames_receipts_and_spill(self, spark):
        """Only adds count (s1 saw only a removal); a receipt without interest spills."""
        events = frame(
            spark,
            ev(1, "r1", "advisory.received", dst="queue://A", kind="add"),
            ev(1, "r1", "advisory.received", dst="queue://B", kind="add"),
            ev(1, "r1", "advisory.sent", dst="queue://A", kind="add"),
            ev(1, "r1", "advisory.sent", dst="queue://B", kind="add"),
            ev(2, "r1", "advisory.sent", dst="queue://A", kind="remove"),
            ev(2, "s1", "advisory.received", dst="queue://A", kind="remove"),
        )
        result = job.advisory_metrics(events, interest_of(spark, ("r1", "queue://A")))
        assertDataFrameEqual(result, [
            Row(run="r", broker="r1", advisory_frames=2, advisory_receipts=2,
                spilled_advisories=1, sibling_spill=0, downward_spill=0),
        ])

    def test_spill_split_by_origin(self, spark):
        """At a store: another store's consumer is sibling spill, a region's or HQ's is
        downward interest; spill at a region is neither; useful receipts are neither.
        Stores are leaves by broker.info, or ``store-`` ids when there is none."""
        def rx(broker, origin, dst="queue://Q"):
            return ev(1, broker, "advisory.received", dst=dst, kind="add", origin=origin,
                      consumer=f"{origin}/app/1")
        events = frame(
            spark,
            rx("store-1", "store-2"), rx("store-1", "region-1"), rx("store-1", "hq"),
            rx("store-1", "store-3", dst="queue://USED"),
            rx("region-1", "store-2"),
            rx("shop-9", "shop-8"),             # leaves by broker.info below
            ev(0, "shop-9", "broker.info", role="leaf"),
            ev(0, "shop-8", "broker.info", role="leaf"),
        )
        roles = job.broker_roles(events)
        used = interest_of(spark, ("store-1", "queue://USED"))
        assertDataFrameEqual(job.advisory_metrics(events, used, roles), [
            Row(run="r", broker="store-1", advisory_frames=0, advisory_receipts=4,
                spilled_advisories=3, sibling_spill=1, downward_spill=2),
            Row(run="r", broker="region-1", advisory_frames=0, advisory_receipts=1,
                spilled_advisories=1, sibling_spill=0, downward_spill=0),
            Row(run="r", broker="shop-9", advisory_frames=0, advisory_receipts=1,
                spilled_advisories=1, sibling_spill=1, downward_spill=0),
        ])


class TestDemandMetrics:
    def test_created_wasted_and_peak_held(self, spark):
        """Peak held is the running created-removed maximum; a same-tick swap nets out."""
        events = frame(
            spark,
            ev(1, "r1", "demand.created", consumer="a", dst="queue://A"),
            ev(2, "r1", "demand.created", consumer="b", dst="queue://B"),
            ev(3, "r1", "demand.removed", consumer="a", dst="queue://A"),
            ev(3, "r1", "demand.created", consumer="c", dst="queue://C"),
            ev(4, "r1", "demand.removed", consumer="b", dst="queue://B"),
            ev(5, "r1", "demand.created", consumer="d", dst="queue://D"),
            ev(1, "s1", "demand.removed", consumer="x", dst="queue://X"),
        )
        result = job.demand_metrics(events, interest_of(spark, ("r1", "queue://A")))
        assertDataFrameEqual(result, [
            Row(run="r", broker="r1", demand_created=4, wasted_demand=3, max_demand=2),
            Row(run="r", broker="s1", demand_created=0, wasted_demand=0, max_demand=0),
        ])


class TestDeliveryMetrics:
    def test_copies_duplicates_and_stranded(self, spark):
        """A queue message counts once, a topic one once per subscriber; extras duplicate."""
        events = frame(
            spark,
            ev(1, "s1", "message.delivered", msg="m1", dst="queue://A", consumer="c1"),
            ev(2, "s2", "message.delivered", msg="m1", dst="queue://A", consumer="c2"),
            ev(1, "s1", "message.delivered", msg="m2", dst="topic://T", consumer="c1"),
            ev(1, "s2", "message.delivered", msg="m2", dst="topic://T", consumer="c2"),
            ev(3, "s1", "message.delivered", msg="m2", dst="topic://T", consumer="c1"),
            ev(9, "hq", "message.stranded", msg="m3", dst="queue://B"),
        )
        assertDataFrameEqual(job.delivery_metrics(events), [
            Row(run="r", delivered=3, deliveries=5, duplicates=2, stranded=1)])


class TestConvergence:
    def test_last_demand_per_add_with_local_ids_and_readds(self, spark):
        """Each add converges at its last demand before the next add; local ids qualify."""
        events = frame(
            spark,
            ev(0, "s1", "consumer.added", consumer="s1/c1/1", dst="queue://A"),
            ev(0.5, "r1", "demand.created", consumer="s1/c1/1", dst="queue://A"),
            ev(2, "hq", "demand.created", consumer="s1/c1/1", dst="queue://A"),
            ev(10, "s2", "consumer.added", consumer="c9/1", dst="queue://B"),
            ev(13, "r1", "demand.created", consumer="s2/c9/1", dst="queue://B"),
            ev(0, "s3", "consumer.added", consumer="s3/c1/1", dst="queue://C"),
            ev(1, "r1", "demand.created", consumer="s3/c1/1", dst="queue://C"),
            ev(50, "s3", "consumer.added", consumer="s3/c1/1", dst="queue://C"),
            ev(51.5, "r1", "demand.created", consumer="s3/c1/1", dst="queue://C"),
            ev(5, "s4", "consumer.added", consumer="s4/c1/1", dst="queue://D"),
        )
        # first adds: 2.0, 3.0, 1.0 and none for s4 -> median 2.0, p99 3.0 (s3's re-add,
        # 1.5 s, is not a first convergence)
        assertDataFrameEqual(job.convergence(events), [
            Row(run="r", consumers=4, convergence_median_s=2.0, convergence_p99_s=3.0)])

    def test_fault_events_cut_first_convergence_and_are_timed_apart(self, spark):
        """A link cut at 10 s and restored at 20 s: the consumer added at 0 converged at
        0.5 s (its demand re-created at 20.25 s is recovery); recovery per fault event is
        the last demand change before the next one: 10 s -> 0.1 s, 20 s -> 0.25 s."""
        events = frame(
            spark,
            ev(0, "s1", "link.up", link="l"), ev(0, "r1", "link.up", link="l"),
            ev(0, "s1", "consumer.added", consumer="s1/c/1", dst="queue://A"),
            ev(0.5, "r1", "demand.created", consumer="s1/c/1", dst="queue://A"),
            ev(10, "s1", "link.down", link="l"), ev(10, "r1", "link.down", link="l"),
            ev(10.1, "r1", "demand.removed", consumer="s1/c/1", dst="queue://A"),
            ev(20, "s1", "link.up", link="l"), ev(20, "r1", "link.up", link="l"),
            ev(20.25, "r1", "demand.created", consumer="s1/c/1", dst="queue://A"),
        )
        faults = job.fault_events(events)
        assertDataFrameEqual(faults, [Row(run="r", fault_ts=10.0, downs=2, ups=0),
                                      Row(run="r", fault_ts=20.0, downs=0, ups=2)])
        assertDataFrameEqual(job.convergence(events, faults), [
            Row(run="r", consumers=1, convergence_median_s=0.5, convergence_p99_s=0.5)])
        assertDataFrameEqual(job.recovery(events, faults), [
            Row(run="r", fault_events=2, recovery_max_s=0.25,
                recovery="10.000 s: 0.100, 20.000 s: 0.250")])


class TestPerRole:
    def test_grouped_by_role_and_tier(self, spark):
        """Brokers roll up by (role, tier); a broker without broker.info is 'unknown'."""
        cols = ("advisory_frames", "advisory_receipts", "spilled_advisories",
                "demand_created", "wasted_demand", "max_demand", "deliveries", "stranded",
                "sibling_spill", "downward_spill")
        brokers = spark.createDataFrame(
            [("r", "store-r1-0001", 1, 4, 4, 4, 4, 4, 1, 0, 3, 1),
             ("r", "store-r1-0002", 1, 4, 3, 4, 3, 2, 1, 0, 3, 0),
             ("r", "hq", 0, 5, 0, 5, 0, 5, 0, 2, 0, 0),
             ("r", "zone-1", 0, 1, 1, 1, 1, 1, 0, 0, 0, 0)],
            "run string, broker string, " + ", ".join(f"{c} long" for c in cols))
        roles = spark.createDataFrame(
            [("r", "store-r1-0001", "mesh"), ("r", "store-r1-0002", "mesh"),
             ("r", "hq", "mesh")], "run string, broker string, role string")
        info = spark.createDataFrame([("r", "s", "mesh-ttl2", 2, 2)],
                                     "run string, scenario string, mode string, "
                                     "stores_per_region long, network_ttl long")
        common = dict(run="r", scenario="s", mode="mesh-ttl2", ttl=2, stores_per_region=2)
        assertDataFrameEqual(job.per_role(brokers, roles, info), [
            Row(**common, role="mesh", tier="hq", brokers=1, advisory_frames=0,
                advisory_receipts=5, spilled_advisories=0, demand_created=5,
                wasted_demand=0, max_demand_per_broker=5, deliveries=0, stranded=2,
                sibling_spill=0, downward_spill=0),
            Row(**common, role="mesh", tier="store", brokers=2, advisory_frames=2,
                advisory_receipts=8, spilled_advisories=7, demand_created=8,
                wasted_demand=7, max_demand_per_broker=4, deliveries=2, stranded=0,
                sibling_spill=6, downward_spill=1),
            Row(**common, role="unknown", tier="zone", brokers=1, advisory_frames=0,
                advisory_receipts=1, spilled_advisories=1, demand_created=1,
                wasted_demand=1, max_demand_per_broker=1, deliveries=0, stranded=0,
                sibling_spill=0, downward_spill=0),
        ])


class TestRunsTable:
    def test_logs_without_run_started_or_summary(self, spark):
        """A gathered log (no run.started, no summary.json) still gets a full row."""
        events = frame(spark, ev(1, "hq", "consumer.added", run="x", consumer="hq/c/1",
                                 dst="queue://A"))
        lines = spark.createDataFrame([("x", 12, 1)], "run string, lines long, bad_lines long")
        cols = ("advisory_frames", "advisory_receipts", "spilled_advisories",
                "demand_created", "wasted_demand", "max_demand", "deliveries", "stranded",
                "sibling_spill", "downward_spill")
        brokers = spark.createDataFrame(
            [("x", "hq", 3, 4, 1, 4, 1, 4, 0, 0, 0, 0),
             ("x", "region-1", 1, 2, 2, 2, 2, 1, 0, 0, 0, 0)],
            "run string, broker string, " + ", ".join(f"{c} long" for c in cols))
        empty = spark.createDataFrame([], "run string, expected long, wall_s double, "
                                          "peak_rss_mb double, scenario string, mode string, "
                                          "engine string, brokers long, links long")
        delivery = spark.createDataFrame([("x", 0, 0, 0, 2)], "run string, delivered long, "
                                         "deliveries long, duplicates long, stranded long")
        converged = job.convergence(events)
        (row,) = job.runs_table(job.run_info(events), empty, lines, brokers, delivery,
                                converged).collect()
        assert {k: row[k] for k in ("run", "scenario", "mode", "ttl", "brokers", "consumers",
                                    "advisory_receipts", "spilled_advisories",
                                    "advisories_per_consumer", "max_demand_per_broker",
                                    "expected", "delivery_ratio", "stranded", "lines",
                                    "bad_lines")} == dict(
            run="x", scenario="x", mode="unknown", ttl=None, brokers=2, consumers=1,
            advisory_receipts=6, spilled_advisories=3, advisories_per_consumer=6.0,
            max_demand_per_broker=4, expected=None, delivery_ratio=None, stranded=2,
            lines=12, bad_lines=1)


# ----------------------------------------------------------------------------- estate

def picked(row: dict, *names: str) -> dict:
    return {n: row[n] for n in names}


METRICS = ("advisory_frames", "advisory_receipts", "spilled_advisories",
           "advisories_per_consumer", "demand_created", "wasted_demand",
           "max_demand_per_broker", "expected", "delivered", "duplicates", "stranded",
           "consumers")


@pytest.mark.slow   # shares one full `main` run (about 8 s on a quiet 2-core machine)
class TestHandCheckedEstate:
    def test_tree_counts_match_hand_count(self, estate):
        """Tree: 2 receipts and 2 demand per store consumer, nothing spilled, all delivered."""
        runs, _ = estate
        assert picked(runs["tree"], *METRICS) == dict(
            advisory_frames=10, advisory_receipts=10, spilled_advisories=0,
            advisories_per_consumer=2.0, demand_created=10, wasted_demand=0,
            max_demand_per_broker=5, expected=5, delivered=5, duplicates=0, stranded=0,
            consumers=5)
        assert runs["tree"]["ttl"] is None

    def test_ttl1_strands_everything_hq_sends(self, estate):
        """TTL 1: demand only at the region, all 5 HQ messages stranded, region spill."""
        runs, _ = estate
        assert picked(runs["mesh-ttl1"], *METRICS) == dict(
            advisory_frames=5, advisory_receipts=5, spilled_advisories=5,
            advisories_per_consumer=1.0, demand_created=5, wasted_demand=5,
            max_demand_per_broker=5, expected=5, delivered=0, duplicates=0, stranded=5,
            consumers=5)
        assert runs["mesh-ttl1"]["ttl"] == 1

    def test_ttl2_spills_to_every_sibling_store(self, estate):
        """TTL 2: 6 receipts per consumer, the 4 at sibling stores spilled."""
        runs, _ = estate
        assert picked(runs["mesh-ttl2"], *METRICS) == dict(
            advisory_frames=30, advisory_receipts=30, spilled_advisories=20,
            advisories_per_consumer=6.0, demand_created=30, wasted_demand=20,
            max_demand_per_broker=5, expected=5, delivered=5, duplicates=0, stranded=0,
            consumers=5)
        assert runs["mesh-ttl2"]["delivery_ratio"] == 1.0
        # all 20 at stores about another store's consumer; none came down from above
        assert picked(runs["mesh-ttl2"], "sibling_spill", "downward_spill") == \
            dict(sibling_spill=20, downward_spill=0)
        # TTL 1's 5 spilled receipts sit at the region: neither sibling nor downward
        assert picked(runs["mesh-ttl1"], "sibling_spill", "downward_spill") == \
            dict(sibling_spill=0, downward_spill=0)

    def test_run_facts_convergence_and_bad_lines(self, estate):
        """Run facts come from run.started; quantiles from the hand-placed demand times."""
        runs, _ = estate
        for mode, row in runs.items():
            lines, _ = estate_log(mode)
            bad = 2 if mode == "mesh-ttl1" else 0
            assert picked(row, "scenario", "brokers", "links", "regions",
                          "stores_per_region", "depth", "lines", "bad_lines",
                          "convergence_median_s", "convergence_p99_s", "run_wall_s") == \
                dict(scenario="tiny", brokers=7, links=6, regions=1, stores_per_region=5,
                     depth=2, lines=len(lines) + bad, bad_lines=bad,
                     convergence_median_s=0.75, convergence_p99_s=1.25, run_wall_s=0.5)
            assert list(row) == list(job.RUN_COLUMNS)

    def test_ttl2_waste_lands_at_stores(self, estate):
        """Per tier at TTL 2: the stores hold all 20 wasted demand, HQ and region none."""
        _, roles = estate
        ttl2 = {r["tier"]: r for r in roles if r["mode"] == "mesh-ttl2"}
        assert {t: (r["role"], r["brokers"], r["advisory_receipts"], r["spilled_advisories"],
                    r["wasted_demand"], r["max_demand_per_broker"])
                for t, r in ttl2.items()} == {
            "hq": ("mesh", 1, 5, 0, 0, 5), "region": ("mesh", 1, 5, 0, 0, 5),
            "store": ("mesh", 5, 20, 20, 20, 4)}

    def test_tree_roles_come_from_broker_info(self, estate):
        """Tree roles: root at HQ, branch at the region, leaves send one frame each."""
        _, roles = estate
        tree = {r["role"]: (r["tier"], r["advisory_frames"], r["advisory_receipts"])
                for r in roles if r["mode"] == "tree"}
        assert tree == {"root": ("hq", 0, 5), "branch": ("region", 5, 5),
                        "leaf": ("store", 5, 0)}


class TestMain:
    @pytest.mark.slow   # the same shared `main` run
    @pytest.mark.slow
    def test_writes_tables_and_report(self, spark, report_run):
        """main writes runs.csv, per_role.csv, Parquet tables and the report, says where."""
        out, status, printed, complained = report_run
        assert status == 0
        with (out / "runs.csv").open() as f:
            rows = list(csv.DictReader(f))
        assert [r["mode"] for r in rows] == ["tree", "mesh-ttl1", "mesh-ttl2"]
        assert [r["spilled_advisories"] for r in rows] == ["0", "5", "20"]
        # the report's columns, then where each row came from (emulated here; `--model`
        # adds modelled rows, tests/model/test_report_modelled.py)
        assert list(rows[0]) == [*job.RUN_COLUMNS, "source"]
        assert {r["source"] for r in rows} == {"emulated"}
        assert (out / "per_role.csv").read_text().startswith(",".join(job.ROLE_COLUMNS))
        for table in ("runs", "per_role", "brokers"):
            assert list((out / "tables" / f"{table}.parquet").glob("*.parquet"))
        assert (out / "index.html").is_file() and (out / "report.md").is_file()
        assert str((out / "index.html").resolve()) in printed
        assert "tiny-mesh-ttl1: 2 of" in complained
        assert spark.range(1).count() == 1   # main left the shared session running

    @pytest.mark.slow   # the same shared `main` run
    def test_partial_run_is_flagged(self, report_run):
        """The run with 2 unparseable lines of ~60 is included only because
        --allow-partial was given, and says so."""
        out, _, _, complained = report_run
        assert "tiny-mesh-ttl1: included although partial" in complained
        page = (out / "index.html").read_text()
        assert "mesh-ttl1 [partial]" in page and "do not parse" in page

    def test_missing_log_exits_2(self, tmp_path, capsys):
        """A run directory without an event log is reported, exit status 2."""
        assert job.main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")]) == 2
        assert "nowhere" in capsys.readouterr().err
