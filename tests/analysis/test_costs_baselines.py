"""The report's operator-cost table for the one-way mesh and the NATS-style isolated
baseline (scenario/baselines.py), with the figures of the 7-broker estate hand-counted in
tests/scenario/test_oneway_isolated.py (tree: spill 2, 14/14 delivered; mesh-tuned-oneway: spill 8,
of it downward 4, 10 of 14 copies stranded or dropped -- 6 stranded; nats-isolated:
spill 6, downward 4, 2 stranded)."""

from __future__ import annotations

from treefed.analysis import report


def row(mode, ttl, *, spilled, sibling, downward, delivered, stranded):
    return dict(run=f"tiny-{mode}", scenario="tiny", mode=mode, ttl=ttl, brokers=7,
                stores_per_region=2, depth=2, consumers=10, advisory_frames=1,
                advisory_receipts=1, spilled_advisories=spilled, sibling_spill=sibling,
                downward_spill=downward, demand_created=1, wasted_demand=0,
                max_demand_per_broker=1, expected=14, delivered=delivered,
                delivery_ratio=delivered / 14, duplicates=0, stranded=stranded,
                dropped=14 - delivered - stranded,
                lines=100, bad_lines=0)


RUNS = [
    row("tree", None, spilled=2, sibling=0, downward=0, delivered=14, stranded=0),
    row("mesh-tuned-oneway", 2, spilled=8, sibling=0, downward=4, delivered=4, stranded=6),
    row("nats-isolated", None, spilled=6, sibling=0, downward=4, delivered=12, stranded=2),
]


def test_new_modes_state_configuration_and_unserved_routes_next_to_their_spill():
    estate, table = report.costs(RUNS)
    assert estate == "tiny (7 brokers)"
    by_mode = {r[0]: r for r in table}
    assert list(by_mode) == ["tree", "mesh-tuned-oneway", "nats-isolated"]
    oneway = by_mode["mesh-tuned-oneway"]
    assert "non-duplex connector per store" in oneway[1]
    assert "HQ-to-store" in oneway[2] and "store-to-store" in oneway[2] \
        and "broadcast" in oneway[2]
    assert oneway[3:] == ["8", "0", "4", "6", "4 / 14 (29%)"]
    isolated = by_mode["nats-isolated"]
    assert "isolate_leafnode_interest" in isolated[1] and "no per-store filter" in isolated[1]
    assert "store-to-store" in isolated[2]
    assert isolated[3:] == ["6", "0", "4", "2", "12 / 14 (86%)"]


def test_the_longest_prefix_names_the_mode():
    """mesh-tuned-oneway is not mesh-tuned's duplex filter list; mesh-tuned keeps its own."""
    assert report.mode_cost("mesh-tuned-oneway") == report.MODE_COSTS["mesh-tuned-oneway"]
    assert report.mode_cost("mesh-tuned") == report.MODE_COSTS["mesh-tuned"]
    assert report.mode_cost("nats-isolated") == report.MODE_COSTS["nats-isolated"]


def test_new_modes_are_neither_the_tree_nor_a_ttl_step():
    """The headline compares every mode with the tree: nats-isolated (a tree connector)
    must not be taken for the tree, the one-way mesh (TTL 2) not for a plain TTL mode.
    The one-way mesh's broadcast copies are dropped (no_route), not stranded: the
    sentence names them too."""
    table, _ = report.headline(RUNS)
    vs_tree = {r[3]: r[13] for r in table}
    assert vs_tree["tree"] == "–"
    assert vs_tree["nats-isolated"] != "–" and vs_tree["mesh-tuned-oneway"] != "–"
    assert not report._plain_ttl(RUNS[1]) and not report._is_tree(RUNS[2])
    assert report.headline_sentence(RUNS) == (
        "At tiny (7 brokers, 2 stores per region): mesh-tuned-oneway spills 4x the tree's "
        "spilled advisories (8 vs 2) and strands 6 messages the tree delivers and drops 4 "
        "copies the tree delivers; nats-isolated spills 3x the tree's spilled advisories "
        "(6 vs 2) and strands 2 messages the tree delivers.")
