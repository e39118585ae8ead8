"""The two-pass plan (analysis/passes.py) against the stage-per-metric plan (job.compute):
the same runs.csv and per_role.csv byte for byte and the same Parquet tables, on runner
runs (Parquet parts and their JSON lines: retail-small in every mode, churn with its link
cuts, consumer churn and broker restart) and hand-written logs (the five-store estate of
test_job with gzip and unparseable lines, the tree-variant estate of test_variants with
fault events and extra hops, and wildcard topics with a duplicate delivery).  And
``spark_percentile`` against Spark's own percentile_approx."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import shutil
from pathlib import Path

import pytest

from treefed.analysis.passes import site_tier, spark_percentile

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- no Spark

def test_percentile_is_the_exact_rank_pick_below_5000_values():
    values = [float(v) for v in range(1, 101)]
    random.Random(1).shuffle(values)
    assert spark_percentile(values, 0.5) == 50.0      # ceil(0.5 * 100) = 50th
    assert spark_percentile(values, 0.99) == 99.0
    assert spark_percentile([3.0], 0.5) == 3.0
    assert spark_percentile([2.0, 1.0], 0.5) == 1.0   # the lower median
    assert spark_percentile([], 0.5) is None
    many = [float(v) for v in range(4999)]
    assert spark_percentile(many, 0.5) == many[math.ceil(0.5 * 4999) - 1]


def test_site_tier_like_job_site_tier():
    assert [site_tier(b) for b in ("hq", "hq-2", "region-1", "store-r1-0001", "edge-9",
                                   "runner", None, "-x", "r2-d2")] == \
        ["hq", "hq", "region", "store", "edge", "other", "other", "other", "other"]


def test_hot_rows_are_facts_rows():
    """hot_facts' grouped integer rows back as facts' rows, by hand: the P code's bits
    (spill at a store from a store or not, wasted demand, deliveries, stranded; none for
    the rows folded into _PLAIN_CODE), the event's own fact
    (T +n / -n, S, L, A with facts' qualified consumer id), broker names by dictionary."""
    import pyarrow as pa

    from treefed.analysis.passes import _PLAIN_CODE, RunCodes, _hot_rows
    from treefed.scenario.parquet_parts import EVENT_CODES

    def ev(name, removal=False):
        return 2 * EVENT_CODES.index(name) + removal

    c = RunCodes(run="r", key=7, brokers=["store-1", "region-1"], dsts={"queue://q": 0},
                 consumers=["c/1", "store-1/c/2"], parts=[], rest="")
    rows = [  # broker, event, ts, consumer, useful, from_store, count
        (0, ev("advisory.received"), None, None, False, True, 3),   # sibling spill
        (0, ev("advisory.received"), None, None, False, False, 2),  # downward spill
        (1, ev("advisory.received"), None, None, False, True, 1),   # spill, not at a store
        (0, ev("advisory.received"), None, None, True, True, 4),    # useful
        (0, ev("advisory.received", True), None, None, False, False, 1),  # a removal
        (1, ev("advisory.sent"), 2.0, None, False, False, 5),
        (1, ev("advisory.sent", True), 3.0, None, False, False, 1),
        (1, ev("demand.created"), 1.5, None, False, False, 2),
        (1, ev("demand.removed"), 4.0, None, False, False, 1),
        (0, ev("message.stranded"), None, None, False, False, 6),
        (0, ev("link.down"), 5.0, None, False, False, 1),
        (0, ev("consumer.added"), 1.0, 0, False, False, 1),   # "c/1" at store-1
        (0, ev("consumer.added"), 1.0, 1, False, False, 1),   # already "store-1/..."
        (0, ev("consumer.added"), 1.0, None, False, False, 1),
        (1, _PLAIN_CODE, None, None, False, False, 7),   # produced, forwarded, ...
        (0, ev("message.delivered"), None, None, False, False, 3),
    ]
    names = ("broker_code", "event_code", "ts", "consumer_code", "useful", "from_store",
             "count")
    table = pa.table({"run_key": [7] * len(rows),
                      **{n: [r[k] for r in rows] for k, n in enumerate(names)}})
    got = list(_hot_rows(table, {"r": c}, stores={(7, 0)}))
    p = [(b, code, n) for tag, _, b, _, _, _, code, n in got if tag == "P"]
    assert p == [("store-1", 16 | 32 | 64, 3), ("store-1", 16 | 32 | 128, 2),
                 ("region-1", 16 | 32, 1), ("store-1", 16, 4), ("store-1", 0, 1),
                 ("region-1", 8, 5), ("region-1", 0, 1), ("region-1", 256 | 512, 2),
                 ("region-1", 0, 1), ("store-1", 2048, 6), ("store-1", 0, 1),
                 ("store-1", 0, 1), ("store-1", 0, 1), ("store-1", 0, 1),
                 ("region-1", 0, 7), ("store-1", 1024, 3)]
    rest = [t for t in got if t[0] != "P"]
    assert rest == [("S", "r", None, None, None, 2.0, 0, 5),
                    ("S", "r", None, None, None, 3.0, 0, 1),
                    ("T", "r", "region-1", None, None, 1.5, 0, 2),
                    ("T", "r", "region-1", None, None, 4.0, 0, -1),
                    ("L", "r", None, "link.down", None, 5.0, 0, 1),
                    ("A", "r", None, "store-1/c/1", None, 1.0, 0, 1),
                    ("A", "r", None, "store-1/c/2", None, 1.0, 0, 1),
                    ("A", "r", None, "store-1", None, 1.0, 0, 1)]


def _encoded(rows: list[tuple], names: tuple[str, ...]):
    """``rows`` (values of ``names``, every other column null) as a whole events table
    encoded by a new Coder of run "r": (the coder, the coded table)."""
    import pyarrow as pa

    from treefed.scenario.parquet_parts import Coder, arrow_schema

    table = pa.Table.from_pylist([dict(zip(names, r)) for r in rows]).cast(
        pa.schema([arrow_schema().field(n) for n in names]))
    full = pa.table({n: table.column(n) if n in names else pa.nulls(len(table), f.type)
                     for n, f in zip(arrow_schema().names, arrow_schema())})
    coder = Coder("r")
    return coder, coder.encode(full)


def test_message_rows_are_facts_rows(tmp_path):
    """A run's message file back as facts' M and F rows and the send pairs, by hand:
    the copy key as facts' concat_ws (nulls skipped; a topic's subscriber = the broker +
    the consumer id's last segment, so two consumers with that segment are one copy),
    forwards kept for tree runs only."""
    import pyarrow.parquet as pq

    from treefed.analysis.passes import RunCodes, _message_codes, _message_rows
    from treefed.scenario.parquet_parts import MESSAGE_FILE

    rows = [  # event, broker, dst, msg, peer, consumer
        ("message.produced", "hq", "queue://q", "m1", None, None),
        ("message.produced", "hq", "queue://q", "m2", None, None),
        ("message.forwarded", "hq", "queue://q", "m1", "store-1", None),
        ("message.forwarded", "hq", "queue://q", "m1", "store-1", None),
        ("message.forwarded", "hq", "topic://t.*", "m3", "store-1", None),   # rest file
        ("message.delivered", "store-1", "queue://q", "m1", None, "store-1/c/1"),
        ("message.delivered", "store-1", "queue://q", "m1", None, "store-1/c/2"),
        ("message.delivered", "store-1", "topic://t", "m4", None, "store-1/c/1"),
        ("message.delivered", "store-1", "topic://t", "m4", None, "other/c/1"),  # same copy
        ("message.delivered", "store-1", "temp-topic://x", None, None, "solo"),
        ("message.delivered", "store-1", "topic://t", "m5", None, None),
        ("message.delivered", "store-1", None, "m6", None, "c"),
        ("message.produced", None, "queue://q", "m7", None, None),            # rest file
    ]
    coder, encoded = _encoded(rows, ("event", "broker", "dst", "msg", "peer", "consumer"))
    messages = coder.messages(encoded)
    assert messages.num_rows == len(rows) - 2
    pq.write_table(messages, tmp_path / MESSAGE_FILE)
    inverse = sorted(coder.brokers, key=coder.brokers.__getitem__)
    c = RunCodes(run="r", key=coder.key, brokers=inverse, dsts=dict(coder.dsts),
                 consumers=sorted(coder.consumers, key=coder.consumers.__getitem__),
                 parts=[], rest="", messages=str(tmp_path / MESSAGE_FILE),
                 msgs=sorted(coder.msgs, key=coder.msgs.__getitem__))
    found = _message_codes({"r": c})
    sends = found["r"].sends
    assert sends.num_rows == 1 and \
        (inverse[sends["broker_code"][0].as_py()],
         {v: k for k, v in c.dsts.items()}[sends["dst_code"][0].as_py()]) == ("hq", "queue://q")
    got = sorted(_message_rows(found, {"r": c}, ["r"]), key=repr)
    assert got == sorted([
        ("M", "r", "store-1", "m1\x00queue://q", "m1", None, 0, 2),
        ("M", "r", "store-1", "m4\x00topic://t\x00store-1/1", "m4", None, 0, 2),
        ("M", "r", "store-1", "temp-topic://x\x00store-1/solo", None, None, 0, 1),
        ("M", "r", "store-1", "m5\x00topic://t\x00store-1", "m5", None, 0, 1),
        ("M", "r", "store-1", "m6", "m6", None, 0, 1),
        ("F", "r", "hq", "store-1", "m1", None, 0, 2),
    ], key=repr)
    assert [t for t in _message_rows(found, {"r": c}, []) if t[0] == "F"] == []


def test_rest_codes_are_pass_1s_broker_info(tmp_path):
    """A run's rest file read by codes as pass 1 reads it: each broker's latest
    broker.info (max_by over ts: a null ts never wins, of equal times the first row), its
    broker.info rows counted (facts' P rows), the send pairs of message rows with a plain
    destination; a broker.info row with a wildcard destination leaves the run's infos to
    the string passes (pass 1 makes a pattern of it)."""
    import pyarrow.parquet as pq

    from treefed.analysis.passes import RunCodes, _info_facts, _info_rows, _rest_codes
    from treefed.scenario.parquet_parts import REST_FILE

    def rest_of(rows):
        coder, encoded = _encoded(rows, ("event", "broker", "dst", "role", "node_type",
                                         "parent", "ts"))
        rest = coder.rest(encoded)
        pq.write_table(rest, tmp_path / REST_FILE)
        return RunCodes(run="r", key=coder.key,
                        brokers=sorted(coder.brokers, key=coder.brokers.__getitem__),
                        dsts=dict(coder.dsts), consumers=[], parts=[],
                        rest=str(tmp_path / REST_FILE))

    c = rest_of([
        ("broker.info", "a", None, "leaf", "leaf", "r1", None),     # null ts: never wins
        ("broker.info", "a", None, "branch", "branch", "hq", 2.0),
        ("broker.info", "a", None, "root", "root", None, 2.0),      # a tie: the first stays
        ("broker.info", "a", None, "leaf", "leaf", "r2", 1.0),
        ("broker.info", "b", None, "leaf", "leaf", "a", None),      # only null times
        ("broker.info", None, None, "leaf", "leaf", None, 3.0),     # no broker: a bad line
        ("message.produced", "a", "topic://t.*", None, None, None, 4.0),
        ("run.started", "runner", None, None, None, None, 0.0),
    ])
    got = _rest_codes(c)
    name = {k: b for k, b in enumerate(c.brokers)}
    assert {name[b]: v[1:] for b, v in got.info.items()} == {
        "a": ("branch", "branch", "hq"), "b": (None, None, None)}
    assert {name[b]: n for b, n in got.counts.items()} == {"a": 4, "b": 1}
    assert got.own_info and got.sends.num_rows == 0     # the wildcard send: pass 1's
    assert {k: (r["role"], r["parent"]) for k, r in _info_rows({"r": c}, {"r": got}).items()} \
        == {("r", "a"): ("branch", "hq"), ("r", "b"): (None, None)}
    assert sorted(_info_facts({"r": c}, {"r": got})) == [
        ("P", "r", "a", None, None, None, 0, 4), ("P", "r", "b", None, None, None, 0, 1)]
    wild = _rest_codes(rest_of([("broker.info", "a", "topic://t.>", "leaf", "leaf", "r", 1.0)]))
    assert not wild.own_info


# ----------------------------------------------------------------------------- Spark

@pytest.mark.spark
def test_percentile_equals_spark_percentile_approx(spark):
    """One partial aggregate (one partition), as the small per-consumer frames of the
    stage plan end up after AQE coalesces them: below and above 5,000 values."""
    from pyspark.sql import functions as F

    rng = random.Random(7)
    sets = {n: [round(rng.random() * 3, 6) for _ in range(n)]
            for n in (1, 2, 7, 100, 4999, 6000, 12000)}
    sets[3000] = [0.5] * 1000 + [0.25] * 2000     # ties
    rows = [(n, v) for n, vs in sets.items() for v in vs]
    got = (spark.createDataFrame(rows, "n long, v double").coalesce(1)
           .groupBy("n").agg(F.percentile_approx("v", [0.5, 0.99]).alias("q")).collect())
    for row in got:
        assert list(row["q"]) == [spark_percentile(sets[row["n"]], 0.5),
                                  spark_percentile(sets[row["n"]], 0.99)], row["n"]


def _json_copy(run: Path, root: Path) -> Path:
    """The run without its Parquet parts, under another name: read from its JSON lines."""
    copy = root / (run.name + "-json")
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("*.parquet"))
    summary = json.loads((copy / "summary.json").read_text())
    summary.pop("parquet_parts", None)
    (copy / "summary.json").write_text(json.dumps(summary))
    return copy


