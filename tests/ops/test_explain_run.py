"""`treefed explain --run DIR`: explanations read from a scenario run's event log agree
with what the run's brokers did with every store-to-store message."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

from tests.node.helpers import REPO_ROOT, child_env
from tests.ops.test_map_wait import run_cli
from treefed.ops.explain import read_run, trace, views_from_events


async def scenario_runs(out: Path) -> dict[str, Path]:
    await trio.run_process([sys.executable, "-m", "treefed.cli", "scenario", "run",
                            str(REPO_ROOT / "scenarios" / "retail-small.toml"), "--engine",
                            "replay", "--out", str(out), "--mode", "tree", "--mode",
                            "mesh-ttl1"], capture_stdout=True, env=child_env())
    return {p.name.split("-replay-")[0].removeprefix("retail-small-"): p
            for p in out.iterdir()}


class TestRunDirectory:
    async def test_explanations_match_the_runs_deliveries(self, tmp_path: Path) -> None:
        """For every store-to-store message of retail-small (tree and mesh TTL 1), the
        explanation at the moment it was produced reaches the consumer that got it, and
        reaches nobody when the run delivered it nowhere (with the advisory's drop
        reason from the log)."""
        runs = await scenario_runs(tmp_path)
        assert set(runs) == {"tree", "mesh-ttl1"}
        undelivered_reasons = set()
        for mode, run in runs.items():
            events = list(read_run(run))
            delivered = {e["msg"]: e["consumer"] for e in events
                         if e["event"] == "message.delivered"}
            produced = [e for e in events if e["event"] == "message.produced"
                        and e["dst"].startswith("queue://Store.")]
            assert produced
            checked = 0
            for p in produced:
                if p["dst"].endswith(f".{p['broker']}.Incoming") or \
                        f".{p['broker']}." in p["dst"]:
                    continue   # a store's own queue: local delivery, nothing to explain
                result = trace(views_from_events(events, p["dst"], at=p["ts"]), p["broker"])
                if p["msg"] in delivered:
                    assert delivered[p["msg"]] in result["reached"], (mode, p, result)
                else:
                    assert result["reached"] == {}, (mode, p, result)
                    undelivered_reasons |= {u["reason"] for u in result["unreached"]}
                checked += 1
            assert checked
        assert "ttl" in undelivered_reasons   # mesh TTL 1: stores cannot see each other

        code, out, err = await run_cli("explain", "Store.store-r1-0001.Incoming", "--from",
                                       "store-r2-0001", "--run", str(runs["tree"]), "--json")
        assert code == 0, err
        hops = json.loads(out)["reached"]["store-r1-0001/app/store-queue"]["hops"]
        assert [h["to"] for h in hops] == ["region-2", "hq", "region-1", "store-r1-0001"]
