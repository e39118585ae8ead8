"""The report renderer: headline ratios, plain-words summary, self-contained HTML."""

from __future__ import annotations

import re

import pytest

from treefed.analysis import report


def run(scenario, mode, ttl, *, brokers, spr, receipts, spilled, demand, wasted,
        delivered, stranded, depth=2, expected=None):
    expected = delivered + stranded if expected is None else expected
    return dict(run=f"{scenario}-{mode}-{brokers}", scenario=scenario, mode=mode, ttl=ttl,
                brokers=brokers, stores_per_region=spr, depth=depth, consumers=spr,
                advisory_frames=receipts, advisory_receipts=receipts,
                spilled_advisories=spilled, advisories_per_consumer=receipts / spr,
                demand_created=demand, wasted_demand=wasted, max_demand_per_broker=spr,
                expected=expected, delivered=delivered,
                delivery_ratio=delivered / expected if expected else None,
                duplicates=0, stranded=stranded, convergence_median_s=0.01,
                convergence_p99_s=0.02, lines=1000, bad_lines=0)


RUNS = [
    run("sweep-size", "tree", None, brokers=12, spr=10, receipts=20, spilled=1, demand=20,
        wasted=1, delivered=10, stranded=0),
    run("sweep-size", "mesh-ttl1", 1, brokers=12, spr=10, receipts=10, spilled=10, demand=10,
        wasted=10, delivered=0, stranded=10),
    run("sweep-size", "mesh-ttl2", 2, brokers=12, spr=10, receipts=1100, spilled=1000,
        demand=1100, wasted=1000, delivered=10, stranded=0),
    run("sweep-size", "tree", None, brokers=102, spr=100, receipts=200, spilled=0, demand=200,
        wasted=0, delivered=100, stranded=0),
    run("sweep-size", "mesh-ttl2", 2, brokers=102, spr=100, receipts=10100, spilled=9900,
        demand=10100, wasted=9900, delivered=100, stranded=0),
    run("deep", "tree", None, brokers=40, spr=4, receipts=40, spilled=0, demand=40,
        wasted=0, delivered=8, stranded=0, depth=4),
    run("deep", "mesh-ttl2", 2, brokers=40, spr=4, receipts=30, spilled=10, demand=30,
        wasted=10, delivered=2, stranded=6, depth=4),
    run("deep", "mesh-ttl4", 4, brokers=40, spr=4, receipts=300, spilled=250, demand=300,
        wasted=250, delivered=8, stranded=0, depth=4),
]

ROLES = [
    dict(run="sweep-size-mesh-ttl2-102", scenario="sweep-size", mode="mesh-ttl2", ttl=2,
         stores_per_region=100, role="mesh", tier=tier, brokers=n, advisory_frames=0,
         advisory_receipts=r, spilled_advisories=s, demand_created=r, wasted_demand=s,
         max_demand_per_broker=100, deliveries=0, stranded=0)
    for tier, n, r, s in (("hq", 1, 100, 0), ("region", 1, 100, 0),
                          ("store", 100, 9900, 9900))
] + [
    dict(run="sweep-size-tree-102", scenario="sweep-size", mode="tree", ttl=None,
         stores_per_region=100, role=role, tier=tier, brokers=n, advisory_frames=0,
         advisory_receipts=r, spilled_advisories=0, demand_created=r, wasted_demand=0,
         max_demand_per_broker=100, deliveries=0, stranded=0)
    for role, tier, n, r in (("root", "hq", 1, 100), ("branch", "region", 1, 100),
                             ("leaf", "store", 100, 0))
]


class TestRatio:
    def test_formats(self):
        """Ratios read as multiples; a zero tree figure is named, never divided by."""
        assert report.ratio(1000, 1) == "1,000x"
        assert report.ratio(25, 2) == "12x"
        assert report.ratio(3, 2) == "1.5x"
        assert report.ratio(5, 0) == "∞ (tree 0)"
        assert report.ratio(0, 0) == "same (0)"
        assert report.ratio(None, 3) == "–"


