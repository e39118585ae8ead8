"""Render the comparison report from the job's collected rows: report.md, index.html, PNGs.

Theory of operation
-------------------
Input is plain data: the runs table and the per-role table as lists of mappings (the job
collects them; tests write them by hand), keyed as ``job.RUN_COLUMNS`` / ``ROLE_COLUMNS``.
No Spark here.  Plots use matplotlib's object API (``Figure``, rendered by Agg), never
pyplot, so rendering touches no global state and needs no display.

* The headline compares, per estate (scenario x brokers), every mode against the tree run
  of the same estate: ratios ``mode / tree`` of spilled advisories, advisory receipts and
  demand.  A ratio over a zero tree figure is shown as such, never as a division error.
* Size plots (figures against stores per region) use every scenario except the TTL
  sensitivity ones (``deep*``, ``reconfigure*``), which get their own delivery/stranded/
  spilled-against-TTL plot; without any, that plot uses all mesh runs.
* The plain-words summary is generated from the same numbers: which modes strand, which
  spill and by how much, where the waste lands, the lowest TTL that delivers everything.
* ``index.html`` is self-contained: CSS inline, plots as base64 ``data:`` URIs, no
  external ``src``/``href``, so it opens from disk or as a mail attachment.

Never reads or writes anything but the files it renders into ``out_dir``.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.figure import Figure

__all__ = [
    "SENSITIVITY_SCENARIOS",
    "HEADLINE_COLUMNS",
    "render",
    "headline",
    "ratio",
    "summary_lines",
    "headline_sentence",
    "accounting",
    "costs",
    "mode_cost",
    "MODE_COSTS",
    "ACCOUNTING_COLUMNS",
    "plot_scale",
    "plot_depth",
    "SIZE_SWEEP",
    "DEPTH_SWEEP",
    "plot_spill",
    "plot_role_waste",
    "plot_sensitivity",
]

#: Scenario name prefixes that vary TTL against depth rather than estate size.
SENSITIVITY_SCENARIOS = ("sweep-depth", "deep", "reconfigure")
#: The controlled sweeps: one workload, only stores per region (size) or the number of
#: levels (depth) varies.  The scale and depth plots use these runs and no others.
SIZE_SWEEP = "sweep-size"
DEPTH_SWEEP = "sweep-depth"

Row = Mapping[str, object]

#: What a mode costs the operator -- configuration, and the routes it cannot serve -- by
#: mode label prefix (longest match wins).  Stated next to each mode's spill.
MODE_COSTS: dict[str, tuple[str, str]] = {
    "tree": ("one tree connector per store naming its parent and node type leaf; the "
             "same file for every store but the parent address",
             "none: store-to-store goes up to the lowest common ancestor and down"),
    "tree-summary": ("the tree connector plus summary_budget and the owned-queue pattern "
                     "(queue://Store.{broker}.>), the same two keys in every file",
                     "none; a store queue nobody below consumes waits at its region "
                     "instead of HQ (one hop down from HQ: bench/tree_summary.py)"),
    "tree-resync": ("the tree connector plus resync_grace (seconds both ends keep a "
                    "link's interest after it drops), the same key in every file",
                    "none: a link back within the grace exchanges only the interest "
                    "that changed; past it (or after a restart) a full resync, as the "
                    "plain tree"),
    "mesh-ttl": ("one network TTL for the whole estate, duplex connectors; the same file "
                 "for every store",
                 "TTL below the estate's depth strands HQ-to-store, store-to-HQ and "
                 "store-to-store traffic; TTL at or above it floods every store"),
    "mesh-tuned": ("one hand-written dynamically_included list per store connector (its "
                   "own queue, its region's, HQ's, the broadcast topics): as many "
                   "distinct files as stores, each edited for every new destination",
                   "store-to-store queues (the sender never learns of the other store's "
                   "consumer, so those messages strand) and any destination left off a "
                   "list"),
    "mesh-tuned-oneway": ("one non-duplex connector per store up to its region (the "
                          "guide's concentrator) with a hand-written dynamically_included "
                          "list (its region's and HQ's queues): as many distinct files as "
                          "stores; regions and HQ duplex",
                          "everything towards a store: HQ-to-store and store-to-store "
                          "queues strand at the sender, broadcast topics reach no store "
                          "(a one-way store link never carries the store's interest up or "
                          "a message down); a second, downward connector per store would "
                          "double the connectors"),
    "nats-isolated": ("NATS 2.12 leafnode interest isolation (isolate_leafnode_interest) "
                      "on every hub: one leaf remote per store naming its hub, the same "
                      "file for every store; no per-store filter",
                      "store-to-store and any route into another branch (no leaf hears a "
                      "sibling's interest and a leaf sends only on interest its hub "
                      "advertised): those messages strand at the sender"),
}

_TIER_ORDER = {"hq": 0, "country": 1, "region": 8, "store": 9, "other": 10}


# ----------------------------------------------------------------------------- helpers

PARTIAL = " [partial]"
#: the mark of a row computed by ``treefed model`` (``source = model``), not emulated
MODELLED = " [model]"


def _modelled(row: Row) -> bool:
    return row.get("source") == "model"


def _mode(row: Row) -> str:
    """The mode label, flagged when the run is included although partial, and when it
    was modelled rather than emulated."""
    return str(row.get("mode")) + (PARTIAL if row.get("problems") or row.get("partial")
                                   else "") + (MODELLED if _modelled(row) else "")


def mode_cost(mode: str) -> tuple[str, str] | None:
    """(configuration, routes it cannot serve) for a mode label, None when unknown."""
    best = max((p for p in MODE_COSTS if mode.startswith(p)), key=len, default=None)
    return MODE_COSTS.get(best) if best else None


COST_COLUMNS = ("mode", "configuration the operator keeps", "routes it cannot serve",
                "spilled", "sibling spill", "downward interest", "stranded",
                "delivered / expected")


def costs(runs: Sequence[Row]) -> tuple[str, list[list[str]]]:
    """The largest estate's runs as (estate name, rows of COST_COLUMNS): each mode's
    cost to the operator next to its spill."""
    groups = _groups(runs)
    if not groups:
        return "", []
    (scenario, brokers, _), rows = max(groups, key=lambda g: (g[0][1], g[0][0]))
    table = []
    for r in rows:
        cost = mode_cost(str(r.get("mode"))) or ("–", "–")
        table.append([_mode(r), cost[0], cost[1], _num(r.get("spilled_advisories")),
                      _num(r.get("sibling_spill")), _num(r.get("downward_spill")),
                      _num(r.get("stranded")), _pct(r)])
    return f"{scenario} ({_num(brokers)} brokers)", table


#: The tree variants shown against the plain tree (issue 18): summarisation at branches
#: and delta resync on reconnect.
TREE_VARIANTS = ("tree-summary", "tree-resync")
VARIANT_COLUMNS = ("scenario", "brokers", "mode", "HQ demand entries", "vs tree",
                   "extra hops", "advisory frames", "recovery frames", "vs tree",
                   "recovery frames per fault event (at: frames)", "delivered / expected",
                   "stranded")


def variants(runs: Sequence[Row]) -> list[list[str]]:
    """Per estate with a plain ``tree`` run and a tree variant: the plain tree and each
    variant, with HQ's (the root's) peak demand entries, the extra hops (messages sent
    down a subtree with no consumer for them), advisory frames in all, and the advisory
    frames sent after the fault events (each to the next; job/variants.py), the two
    ratios against the plain tree."""
    table = []
    for (scenario, brokers, _), rows in _groups(runs):
        tree = next((r for r in rows if r.get("mode") == "tree" and not _modelled(r)), None)
        shown = [r for r in rows if r.get("mode") in TREE_VARIANTS and not _modelled(r)]
        if tree is None or not shown:
            continue
        for r in [tree, *shown]:
            base = r is tree
            faults = r.get("fault_events") or 0
            table.append([
                str(scenario), _num(brokers), _mode(r), _num(r.get("root_demand")),
                "" if base else ratio(r.get("root_demand"), tree.get("root_demand")),
                _num(r.get("extra_hops")), _num(r.get("advisory_frames")),
                _num(r.get("recovery_frames")) if faults else "no fault",
                "" if base or not faults
                else ratio(r.get("recovery_frames"), tree.get("recovery_frames")),
                str(r.get("recovery_frames_by_event") or "–"), _pct(r),
                _num(r.get("stranded"))])
    return table


def _is_tree(row: Row) -> bool:
    return str(row.get("mode") or "").startswith("tree")


def _plain_ttl(row: Row) -> bool:
    """A mesh mode that differs from the others by its TTL alone (not a tuned one)."""
    return row.get("ttl") is not None and "tuned" not in str(row.get("mode"))


def _mode_key(row: Row) -> tuple:
    """Tree first, then mesh modes by TTL (unlimited, -1, last), then by name."""
    ttl = row.get("ttl")
    rank = math.inf if ttl is None or ttl < 0 else ttl
    return (not _is_tree(row), rank, str(row.get("mode")))


def _estate(row: Row) -> tuple:
    return (str(row.get("scenario")), row.get("brokers") or 0,
            row.get("stores_per_region") or 0)


def _groups(runs: Sequence[Row]) -> list[tuple[tuple, list[Row]]]:
    """Runs grouped by estate, estates in (scenario, size) order, modes in _mode_key order."""
    grouped: dict[tuple, list[Row]] = defaultdict(list)
    for row in runs:
        grouped[_estate(row)].append(row)
    return [(key, sorted(rows, key=_mode_key)) for key, rows in sorted(grouped.items())]


def _num(value: object, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value == 0 or math.isnan(value):
            return "0" if value == 0 else "–"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return str(value)


def ratio(value: object, base: object) -> str:
    """``value / base`` as "1,000x"; explicit when the base is zero or missing."""
    if value is None or base is None:
        return "–"
    if base == 0:
        return "same (0)" if value == 0 else "∞ (tree 0)"
    r = value / base
    if r >= 100:
        return f"{r:,.0f}x"
    if r >= 10:
        return f"{r:.0f}x"
    return f"{r:.2g}x"


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{_num(n)} {one if n == 1 else (many or one + 's')}"


def _pct(row: Row) -> str:
    share = row.get("delivery_ratio")
    if share is None:
        return f"{_num(row.get('delivered'))} / –"
    return f"{_num(row.get('delivered'))} / {_num(row.get('expected'))} ({share:.0%})"


def _strands(row: Row) -> bool:
    expected, delivered = row.get("expected"), row.get("delivered") or 0
    return (row.get("stranded") or 0) > 0 or (expected is not None and delivered < expected)


# ----------------------------------------------------------------------------- headline

HEADLINE_COLUMNS = (
    "scenario", "brokers", "stores/region", "mode", "advisory receipts", "spilled",
    "sibling spill", "downward interest", "demand", "wasted demand", "max demand/broker",
    "delivered / expected", "stranded", "spilled vs tree", "demand vs tree",
)


def headline(runs: Sequence[Row]) -> tuple[list[list[str]], list[str]]:
    """The headline table (rows of HEADLINE_COLUMNS strings) and its ratio sentences
    ("mesh-ttl2 / tree spilled advisories = 1,000x")."""
    table: list[list[str]] = []
    sentences: list[str] = []
    for (scenario, brokers, spr), rows in _groups(runs):
        tree = next((r for r in rows if _is_tree(r)), None)
        for row in rows:
            vs = (lambda c: ratio(row.get(c), tree.get(c))) if tree and row is not tree \
                else (lambda c: "–")
            table.append([
                scenario, _num(brokers), _num(spr or None), _mode(row),
                _num(row.get("advisory_receipts")), _num(row.get("spilled_advisories")),
                _num(row.get("sibling_spill")), _num(row.get("downward_spill")),
                _num(row.get("demand_created")), _num(row.get("wasted_demand")),
                _num(row.get("max_demand_per_broker")), _pct(row), _num(row.get("stranded")),
                vs("spilled_advisories"), vs("demand_created"),
            ])
            if tree and row is not tree:
                sentences.append(
                    f"{scenario} ({_num(brokers)} brokers): {row.get('mode')} / tree "
                    f"spilled advisories = {vs('spilled_advisories')}, "
                    f"demand = {vs('demand_created')}")
    return table, sentences


# ----------------------------------------------------------------------------- summary

def headline_sentence(runs: Sequence[Row]) -> str:
    """One sentence with the numbers, for the top of the page: at the largest estate
    that has a tree run, what each other mode spills against the tree and strands that
    the tree delivers."""
    candidates = [(key, rows) for key, rows in _groups(runs)
                  if any(_is_tree(r) for r in rows) and len(rows) > 1]
    # modelled sweep estates without message figures cannot say what strands
    counted = [(key, rows) for key, rows in candidates
               if all(r.get("expected") is not None for r in rows)]
    candidates = counted or candidates
    if not candidates:
        return ""
    (scenario, brokers, spr), rows = max(candidates, key=lambda g: (g[0][1], g[0][0]))
    tree = next(r for r in rows if _is_tree(r))
    where = (f"At {scenario} ({_num(brokers)} brokers"
             + (f", {_num(spr)} stores per region" if spr else "") + ")")
    base = tree.get("spilled_advisories") or 0
    parts = []
    for row in rows:
        if row is tree:
            continue
        spilled = row.get("spilled_advisories") or 0
        times = ratio(spilled, base) + " the tree's" if base else f"{_num(spilled)} (tree 0)"
        more = (row.get("stranded") or 0) - (tree.get("stranded") or 0)
        strand = (f"strands {_plural(more, 'message')} the tree delivers" if more > 0
                  else "strands no more than the tree")
        dropped = (row.get("dropped") or 0) - (tree.get("dropped") or 0)
        if dropped > 0:   # e.g. a topic no store's interest reaches (one-way uplinks)
            strand += f" and drops {_plural(dropped, 'copy', 'copies')} the tree delivers"
        parts.append(f"{_mode(row)} spills {times} spilled advisories "
                     f"({_num(spilled)} vs {_num(base)}) and {strand}")
    return f"{where}: " + "; ".join(parts) + "."



def _waste_by_tier(roles: Sequence[Row], run: str) -> list[tuple[str, int]]:
    totals: dict[str, int] = defaultdict(int)
    for r in roles:
        if r.get("run") == run:
            totals[str(r.get("tier"))] += int(r.get("wasted_demand") or 0)
    return sorted(totals.items(), key=lambda kv: -kv[1])


def summary_lines(runs: Sequence[Row], roles: Sequence[Row] = ()) -> list[str]:
    """Plain-words findings generated from the numbers."""
    lines: list[str] = []
    if not runs:
        return ["No runs were read."]
    for (scenario, brokers, spr), rows in _groups(runs):
        if all(_modelled(r) and r.get("expected") is None for r in rows):
            continue   # a model sweep point without messages: the tables and plots say it
        tree = next((r for r in rows if _is_tree(r)), None)
        parts = []
        for row in rows:
            mode = str(row.get("mode"))
            said = []
            if _strands(row):
                said.append(f"strands {_plural(row.get('stranded') or 0, 'message')} "
                            f"(delivered {_pct(row)})")
            else:
                said.append(f"delivers {_pct(row)}")
            spilled = row.get("spilled_advisories") or 0
            if spilled:
                vs = ""
                if tree and row is not tree:
                    base = tree.get("spilled_advisories")
                    vs = f" ({ratio(spilled, base)} tree)" if base else " (tree: none)"
                wasted = _plural(row.get("wasted_demand") or 0, "demand subscription")
                said.append(f"spills {_plural(spilled, 'advisory', 'advisories')}{vs} "
                            f"and wastes {wasted}")
            else:
                said.append("spills no advisories")
            parts.append(f"{_mode(row)} " + " and ".join(said))
        size = f"{_num(brokers)} brokers" + (f", {spr} stores per region" if spr else "")
        lines.append(f"{scenario} ({size}): " + "; ".join(parts) + ".")

    stranding = sorted({str(r.get("mode")) for r in runs if _strands(r)})
    lines.append("Modes that strand messages somewhere: " + ", ".join(stranding) + "."
                 if stranding else "No mode stranded any message.")

    worst = max(runs, key=lambda r: r.get("spilled_advisories") or 0)
    if worst.get("spilled_advisories"):
        waste = _waste_by_tier(roles, str(worst.get("run")))
        total = sum(v for _, v in waste)
        where = ""
        if total:
            tier, amount = waste[0]
            where = (f"; {amount / total:.0%} of its wasted demand sits at {tier} "
                     "brokers")
        lines.append(f"Most spillage: {worst.get('mode')} in {worst.get('scenario')} "
                     f"({_num(worst.get('brokers'))} brokers), "
                     f"{_num(worst.get('spilled_advisories'))} advisory receipts at brokers "
                     f"that never needed them{where}.")

    for (scenario, brokers, _), rows in _groups(runs):
        meshes = [r for r in rows if _plain_ttl(r)]
        low = [r for r in meshes if _strands(r)]
        ok = [r for r in meshes if not _strands(r)]
        if low and ok:
            first_ok = ok[0]
            lines.append(
                f"{scenario} ({_num(brokers)} brokers): TTL "
                f"{', '.join(str(r.get('ttl')) for r in low)} strands messages; TTL "
                f"{first_ok.get('ttl')} delivers everything but spills "
                f"{_num(first_ok.get('spilled_advisories'))} advisories.")
    return lines


# ----------------------------------------------------------------------------- plots

def _palette(runs: Sequence[Row]) -> dict[str, str]:
    modes = sorted({(_mode_key(r), str(r.get("mode"))) for r in runs})
    colours = ["#2b7a3d", "#c0392b", "#e67e22", "#8e44ad", "#2980b9", "#7f8c8d",
               "#d35400", "#16a085"]
    return {mode: colours[i % len(colours)] for i, (_, mode) in enumerate(modes)}


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def _sensitivity(row: Row) -> bool:
    return str(row.get("scenario")).startswith(SENSITIVITY_SCENARIOS)


def plot_scale(runs: Sequence[Row]) -> bytes | None:
    """Demand subscriptions and advisory receipts against stores, log scale: the size
    sweep's runs (``SIZE_SWEEP``) only -- points from different workloads would not be a
    controlled comparison.  Modelled rows (``treefed model --sweep``, out to 100,000
    stores) are drawn as lines, emulated runs as points on top of them."""
    rows = [r for r in runs if str(r.get("scenario")).startswith(SIZE_SWEEP)
            and r.get("stores_per_region")]
    if not rows:
        return None

    def stores(r: Row) -> int:
        return int(r["stores_per_region"]) * int(r.get("regions") or 1)

    colour = _palette(runs)
    fig = Figure(figsize=(11, 4.2))
    axes = fig.subplots(1, 2)
    for ax, column, title in ((axes[0], "demand_created", "demand subscriptions created"),
                              (axes[1], "advisory_receipts", "advisory receipts")):
        by_mode: dict[tuple, list[Row]] = defaultdict(list)
        for r in rows:
            by_mode[(str(r.get("mode")), _modelled(r))].append(r)
        for (mode, modelled), series in sorted(by_mode.items(),
                                               key=lambda kv: (_mode_key(kv[1][0]),
                                                               not kv[0][1])):
            series.sort(key=lambda r: (stores(r), r.get("brokers") or 0))
            xs = [stores(r) for r in series]
            ys = [r.get(column) or 0 for r in series]
            if modelled:
                ax.plot(xs, ys, linestyle="-", marker=".", label=f"{mode} (model)",
                        color=colour[mode], alpha=0.8)
            else:
                ax.plot(xs, ys, linestyle="none", marker="o", markersize=7,
                        markerfacecolor="none", markeredgewidth=1.8,
                        label=f"{mode} (emulated)", color=colour[mode])
        ax.set_yscale("log", nonpositive="mask")
        xs = [stores(r) for r in rows]
        if max(xs) >= 10 * min(xs):
            ax.set_xscale("log")
        ax.set_xlabel("stores (all regions)")
        ax.set_ylabel(title)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)
    return _png(fig)


def plot_depth(runs: Sequence[Row]) -> bytes | None:
    """Spilled advisories and stranded messages against the number of levels below HQ:
    the depth sweep's runs (``DEPTH_SWEEP``) only."""
    rows = [r for r in runs if str(r.get("scenario")).startswith(DEPTH_SWEEP)
            and r.get("depth") is not None]
    if not rows:
        return None
    colour = _palette(runs)
    fig = Figure(figsize=(11, 4.2))
    axes = fig.subplots(1, 2)
    for ax, column, title in ((axes[0], "spilled_advisories", "spilled advisories"),
                              (axes[1], "stranded", "stranded messages")):
        by_mode: dict[str, list[Row]] = defaultdict(list)
        for r in rows:
            by_mode[str(r.get("mode"))].append(r)
        for mode, series in sorted(by_mode.items(), key=lambda kv: _mode_key(kv[1][0])):
            series.sort(key=lambda r: r["depth"])
            ax.plot([r["depth"] for r in series], [r.get(column) or 0 for r in series],
                    marker="o", label=mode, color=colour[mode])
        ax.set_yscale("symlog", linthresh=1)
        ax.set_xticks(sorted({r["depth"] for r in rows}))
        ax.set_xlabel("levels below HQ (same stores)")
        ax.set_ylabel(title)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)
    return _png(fig)


