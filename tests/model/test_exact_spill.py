"""Sibling spill and downward interest of the exact engine without ``--messages``.

The plain exact walk used to attribute receipts to consumer groups through the
destination alone, only where one group had it: the broadcast topic, which every store
subscribes to, names many groups and was left out (retail-small TTL 2: 40 instead of 80;
sweep-size-4x0025: 2,400 instead of 4,800).  It now counts per origin broker.

Hand count, retail-small (2 regions x 5 stores; every store has its own queue and the
broadcast topic; region and HQ one queue each): under TTL 2 each store hears each of its
4 siblings' 2 destinations through the region, 10 x 4 x 2 = 80; the tuned mesh lets a
store hear only the broadcast (its filter admits its own, its region's and HQ's queues and
the topic), 10 x 4 = 40; TTL 1 stops at the region, 0.  Downward interest: a store hears
its region's queue (1) and HQ's (1) under TTL 2, 10 x 2 = 20, plus each region hears HQ's
queue, 2 -> 22; under TTL 1 a store hears only its region's queue (10) and each region
HQ's (2) -> 12.
"""

from __future__ import annotations

import concurrent.futures

import pytest

from treefed.model.cli import _scenario, model_rows

HAND = {"mesh-ttl1": (0, 12), "mesh-ttl2": (80, 22), "mesh-tuned": (40, 22), "tree": (0, 0)}


def _rows(messages: bool, modes=tuple(HAND), name: str = "retail-small") -> dict:
    runs, _tiers, _t = model_rows(None, _scenario(name, None, None), list(modes),
                                  engine="exact", messages=messages)
    return {r["mode"]: (r["sibling_spill"], r["downward_interest"]) for r in runs}


def test_plain_exact_engine_counts_the_broadcast_in_sibling_spill():
    assert _rows(messages=False) == HAND


def test_plain_and_message_walks_split_every_broker_alike(tmp_path):
    from treefed.model.cli import main

    for flag in ((), ("--messages",)):
        out = tmp_path / ("m" if flag else "p")
        assert main(["retail-small", "--engine", "exact", "--mode", "mesh-ttl2",
                     "--mode", "mesh-tuned", "--out", str(out), *flag]) == 0
    for mode in ("mesh-ttl2", "mesh-tuned"):
        plain = (tmp_path / "p" / f"brokers-{mode}.csv").read_text()
        with_messages = (tmp_path / "m" / f"brokers-{mode}.csv").read_text()
        assert plain == with_messages


@pytest.mark.spark
def test_plain_exact_split_equals_the_spark_cells(spark):
    sc = _scenario("retail-small", None, None)

    def rows(mode):
        return model_rows(spark, sc, [mode], engine="spark")[0]

    # one mode per thread: a mode's run is a chain of small Spark jobs keeping about one
    # core busy; the session runs both side by side
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = [r for part in pool.map(rows, ["mesh-ttl2", "mesh-tuned"]) for r in part]
    assert [r["mode"] for r in runs] == ["mesh-ttl2", "mesh-tuned"]
    got = {r["mode"]: (r["sibling_spill"], r["downward_interest"]) for r in runs}
    assert got == {m: HAND[m] for m in got}
