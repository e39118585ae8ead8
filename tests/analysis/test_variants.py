"""The tree variants' figures (issue 18): HQ's demand entries, extra hops and the advisory
frames of each fault event's recovery, on a hand-written event log, and their report
table.

The estate: ``hq``; ``region-1`` above ``s1``, ``region-2`` above ``s2``.  Run ``t``
(mode tree-summary):

* demand at hq: c1 created at 1 s, c2 at 2 s (2 held), c1 removed at 3 s, c3 created at
  4 s (2 held again); region-1 creates 3 (not the root).  root_demand = 2.
* messages (down = to the peer whose parent is the sender):
  m1 hq->region-1, region-1->s1, delivered at s1: 2 down, both towards its consumer, 0 extra;
  m2 hq->region-2, delivered nowhere (it rests at region-2): 1 extra;
  m3 s1->region-1 and region-1->hq (up, never counted), hq->region-2, region-2->s2,
     delivered at s2: 0 extra;
  m4 hq->region-1, region-1->s1, delivered nowhere: 2 extra.  extra_hops = 3.
* faults: region-1's link to hq down at 10 s (both ends log it: one fault event), up at
  20 s (one event).  advisory.sent at 5 s (before any fault: not counted), 10, 12, 15 s
  (3 in [10, 20)), 20, 21 s (2 from 20 s to the end).  recovery_frames = 5,
  "10.000 s: 3, 20.000 s: 2".

Run ``m`` (mode mesh-ttl2), one down forward delivered nowhere: extra_hops is null (the
figure is computed for tree modes only), no fault events -> no recovery frames.
"""

from __future__ import annotations

import json

import pytest
from pyspark.sql import Row
from pyspark.sql import types as T
from pyspark.testing import assertDataFrameEqual

from treefed.analysis import job, report
from treefed.analysis.variants import variant_metrics

pytestmark = pytest.mark.spark

VALID_SCHEMA = T.StructType([f for f in job.event_schema().fields if f.name != job.CORRUPT])
PARENTS = {"hq": None, "region-1": "hq", "region-2": "hq", "s1": "region-1",
           "s2": "region-2"}


def frame(spark, records):
    rows = [tuple(r.get(f.name, 1 if f.name == "v" else None) for f in VALID_SCHEMA.fields)
            for r in records]
    return spark.createDataFrame(rows, VALID_SCHEMA)


def estate(run: str, mode: str) -> list[dict]:
    lines = []

    def add(ts, broker, event, **fields):
        lines.append({"ts": float(ts), "broker": broker, "event": event, "run": run,
                      **fields})

    add(0, "runner", "run.started", scenario="tiny", mode=mode, engine="replay", brokers=5,
        links=4, params=json.dumps({"regions": 2, "stores_per_region": 1, "depth": 2}))
    for broker, parent in PARENTS.items():
        add(0, broker, "broker.info", role="leaf", node_type="leaf", parent=parent)
    return lines, add


def tree_log():
    lines, add = estate("t", "tree-summary")
    for ts, event, consumer in ((1, "demand.created", "s1/c1"),
                                (2, "demand.created", "s2/c2"),
                                (3, "demand.removed", "s1/c1"),
                                (4, "demand.created", "s1/c3")):
        add(ts, "hq", event, consumer=consumer, dst="queue://Q", peer="region-1")
    for i in range(3):
        add(1, "region-1", "demand.created", consumer=f"s1/x{i}", dst="queue://Q",
            peer="s1")
    for msg, hops, delivered in (("m1", [("hq", "region-1"), ("region-1", "s1")], "s1"),
                                 ("m2", [("hq", "region-2")], None),
                                 ("m3", [("s1", "region-1"), ("region-1", "hq"),
                                         ("hq", "region-2"), ("region-2", "s2")], "s2"),
                                 ("m4", [("hq", "region-1"), ("region-1", "s1")], None)):
        for sender, peer in hops:
            add(6, sender, "message.forwarded", msg=msg, dst="queue://Q", peer=peer)
        if delivered:
            add(7, delivered, "message.delivered", msg=msg, dst="queue://Q")
    for ts, event in ((10, "link.down"), (20, "link.up")):
        add(ts, "hq", event, link="hq>region-1", peer="region-1")
        add(ts, "region-1", event, link="region-1>hq", peer="hq")
    for ts in (5, 10, 12, 15, 20, 21):
        add(ts, "s1", "advisory.sent", consumer="s1/c1", dst="queue://Q", kind="add",
            peer="region-1")
    return lines


