"""Issue #12, defect 9: ``treefed stat`` on a big broker.

An HQ over 4 x 1,000 stores holds about 40,000 destinations; its one stat reply passed
the 4 MiB frame limit and ``treefed stat`` ended in "connection lost".  Statistics now
come in pages (``node.stat_pages``) that each fit a frame, can be filtered by a
destination pattern, and ``treefed stat`` fetches every page."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import trio

from treefed.client import connect
from treefed.errors import RemoteError
from treefed.node.stat_pages import DEFAULT_PAGE, select
from treefed.wire.codec import DEFAULT_MAX_FRAME, encode
from treefed.wire.frames import StatReply

from tests.node.helpers import REPO_ROOT, child_env, make_config, start_node

STATS = {
    "broker": "hq", "connections": 2, "dropped": {},
    "destinations": {f"queue://S.{i:03d}": {"depth": i} for i in range(250)}
    | {"topic://T.x": {"depth": 0}},
    "consumers": [{"conn": f"c{i % 7}", "sub": f"s{i}", "dst": f"queue://S.{i:03d}"}
                  for i in range(40)],
    "conns": [{"conn": f"c{i}"} for i in range(7)],
}


class TestSelect:
    def test_pages_cover_every_destination_once_in_name_order(self):
        """Walking ``next`` offsets visits every destination exactly once, sorted."""
        seen: list[str] = []
        offset = 0
        while offset is not None:
            page = select(STATS, "destinations", offset=offset, limit=60)
            seen += list(page["destinations"])
            offset = page["pages"]["destinations"]["next"]
        assert seen == sorted(STATS["destinations"])

    def test_all_keeps_figures_and_first_pages(self):
        """``all``: scalar figures as before, each list cut to its first page, totals
        in ``pages``."""
        page = select(STATS, "all", limit=10)
        assert page["connections"] == 2 and len(page["destinations"]) == 10
        assert page["pages"]["destinations"] == {"total": 251, "offset": 0, "returned": 10,
                                                 "next": 10}
        assert page["pages"]["conns"]["next"] is None and len(page["conns"]) == 7

    def test_small_broker_reply_is_complete_in_one_page(self):
        """Below the default page size nothing is cut (old clients see everything)."""
        page = select(STATS)
        assert len(page["destinations"]) == 251 and DEFAULT_PAGE > 251
        assert all(p["next"] is None for p in page["pages"].values())

    def test_match_filters_destinations_and_their_consumers(self):
        """A wildcard pattern keeps matching destinations and consumers only."""
        page = select(STATS, "all", match="queue://S.>")
        assert len(page["destinations"]) == 250 and "topic://T.x" not in page["destinations"]
        page = select(STATS, "all", match="queue://S.007")
        assert list(page["destinations"]) == ["queue://S.007"]
        assert [c["sub"] for c in page["consumers"]] == ["s7"]

    def test_summary_has_totals_and_no_lists(self):
        page = select(STATS, "summary")
        assert "destinations" not in page and page["pages"]["destinations"]["total"] == 251

    @pytest.mark.parametrize("what, match", [("everything", None), ("all", "queue://a..b")])
    def test_bad_request_is_refused(self, what, match):
        """An unknown section or a malformed pattern is a bad_request, not a crash."""
        with pytest.raises(RemoteError) as info:
            select(STATS, what, match=match)
        assert info.value.code == "bad_request"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "treefed.cli", *args], capture_output=True,
                          text=True, timeout=120, env=child_env(), cwd=str(REPO_ROOT))


N_DESTINATIONS = 42_000


class TestBigBroker:
    @pytest.mark.slow
    async def test_treefed_stat_on_a_broker_with_42000_destinations(self, nursery,
                                                                    tmp_path):
        """A broker whose full statistics encode to more than 4 MiB: `treefed stat`
        exits 0 with every destination; --match and --section cut the reply down; a
        client's plain stat() gets a first page that fits a frame."""
        node, uri = await start_node(nursery, make_config(tmp_path / "d"))
        with trio.fail_after(240):
            async with connect(uri) as conn:
                for i in range(N_DESTINATIONS):
                    await conn.send(f"queue://retail.region-{i % 4}.store-{i // 4:05d}"
                                    ".orders.incoming", b"x")
                page = await conn.stat()
                assert len(page["destinations"]) == DEFAULT_PAGE
                assert page["pages"]["destinations"]["total"] == N_DESTINATIONS
            assert len(encode(StatReply(node.statistics()))) > DEFAULT_MAX_FRAME
            done = await trio.to_thread.run_sync(run_cli, "stat", uri)
            assert done.returncode == 0, done.stderr[-2000:]
            stats = json.loads(done.stdout)
            assert len(stats["destinations"]) == N_DESTINATIONS
            assert stats["pages"]["destinations"]["next"] is None
            done = await trio.to_thread.run_sync(
                run_cli, "stat", uri, "--match", "queue://retail.region-1.store-00001.>")
            assert done.returncode == 0, done.stderr[-2000:]
            assert list(json.loads(done.stdout)["destinations"]) == [
                "queue://retail.region-1.store-00001.orders.incoming"]
            done = await trio.to_thread.run_sync(run_cli, "stat", uri, "--section", "summary")
            summary = json.loads(done.stdout)
            assert "destinations" not in summary
            assert summary["pages"]["destinations"]["total"] == N_DESTINATIONS