class TestHeadline:
    def test_each_mode_against_tree_of_same_estate(self):
        """Each mesh row carries mode/tree ratios for its own estate size."""
        table, sentences = report.headline(RUNS)
        by = {(row[0], row[1], row[3]): row for row in table}
        spilled_vs_tree = report.HEADLINE_COLUMNS.index("spilled vs tree")
        assert by[("sweep-size", "12", "mesh-ttl2")][spilled_vs_tree] == "1,000x"
        assert by[("sweep-size", "102", "mesh-ttl2")][spilled_vs_tree] == "∞ (tree 0)"
        assert by[("sweep-size", "12", "tree")][spilled_vs_tree] == "–"
        assert ("sweep-size (12 brokers): mesh-ttl2 / tree spilled advisories = 1,000x, "
                "demand = 55x") in sentences

    def test_tree_first_then_ttl_order(self):
        """Within an estate, rows run tree, then mesh modes by rising TTL."""
        table, _ = report.headline(RUNS)
        assert [row[3] for row in table if row[0] == "sweep-size" and row[1] == "12"] == \
            ["tree", "mesh-ttl1", "mesh-ttl2"]


class TestSummaryLines:
    def test_names_stranding_and_spilling_modes(self):
        """The summary says which mode strands, which spills, where, and the TTL cut-off."""
        text = "\n".join(report.summary_lines(RUNS, ROLES))
        assert "Modes that strand messages somewhere: mesh-ttl1, mesh-ttl2." in text
        assert "mesh-ttl1 strands 10 messages (delivered 0 / 10 (0%))" in text
        assert ("Most spillage: mesh-ttl2 in sweep-size (102 brokers), 9,900 advisory receipts"
                in text)
        assert "100% of its wasted demand sits at store brokers" in text
        assert ("deep (40 brokers): TTL 2 strands messages; TTL 4 delivers everything but "
                "spills 250 advisories.") in text

    def test_no_runs(self):
        """With nothing read the summary says so."""
        assert report.summary_lines([]) == ["No runs were read."]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """(out dir, written paths) of one render of RUNS and ROLES."""
    out = tmp_path_factory.mktemp("report")
    return out, report.render(RUNS, ROLES, out, title="test report")


class TestRender:
    def test_writes_markdown_html_and_plots(self, rendered):
        """report.md, index.html and the four plots are written as files."""
        out, written = rendered
        assert set(written) == {"report", "html", "scale", "spill", "roles", "ttl"}
        for name in ("scale", "spill", "roles", "ttl"):
            assert (out / f"{name}.png").read_bytes().startswith(b"\x89PNG")
        md = (out / "report.md").read_text()
        assert md.startswith("# test report")
        assert "| sweep-size | 12 | 10 | mesh-ttl2 |" in md
        assert "![" in md and "(ttl.png)" in md

    def test_html_is_self_contained(self, rendered):
        """Every src/href in index.html is a data: URI, so it opens from disk."""
        page = (rendered[0] / "index.html").read_text()
        refs = re.findall(r'(?:src|href)\s*=\s*["\']?([^"\' >]*)', page, re.I)
        assert len(refs) == 4
        assert all(ref.startswith("data:image/png;base64,") for ref in refs)
        assert "<link" not in page and "@import" not in page
        assert "1,000x" in page

    def test_skips_plots_without_data(self, tmp_path):
        """Runs without sizes or TTLs still render; plots without data are left out."""
        bare = [dict(run="x", scenario="logs", mode="tree", ttl=None, brokers=3,
                     advisory_receipts=0, bad_lines=2, lines=10)]
        written = report.render(bare, [], tmp_path)
        assert set(written) == {"report", "html"}
        assert "x: 2 of 10 log lines did not parse" in (tmp_path / "report.md").read_text()


