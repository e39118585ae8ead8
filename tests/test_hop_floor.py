"""bench/hop_floor.py: the loopback's floor for one-at-a-time sends (issue #14)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "hop_floor.py"


def _module():
    spec = importlib.util.spec_from_file_location("hop_floor", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_summary_is_the_median_of_round_medians() -> None:
    hop = _module()
    rounds = [
        # round trips in seconds: one way is half; writes are taken as they are
        {"blocking": [100e-6, 120e-6, 500e-6], "trio": [200e-6, 210e-6, 900e-6],
         "sleep": [30e-6, 31e-6, 90e-6], "busy": [8e-6, 9e-6, 40e-6]},
        {"blocking": [140e-6, 140e-6, 140e-6], "trio": [260e-6, 240e-6, 250e-6],
         "sleep": [40e-6], "busy": [10e-6]},
        {"blocking": [110e-6], "trio": [220e-6], "sleep": [35e-6], "busy": [7e-6]},
    ]
    got = hop.summarize(rounds)
    # round medians: blocking 120/140/110 -> 120 -> 60 one way; trio 210/250/220 -> 220
    assert got["hop_blocking_us"] == pytest.approx(60.0)
    assert got["hop_trio_us"] == pytest.approx(110.0)
    assert got["write_sleeping_peer_us"] == pytest.approx(35.0)
    assert got["write_busy_peer_us"] == pytest.approx(9.0)
    # four hops of 110 us: 440 us a message
    assert got["sync_consumer_cap_msgs_per_s"] == round(1e6 / 440)
    assert got["hop_rounds"] == 3


def test_the_bench_prints_one_line_of_positive_figures() -> None:
    done = subprocess.run([sys.executable, str(BENCH), "--count", "40", "--rounds", "2"],
                          capture_output=True, text=True, timeout=120, check=True)
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    line = json.loads(lines[0])
    assert line["bench"] == "hop_floor"
    for key in ("hop_blocking_us", "hop_trio_us", "write_sleeping_peer_us",
                "write_busy_peer_us", "sync_consumer_cap_msgs_per_s"):
        assert line[key] > 0, (key, line)
    assert line["sync_consumer_cap_msgs_per_s"] == pytest.approx(
        1e6 / (4 * line["hop_trio_us"]), rel=0.01)
    assert line["hop_rounds"] == 2


def test_runs_combine_as_means_with_the_cap_recomputed() -> None:
    hop = _module()
    a = {"hop_blocking_us": 60.0, "hop_trio_us": 100.0, "write_sleeping_peer_us": 30.0,
         "write_busy_peer_us": 15.0, "sync_consumer_cap_msgs_per_s": 2500, "hop_rounds": 3}
    b = {"hop_blocking_us": 80.0, "hop_trio_us": 150.0, "write_sleeping_peer_us": 130.0,
         "write_busy_peer_us": 17.0, "sync_consumer_cap_msgs_per_s": 1667, "hop_rounds": 3}
    got = hop.combine([a, b])
    assert got["hop_blocking_us"] == 70.0
    assert got["hop_trio_us"] == 125.0
    assert got["write_sleeping_peer_us"] == 80.0
    assert got["write_busy_peer_us"] == 16.0
    assert got["sync_consumer_cap_msgs_per_s"] == 2000   # four hops of 125 us
    assert got["hop_rounds"] == 6


def test_a_commit_between_two_hops_caps_a_lone_sender() -> None:
    hop = _module()
    # 2 x 100 us + 0.3 ms = 500 us a message
    assert hop.commit_cap(100.0, 0.3) == 2000
    assert hop.commit_cap(100.0, 0.3, hops=4) == round(1e6 / 700)