def plot_spill(runs: Sequence[Row]) -> bytes | None:
    """Useful and spilled advisory receipts per run (log scale)."""
    rows = [r for r in sorted(runs, key=lambda r: (_estate(r), _mode_key(r)))
            if r.get("advisory_receipts")]
    if not rows:
        return None
    fig = Figure(figsize=(9, 1.2 + 0.38 * len(rows)))
    ax = fig.subplots()
    ys = range(len(rows))
    useful = [(r.get("advisory_receipts") or 0) - (r.get("spilled_advisories") or 0)
              for r in rows]
    spilled = [r.get("spilled_advisories") or 0 for r in rows]
    ax.barh([y + 0.2 for y in ys], useful, height=0.4, color="#2b7a3d", label="useful")
    ax.barh([y - 0.2 for y in ys], spilled, height=0.4, color="#c0392b", label="spilled")
    ax.set_yticks(list(ys), [f"{r.get('scenario')} ({_num(r.get('brokers'))}) · "
                             f"{_mode(r)}" for r in rows])
    ax.invert_yaxis()
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel("advisory receipts")
    ax.set_ylabel("run: scenario (brokers) · mode")
    ax.set_title("spilled vs useful advisories", loc="right")
    ax.set_xlim(left=0)
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.04), ncol=2, frameon=False)
    ax.grid(True, axis="x", alpha=0.3)
    return _png(fig)