def _wildcard_run(root: Path) -> Path:
    """A topic wildcard consumer at a store, a region forwarding a concrete topic under
    it (interest through the pattern), a topic delivered twice to one subscriber."""
    run = root / "wild-tree"
    run.mkdir()
    lines = []

    def add(ts, broker, event, **fields):
        lines.append({"ts": ts, "broker": broker, "event": event, "run": "wild-tree",
                      "v": 1, **fields})

    add(0.0, "runner", "run.started", scenario="wild", mode="tree", engine="replay",
        brokers=3, links=2, params=json.dumps({"regions": 1, "stores_per_region": 1}))
    for broker, role, parent in (("hq", "root", None), ("region-1", "branch", "hq"),
                                 ("store-r1-0001", "leaf", "region-1")):
        add(0.0, broker, "broker.info", role=role, node_type=role, parent=parent)
    # a broker.info line with a wildcard destination: a pattern too (the coded copy's
    # broker.info rows then stay with the string passes)
    add(0.5, "region-1", "broker.info", role="branch", node_type="branch", parent="hq",
        dst="topic://PRICES.>")
    add(1.0, "store-r1-0001", "consumer.added", consumer="store-r1-0001/c/1",
        dst="topic://PRICES.>")
    for sender, receiver in (("store-r1-0001", "region-1"), ("region-1", "hq")):
        common = dict(consumer="store-r1-0001/c/1", dst="topic://PRICES.>",
                      origin="store-r1-0001", kind="add", hops=1)
        add(1.5, sender, "advisory.sent", link="l", peer=receiver, **common)
        add(1.5, receiver, "advisory.received", link="l", peer=sender, **common)
        add(1.5, receiver, "demand.created", link="l", peer=sender, priority=0,
            conduit=False, consumer="store-r1-0001/c/1", dst="topic://PRICES.>",
            origin="store-r1-0001")
    add(2.0, "hq", "message.produced", msg="p1", dst="topic://PRICES.eu")
    add(2.0, "hq", "message.forwarded", msg="p1", dst="topic://PRICES.eu", link="l",
        peer="region-1", hops=1)
    add(2.0, "region-1", "message.forwarded", msg="p1", dst="topic://PRICES.eu",
        link="l", peer="store-r1-0001", hops=2)
    for _ in range(2):
        add(2.5, "store-r1-0001", "message.delivered", msg="p1", dst="topic://PRICES.eu",
            consumer="store-r1-0001/c/1")
    add(3.0, "runner", "run.finished", scenario="wild", mode="tree", engine="replay",
        brokers=3, links=2, params="{}")
    (run / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


def _coded_copy(run: Path, root: Path) -> Path:
    """A hand-written run with the runner's Parquet parts and integer codes
    (parquet_parts.ParquetParts), read by the coded path."""
    from treefed.scenario.parquet_parts import ParquetParts

    copy = root / (run.name + "-coded")
    shutil.copytree(run, copy)
    data = (copy / "events.jsonl").read_bytes()
    parts = ParquetParts(copy, run_id=copy.name)
    parts.write(data)
    parts.close()
    summary = {"events": data.count(b"\n"), "parquet_codes": parts.codes,
               "parquet_parts": [{"file": f, "rows": n} for f, n in parts.parts]}
    (copy / "summary.json").write_text(json.dumps(summary))
    return copy


def _older_rest(run: Path, table, hot_events: tuple[str, ...]) -> dict:
    """Rewrite ``run``'s rest file as a runner with ``hot_events`` as its hot list wrote
    it (every row of ``table`` that is not such a hot row: more rows than now); its codes
    file entry."""
    import pyarrow.parquet as pq

    from treefed.scenario.parquet_parts import Coder, REST_FILE

    rest = Coder.rest(table, hot_events)
    assert rest.num_rows > pq.read_metadata(run / REST_FILE).num_rows   # more rows now
    pq.write_table(rest, run / REST_FILE)
    return {"file": REST_FILE, "rows": rest.num_rows}


def _session7_codes(run: Path) -> None:
    """Make a runner's run as session 7's runner wrote it: the codes file lists
    OLD_HOT_EVENTS as hot, the rest file holds every other row (link, consumer-added,
    stranded events too), no demand file, no message file.  (The parts keep the newer
    code columns: the job reads the six of session 7.)"""
    import pyarrow.parquet as pq

    from treefed.scenario.parquet_parts import (CODES_FILE, DEMAND_FILE, MESSAGE_FILE,
                                                OLD_HOT_EVENTS)

    data = json.loads((run / CODES_FILE).read_text())
    table = pq.read_table([run / p for p in sorted(os.listdir(run))
                           if p.startswith("events.part-")])
    data.update(hot=list(OLD_HOT_EVENTS), rest=_older_rest(run, table, OLD_HOT_EVENTS))
    del data["demand"], data["messages"], data["msgs"]
    (run / MESSAGE_FILE).unlink()
    (run / DEMAND_FILE).unlink()
    (run / CODES_FILE).write_text(json.dumps(data))


def _session8_codes(run: Path) -> None:
    """Make a runner's run as session 8's runner wrote it: no msg_code / peer_code
    columns, the codes file lists S8_HOT_EVENTS as hot and no message dictionary, the
    rest file holds the message rows too, no message file."""
    import pyarrow.parquet as pq

    from treefed.scenario.parquet_parts import CODES_FILE, MESSAGE_FILE, S8_HOT_EVENTS

    data = json.loads((run / CODES_FILE).read_text())
    parts = [run / p for p in sorted(os.listdir(run)) if p.startswith("events.part-")]
    for part in parts:
        pq.write_table(pq.read_table(part).drop_columns(["msg_code", "peer_code"]), part)
    data.update(hot=list(S8_HOT_EVENTS), rest=_older_rest(run, pq.read_table(parts),
                                                          S8_HOT_EVENTS))
    del data["messages"], data["msgs"]
    (run / MESSAGE_FILE).unlink()
    (run / CODES_FILE).write_text(json.dumps(data))


@pytest.fixture(scope="module")
def every_kind_of_run(tmp_path_factory) -> list[Path]:
    from tests.analysis.test_job import write_run
    from tests.analysis.test_variants import mesh_log, tree_log
    from treefed.scenario.runner import run_scenario

    root = tmp_path_factory.mktemp("passes")
    runs = [r.path for name in ("retail-small", "churn")
            for r in run_scenario(ROOT / "scenarios" / f"{name}.toml", engine="replay",
                                  out=root / "runner")]
    _session7_codes(runs[-1])     # churn, its last mode: link cuts, consumer churn
    _session8_codes(runs[2])      # retail-small's mesh-ttl2: deliveries read by strings
    plain = root / "plain"
    plain.mkdir()
    runs.append(_json_copy(runs[0], plain))
    hand = root / "hand"
    hand.mkdir()
    runs += [write_run(hand, "tree"), write_run(hand, "mesh-ttl1", bad=True),
             write_run(hand, "mesh-ttl2", gz=True), _wildcard_run(hand)]
    runs.append(_coded_copy(runs[-1], hand))
    for name, lines in (("variant-t", tree_log()), ("variant-m", mesh_log())):
        run = hand / name
        run.mkdir()
        (run / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        runs.append(run)
    return runs


def _report(dirs: list[Path], out: Path, *extra: str) -> str:
    from treefed.analysis import job

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
        status = job.main([str(d) for d in dirs]
                          + ["--out", str(out), "--allow-partial", *extra])
    assert status == 0
    return printed.getvalue()


@pytest.mark.spark
@pytest.mark.slow
def test_passes_give_the_stage_plans_tables(spark, every_kind_of_run, tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    _report(every_kind_of_run, old, "--legacy-plan")
    _report(every_kind_of_run, new)
    for name in ("runs.csv", "per_role.csv"):
        assert (new / name).read_bytes() == (old / name).read_bytes(), name
    runs = (new / "runs.csv").read_text().splitlines()
    assert len(runs) == 1 + len(every_kind_of_run)
    # the fixtures reach every metric: faults, recovery frames, extra hops, wildcards
    text = (new / "runs.csv").read_text()
    assert "variant-t" in text and "10.000 s: 3, 20.000 s: 2" in text
    for name in ("runs", "per_role", "brokers"):
        a = spark.read.parquet(str(old / "tables" / f"{name}.parquet"))
        b = spark.read.parquet(str(new / "tables" / f"{name}.parquet"))
        assert a.schema.simpleString() == b.schema.simpleString(), name
        assert sorted(map(tuple, a.collect()), key=repr) == \
            sorted(map(tuple, b.collect()), key=repr), name