DEPTH_RUNS = [
    run(f"sweep-depth-{d}", mode, ttl, brokers=40 + d, spr=10, receipts=100, spilled=s,
        demand=100, wasted=s, delivered=10 - st, stranded=st, depth=d)
    for d in (2, 3, 4)
    for mode, ttl, s, st in (("tree", None, 4, 0), ("mesh-ttl2", 2, 50 * d, 2 * (d - 2)))
]


class TestPlotsAreReadable:
    def test_every_axis_is_labelled(self, tmp_path, monkeypatch):
        """Every plot the report draws labels both axes of every panel (captured from
        the Figures themselves, so a new plot without labels fails here)."""
        figures = []
        real = report._png

        def capture(fig):
            figures.append(fig)
            return real(fig)

        monkeypatch.setattr(report, "_png", capture)
        written = report.render(RUNS + DEPTH_RUNS, ROLES, tmp_path)
        assert {"scale", "depth", "spill", "roles", "ttl"} <= set(written)
        assert len(figures) == 5
        for fig in figures:
            for ax in fig.axes:
                assert ax.get_xlabel() and ax.get_ylabel(), (ax.get_title(), fig)

    def test_scale_plots_use_only_the_sweeps(self):
        """Runs outside the size sweep give no scale plot, outside the depth sweep no
        depth plot: their points would mix workloads."""
        others = [dict(r, scenario="retail-4x250") for r in RUNS]
        assert report.plot_scale(others) is None
        assert report.plot_depth(others) is None
        assert report.plot_depth(DEPTH_RUNS) is not None


class TestCosts:
    def test_each_mode_costs_next_to_its_spill_at_the_largest_estate(self):
        rows = RUNS + [dict(RUNS[4], mode="mesh-tuned", run="t", spilled_advisories=400,
                            sibling_spill=300, downward_spill=100, stranded=50)]
        estate, table = report.costs(rows)
        assert estate == "sweep-size (102 brokers)"
        by_mode = {r[0]: r for r in table}
        assert list(by_mode) == ["tree", "mesh-ttl2", "mesh-tuned"]
        tuned = by_mode["mesh-tuned"]
        assert "dynamically_included list per store" in tuned[1]
        assert "store-to-store" in tuned[2]
        assert tuned[3:7] == ["400", "300", "100", "50"]
        assert "TTL below the estate's depth strands" in by_mode["mesh-ttl2"][2]
        assert report.mode_cost("mesh-ttl3") == report.MODE_COSTS["mesh-ttl"]
        assert report.mode_cost("nats-x") is None

    def test_tuned_mode_is_not_read_as_a_ttl_step(self):
        """summary_lines' 'TTL n strands' sentence is about plain TTL modes only."""
        rows = [dict(r) for r in RUNS if r["scenario"] == "deep"]
        rows.append(dict(rows[1], mode="mesh-tuned", run="tuned", ttl=2, stranded=99))
        text = " ".join(report.summary_lines(rows))
        assert "TTL 2 strands messages; TTL 4 delivers" in text


class TestHeadlineSentence:
    def test_largest_estate_numbers(self):
        text = report.headline_sentence(RUNS)
        assert text == ("At sweep-size (102 brokers, 100 stores per region): mesh-ttl2 "
                        "spills 9,900 (tree 0) spilled advisories (9,900 vs 0) and strands "
                        "no more than the tree.")

    def test_ratio_and_stranded(self):
        rows = [r for r in RUNS if r["brokers"] == 12]
        text = report.headline_sentence(rows)
        assert "mesh-ttl1 spills 10x the tree's spilled advisories (10 vs 1) and strands " \
               "10 messages the tree delivers" in text
        assert "mesh-ttl2 spills 1,000x the tree's" in text

    def test_is_first_on_the_page(self, tmp_path):
        report.render(RUNS, ROLES, tmp_path)
        page = (tmp_path / "index.html").read_text()
        assert page.index('class="headline"') < page.index("<h2>Summary")