def plot_role_waste(runs: Sequence[Row], roles: Sequence[Row]) -> tuple[bytes, str] | None:
    """Wasted demand and spilled advisories by site tier, for the largest estate."""
    candidates = [key for key, _ in _groups([r for r in runs if not _sensitivity(r)])] \
        or [key for key, _ in _groups(runs)]
    if not candidates or not roles:
        return None
    estate = max(candidates, key=lambda k: (k[1], k[0]))
    members = sorted((r for r in runs if _estate(r) == estate), key=_mode_key)
    tiers = sorted({str(r.get("tier")) for r in roles},
                   key=lambda t: (_TIER_ORDER.get(t, 5), t))
    colour = _palette(runs)
    fig = Figure(figsize=(11, 4.2))
    axes = fig.subplots(1, 2)
    width = 0.8 / max(len(members), 1)
    for ax, column in ((axes[0], "wasted_demand"), (axes[1], "spilled_advisories")):
        top = 1
        for i, run in enumerate(members):
            totals: dict[str, int] = defaultdict(int)
            for r in roles:
                if r.get("run") == run.get("run"):
                    totals[str(r.get("tier"))] += int(r.get(column) or 0)
            heights = [totals[t] for t in tiers]
            top = max(top, *heights)
            ax.bar([t + i * width for t in range(len(tiers))], heights, width=width,
                   label=str(run.get("mode")), color=colour[str(run.get("mode"))])
        ax.set_xticks([t + width * (len(members) - 1) / 2 for t in range(len(tiers))],
                      tiers)
        ax.set_yscale("symlog", linthresh=1)
        ax.set_ylim(0, top * 3)   # symlog autoscaling clips the tallest bar
        ax.set_title(column.replace("_", " ") + " by site tier")
        ax.set_xlabel("site tier")
        ax.set_ylabel(column.replace("_", " "))
        ax.grid(True, axis="y", alpha=0.3)
    axes[1].legend(loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)
    return _png(fig), f"{estate[0]} ({_num(estate[1])} brokers)"