def mesh_log():
    lines, add = estate("m", "mesh-ttl2")
    add(6, "hq", "message.forwarded", msg="z", dst="queue://Q", peer="region-1")
    return lines


def test_variant_figures_by_hand(spark):
    events = frame(spark, tree_log() + mesh_log())
    roles = job.broker_roles(events)
    brokers = job.broker_metrics(events, job.interest(events), roles)
    got = variant_metrics(events, brokers, roles, job.run_info(events),
                          job.fault_events(events))
    assertDataFrameEqual(got, [
        Row(run="t", root_demand=2, extra_hops=3, recovery_frames=5,
            recovery_frames_by_event="10.000 s: 3, 20.000 s: 2"),
        Row(run="m", root_demand=0, extra_hops=None, recovery_frames=None,
            recovery_frames_by_event=None)])


def test_runs_table_carries_the_variant_columns(spark, tmp_path):
    """The whole job: runs.csv has the figures of run t (the directory is the run)."""
    run = tmp_path / "t"
    run.mkdir()
    lines = [{k: v for k, v in r.items() if k != "run"} | {"v": 1} for r in tree_log()]
    (run / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    tables = job.compute(spark, [str(run)])
    row = tables.runs.collect()[0].asDict()
    tables.release()
    assert list(row) == list(job.RUN_COLUMNS)
    assert (row["root_demand"], row["extra_hops"], row["recovery_frames"],
            row["recovery_frames_by_event"]) == (2, 3, 5, "10.000 s: 3, 20.000 s: 2")


def _row(mode, **figures):
    base = dict(scenario="churn", brokers=5, stores_per_region=1, mode=mode, ttl=None,
                expected=10, delivered=10, stranded=0, fault_events=2, advisory_frames=40)
    return base | figures


def test_report_table_against_the_plain_tree():
    """Tree 40 entries at HQ, summary 8 (8 / 40 = 0.2x) with 3 extra hops; the plain
    tree sends 30 frames after its faults, resync 3 (0.1x).  A mesh run and an estate
    without a variant are left out."""
    runs = [_row("tree", root_demand=40, extra_hops=0, recovery_frames=30,
                 recovery_frames_by_event="10.000 s: 20, 20.000 s: 10"),
            _row("tree-summary", root_demand=8, extra_hops=3, recovery_frames=30,
                 recovery_frames_by_event="10.000 s: 20, 20.000 s: 10"),
            _row("tree-resync", root_demand=40, extra_hops=0, recovery_frames=3,
                 recovery_frames_by_event="10.000 s: 2, 20.000 s: 1"),
            _row("mesh-ttl2", ttl=2, root_demand=99),
            _row("tree", scenario="other", root_demand=1)]
    table = report.variants(sorted(runs, key=report._mode_key))
    assert [r[2] for r in table] == ["tree", "tree-resync", "tree-summary"]
    tree, resync, summary = table
    assert summary[3:9] == ["8", "0.2x", "3", "40", "30", "1x"]
    assert resync[3:10] == ["40", "1x", "0", "40", "3", "0.1x", "10.000 s: 2, 20.000 s: 1"]
    assert tree[4] == "" and tree[8] == ""
    no_fault = report.variants([_row("tree", fault_events=0, recovery_frames=None),
                                _row("tree-resync", fault_events=0, recovery_frames=None)])
    assert no_fault[1][7] == "no fault" and no_fault[1][8] == ""
    assert report.mode_cost("tree-resync") == report.MODE_COSTS["tree-resync"]
    assert report.mode_cost("tree-summary") == report.MODE_COSTS["tree-summary"]