def plot_sensitivity(runs: Sequence[Row]) -> bytes | None:
    """Delivery, stranded and spilled against TTL, one line per scenario/depth; tree as
    a dashed reference line."""
    chosen = [r for r in runs if _sensitivity(r)] or list(runs)
    mesh = [r for r in chosen if _plain_ttl(r)]
    if not mesh:
        return None
    finite = [r["ttl"] for r in mesh if r["ttl"] >= 0]
    unlimited = any(r["ttl"] < 0 for r in mesh)   # TTL -1, drawn right of the largest
    unlimited_at = (max(finite) + 1) if finite else 1

    def x(row: Row) -> int:
        return row["ttl"] if row["ttl"] >= 0 else unlimited_at

    fig = Figure(figsize=(13, 4))
    axes = fig.subplots(1, 3)
    series: dict[tuple, list[Row]] = defaultdict(list)
    trees: dict[tuple, Row] = {}
    for r in chosen:
        key = (str(r.get("scenario")), r.get("depth"), r.get("brokers"))
        if _plain_ttl(r):
            series[key].append(r)
        elif _is_tree(r) and (key not in trees or r.get("mode") == "tree"):
            trees[key] = r    # the plain tree's line, not a variant's (tree-summary...)
    colours = ["#2980b9", "#c0392b", "#8e44ad", "#e67e22", "#16a085", "#7f8c8d"]
    panels = (("delivery_ratio", "delivered / expected"), ("stranded", "stranded messages"),
              ("spilled_advisories", "spilled advisories"))
    for n, (key, rows) in enumerate(sorted(series.items(), key=lambda kv: str(kv[0]))):
        rows.sort(key=x)
        label = f"{key[0]}" + (f" depth {key[1]}" if key[1] is not None else "")
        c = colours[n % len(colours)]
        for ax, (column, _) in zip(axes, panels):
            pts = [(x(r), r.get(column)) for r in rows if r.get(column) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", color=c, label=label)
            tree = trees.get(key)
            if tree is not None and tree.get(column) is not None:
                ax.axhline(tree[column], color=c, linestyle="--", alpha=0.7,
                           label=f"{label}: tree")
    ticks = sorted({x(r) for r in mesh})
    for ax, (column, title) in zip(axes, panels):
        ax.set_xticks(ticks, ["∞" if t == unlimited_at and unlimited else str(t)
                              for t in ticks])
        ax.set_xlabel("network TTL")
        ax.set_ylabel(title)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        if column == "spilled_advisories":
            ax.set_yscale("symlog", linthresh=1)
            top = max([r.get(column) or 0 for r in chosen] + [1])
            ax.set_ylim(0, top * 3)
    axes[0].set_ylim(-0.05, 1.05)
    axes[2].legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1),
                   frameon=False)
    return _png(fig)


# ----------------------------------------------------------------------------- output

# The headline and accounting tables carry spill, demand and delivery; this one the rest
# (a table of every column would not fit a 1,400-pixel window; runs.csv has them all).
_RUN_TABLE = (("scenario", "scenario"), ("mode", "mode"), ("brokers", "brokers"),
              ("stores_per_region", "stores/region"), ("depth", "depth"),
              ("consumers", "consumers"), ("advisory_frames", "advisory frames"),
              ("advisories_per_consumer", "receipts/consumer"), ("duplicates", "duplicates"),
              ("convergence_median_s", "first conv. median s"),
              ("convergence_p99_s", "first conv. p99 s"), ("fault_events", "fault events"),
              ("recovery", "recovery per fault event (at: s)"), ("bad_lines", "bad lines"))

_ROLE_TABLE = (("scenario", "scenario"), ("mode", "mode"), ("role", "role"),
               ("tier", "tier"), ("brokers", "brokers"),
               ("advisory_receipts", "receipts"), ("spilled_advisories", "spilled"),
               ("sibling_spill", "sibling"), ("downward_spill", "downward"),
               ("demand_created", "demand"), ("wasted_demand", "wasted"),
               ("max_demand_per_broker", "max demand/broker"), ("stranded", "stranded"))

_DEFINITIONS = (
    "A broker *sends to* a destination when, in the run, it produced a message to it or "
    "forwarded one of it. Interest in a destination is *useful* only at a broker that "
    "sends to it: a consumer of the broker's own does not make other brokers' consumers "
    "on the same destination useful to it.",
    "Advisory receipts count add advisories received (removals mirror them); *spilled* "
    "ones arrived at a broker that never sends to their destination. Receipts per "
    "consumer = receipts / consumers.",
    "Spill by origin: *sibling spill* is advisories a store receives about another "
    "store's consumers (TTL flooding across the region); *downward interest* is region or "
    "HQ interest sent to stores that never send to it (AMQ-2875 rule 4: interest at a "
    "branch or the root travels down its whole subtree -- the tree connector does this "
    "too, which is where the tree's own spill comes from). The rest of the spill lands at "
    "regions and HQ.",
    "Demand is a demand subscription created for remote interest; *wasted* demand sits at "
    "a broker that never sends to its destination. Max demand/broker is the peak held.",
    "Delivered counts copies: a queue message once, a topic message once per subscriber, "
    "the unit of the runner's expected (summary.json); stranded counts messages held at "
    "the end with no route.",
    "First convergence runs from a consumer's first add to the last demand created for "
    "it before the run's next fault event. A fault event is a link going down (cut, "
    "broker killed) or coming back after one; its *recovery* is the time from it to the "
    "last demand created or removed before the next fault event, reported per event.",
    "Accounting, per expected copy (a queue message is one, a topic message one per "
    "subscriber): expected = delivered + stranded + dropped + lost. Stranded: a queue "
    "message still waiting at the end, at the broker named, with no route to its "
    "consumer. Dropped: refused by a broker with a logged reason (no_route: a topic "
    "message reached a broker that knew no subscriber for it; broker_killed: a "
    "non-persistent message held by a broker that was killed). Lost: none of these; a "
    "run whose lost is not 0 is refused.",
    "Tree variants: tree-summary is the tree with summary_budget (a branch past that "
    "many interest entries on its link up sends aggregate entries and an ownership cover "
    "for its stores' own queues instead); tree-resync the tree with resync_grace (a link "
    "back within the grace re-sends only the interest that changed). HQ demand entries "
    "is the most demand HQ held at once; extra hops count forwards down to a child whose "
    "subtree never delivered that message (a store queue nobody consumes waits at its "
    "region under summarisation); recovery frames are the advisory frames sent from each "
    "fault event to the next (the last: to the end of the run).",
    "Rows marked [model] were computed by treefed model, not emulated: the estate's first "
    "convergence walked with the connectors' rules (exact against the replay engine "
    "wherever both run), the workload's messages routed over that demand with the "
    "brokers' dispatch rules. A modelled row has no log, so no convergence times; a "
    "modelled sweep row without message figures shows \u2013 for them.",
)


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(out)


def _html_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cells(rows: Sequence[Row], spec: Sequence[tuple[str, str]]) -> list[list[str]]:
    return [[_mode(r) if key == "mode" else _num(r.get(key)) for key, _ in spec]
            for r in rows]


ACCOUNTING_COLUMNS = ("scenario", "brokers", "mode", "expected", "delivered", "stranded",
                      "stranded at (most first)", "dropped", "dropped by reason", "lost")


def accounting(runs: Sequence[Row]) -> list[list[str]]:
    """Per run, where every expected message copy went:
    expected = delivered + stranded + dropped + lost (a "–" where the run has no
    summary.json to say)."""
    return [[str(r.get("scenario")), _num(r.get("brokers")), _mode(r),
             _num(r.get("expected")), _num(r.get("delivered")), _num(r.get("stranded")),
             str(r.get("stranded_at") or "–"), _num(r.get("dropped")),
             str(r.get("dropped_reasons") or "–"), _num(r.get("lost"))] for r in runs]


_CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;
color:#222;line-height:1.45}table{border-collapse:collapse;font-size:13px;margin:1em 0}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}th{background:#f0f0f0}
td:nth-child(-n+4){text-align:left}img{max-width:100%;border:1px solid #eee}
figure{margin:1.5em 0}.headline{font-size:18px;font-weight:600}figcaption{color:#555;font-size:14px}code{background:#f5f5f5}"""


def render(runs: Sequence[Row], roles: Sequence[Row], out_dir: str | Path, *,
           title: str = "treefed: tree vs TTL federation") -> dict[str, Path]:
    """Write report.md, index.html and the plot PNGs into ``out_dir``; return their paths
    by name (``report``, ``html``, and one per plot drawn)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = sorted(runs, key=lambda r: (_estate(r), _mode_key(r)))
    table, sentences = headline(runs)
    summary = summary_lines(runs, roles)

    plots: list[tuple[str, str, bytes]] = []   # (name, caption, png)
    if (png := plot_scale(runs)) is not None:
        plots.append(("scale", "Size sweep (one workload): demand subscriptions and "
                               "advisory receipts against stores (log scale); lines are "
                               "modelled (treefed model), rings emulated runs.", png))
    if (png := plot_depth(runs)) is not None:
        plots.append(("depth", "Depth sweep (one workload, the same stores): spilled "
                               "advisories and stranded messages against levels below HQ.",
                      png))
    if (png := plot_spill(runs)) is not None:
        plots.append(("spill", "Spilled vs useful advisory receipts per run.", png))
    if (drawn := plot_role_waste(runs, roles)) is not None:
        plots.append(("roles", f"Where the waste lands, by site tier: {drawn[1]}.", drawn[0]))
    if (png := plot_sensitivity(runs)) is not None:
        plots.append(("ttl", "Delivery, stranded messages and spilled advisories against "
                             "network TTL (dashed: tree).", png))

    written: dict[str, Path] = {}
    for name, _, png in plots:
        path = out / f"{name}.png"
        path.write_bytes(png)
        written[name] = path

    bad = [r for r in runs if r.get("bad_lines")]
    bad_note = [f"{r.get('run')}: {_num(r.get('bad_lines'))} of {_num(r.get('lines'))} "
                "log lines did not parse and were skipped." for r in bad]
    run_rows = _cells(runs, _RUN_TABLE)
    role_rows = _cells(roles, _ROLE_TABLE)

    acct = accounting(runs)
    partial = [f"{r.get('run')}: {r.get('problems')}" for r in runs if r.get("problems")]
    top = headline_sentence(runs)
    md = [f"# {title}", ""] + ([f"**{top}**", ""] if top else []) + \
         ["## Summary", ""] + [f"- {s}" for s in summary]
    if partial:
        md += ["", "## Partial runs (included with --allow-partial)", ""] + \
              [f"- {p}" for p in partial]
    md += ["", "## Headline: tree vs each TTL mode", "", _md_table(HEADLINE_COLUMNS, table),
           ""] + [f"- {s}" for s in sentences]
    cost_estate, cost_rows = costs(runs)
    md += ["", f"## What each mode costs the operator: {cost_estate}", "",
           _md_table(COST_COLUMNS, cost_rows)]
    variant_rows = variants(runs)
    if variant_rows:
        md += ["", "## Tree variants against the plain tree: summarisation and resync", "",
               _md_table(VARIANT_COLUMNS, variant_rows)]
    md += ["", "## Accounting: where every expected copy went", "",
           _md_table(ACCOUNTING_COLUMNS, acct)]
    md += ["", "## Plots", ""]
    md += [f"![{caption}]({name}.png)\n\n{caption}\n" for name, caption, _ in plots]
    md += ["## All runs", "", _md_table([h for _, h in _RUN_TABLE], run_rows), "",
           "## Per role and tier", "", _md_table([h for _, h in _ROLE_TABLE], role_rows), "",
           "## Definitions", ""] + [f"- {d}" for d in _DEFINITIONS]
    if bad_note:
        md += ["", "## Unparsed log lines", ""] + [f"- {n}" for n in bad_note]
    md += ["", "Tables: `runs.csv`, `per_role.csv`, Parquet under `tables/`.", ""]
    written["report"] = out / "report.md"
    written["report"].write_text("\n".join(md), encoding="utf-8")

    def li(items: Sequence[str]) -> str:
        return "<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in items) + "</ul>"

    figures = "".join(
        f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,'
        f'{base64.b64encode(png).decode("ascii")}"><figcaption>{html.escape(caption)}'
        "</figcaption></figure>" for _, caption, png in plots)
    page = (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        + (f'<p class="headline">{html.escape(top)}</p>' if top else "")
        + f"<h2>Summary</h2>{li(summary)}"
        + (f"<h2>Partial runs (included with --allow-partial)</h2>{li(partial)}"
           if partial else "")
        + f"<h2>Headline: tree vs each TTL mode</h2>{_html_table(HEADLINE_COLUMNS, table)}"
        f"{li(sentences)}"
        f"<h2>What each mode costs the operator: {html.escape(cost_estate)}</h2>"
        f"{_html_table(COST_COLUMNS, cost_rows)}"
        + (f"<h2>Tree variants against the plain tree: summarisation and resync</h2>"
           f"{_html_table(VARIANT_COLUMNS, variant_rows)}" if variant_rows else "")
        + f"<h2>Accounting: where every expected copy went</h2>"
        f"{_html_table(ACCOUNTING_COLUMNS, acct)}<h2>Plots</h2>{figures}"
        f"<h2>All runs</h2>{_html_table([h for _, h in _RUN_TABLE], run_rows)}"
        f"<h2>Per role and tier</h2>{_html_table([h for _, h in _ROLE_TABLE], role_rows)}"
        f"<h2>Definitions</h2>{li(_DEFINITIONS)}"
        + (f"<h2>Unparsed log lines</h2>{li(bad_note)}" if bad_note else "")
        + "<p>Tables: <code>runs.csv</code>, <code>per_role.csv</code>, Parquet under "
          "<code>tables/</code>.</p></body></html>")
    written["html"] = out / "index.html"
    written["html"].write_text(page, encoding="utf-8")
    return written
