"""``treefed model SCENARIO --sweep 10,100,...``: the model across estate sizes.

Theory of operation
-------------------
One scenario's estate shape and workload, resized to each total number of stores in
the sweep (``--regions`` regions, 10 by default, the stores spread evenly: a total that
does not divide keeps ``total // regions`` per region, and the rows say how many stores
there really were), modelled in every mode with the same engine as a single run.  Written
to DIR, every row and the page marked as modelled:

* ``sweep.csv`` -- ``model.csv``'s rows for every size (``source = model``);
* ``runs.csv`` -- the same in the report's runs schema (``RUN_COLUMNS``, which must stay
  equal to ``treefed.analysis.job.RUN_COLUMNS``; a test holds them together) plus a
  trailing ``source`` column: the report's ``spilled_advisories`` is the model's
  ``sibling_spill`` (a store hearing another store's consumer -- in a store estate
  nothing else is interested in a store's own queue at first convergence); columns the
  model does not compute (deliveries, convergence, wasted demand, log lines) are empty;
* ``scale.png`` -- advisory frames, demand and sibling spill per mode against stores,
  log-log; zeros (tree and TTL 1 have no sibling spill) cannot sit on a log axis and
  are listed in the panel's title instead;
* ``index.html`` -- the plot and the table, headed "modelled".
"""

from __future__ import annotations

import csv
import html
from pathlib import Path
from typing import Sequence

__all__ = ["RUN_COLUMNS", "parse_sizes", "run_rows", "write_sweep"]

#: ``treefed.analysis.job.RUN_COLUMNS`` (tests/model/test_sweep.py checks they agree).
RUN_COLUMNS: tuple[str, ...] = (
    "run", "scenario", "mode", "ttl", "engine", "brokers", "links", "regions",
    "stores_per_region", "depth", "consumers", "advisory_frames", "advisory_receipts",
    "spilled_advisories", "advisories_per_consumer", "demand_created", "wasted_demand",
    "max_demand_per_broker", "expected", "delivered", "delivery_ratio", "deliveries",
    "duplicates", "stranded", "convergence_median_s", "convergence_p99_s", "lines",
    "bad_lines", "run_wall_s", "run_peak_rss_mb",
    "dropped", "dropped_reasons", "lost", "stranded_at", "stranded_log", "summary_lines",
    "finished", "problems",
    "sibling_spill", "downward_spill", "fault_events", "recovery_max_s", "recovery",
    "root_demand", "extra_hops", "recovery_frames", "recovery_frames_by_event",
)
PANELS = (("adds_sent", "advisory frames sent"), ("demand", "demand created"),
          ("sibling_spill", "sibling spill (advisories)"))


def parse_sizes(text: str, regions: int) -> list[int]:
    """``"10,100,1000"`` -> stores per region for each total; ValueError when a total is
    not a positive integer or is smaller than the number of regions."""
    sizes = []
    for part in text.split(","):
        try:
            total = int(part)
        except ValueError:
            raise ValueError(f"--sweep: {part!r} is not a number of stores") from None
        if total < regions:
            raise ValueError(f"--sweep: {total} stores cannot fill {regions} regions")
        sizes.append(total // regions)
    if not sizes:
        raise ValueError("--sweep: no sizes")
    return sizes


def run_rows(rows: Sequence[dict]) -> list[dict]:
    """``model.csv`` rows in the report's runs schema (module docstring)."""
    out = []
    for r in rows:
        mode = r["mode"]
        ttl = mode.removeprefix("mesh-ttl") if mode.startswith("mesh-ttl") else ""
        consumers = int(r["consumers"])
        out.append({
            "run": f"model:{r['scenario']}:{mode}", "scenario": r["scenario"], "mode": mode,
            "ttl": ttl, "engine": "model", "brokers": r["brokers"], "links": r["links"],
            "regions": r["regions"], "stores_per_region": r["stores_per_region"],
            "consumers": consumers, "advisory_frames": r["adds_sent"],
            "advisory_receipts": r["adds_received"], "spilled_advisories": r["sibling_spill"],
            "advisories_per_consumer": round(int(r["adds_received"]) / consumers, 3)
            if consumers else "",
            "demand_created": r["demand"], "max_demand_per_broker": r["max_demand"],
            # the report's split of spill by origin; the model's downward figure counts
            # receipts of an ancestor's interest at any broker below it (stores and layers)
            "sibling_spill": r["sibling_spill"], "downward_spill": r["downward_interest"],
            "run_wall_s": r["wall_s"], "source": "model"})
        if r.get("messages") not in (None, ""):   # --messages: the accounting and the
            row = out[-1]                          # report's own spill definition
            expected, delivered = int(r["expected"]), int(r["delivered"])
            row.update({
                "expected": expected, "delivered": delivered,
                "delivery_ratio": round(delivered / expected, 4) if expected else "",
                "stranded": r["stranded"], "stranded_at": r["stranded_at"],
                "dropped": r["dropped"], "lost": 0})
            if r.get("spilled") not in (None, ""):   # exact walk: every message's path
                row.update({
                    "spilled_advisories": r["spilled"], "wasted_demand": r["wasted_demand"],
                    "sibling_spill": r["spilled_sibling"],
                    "downward_spill": r["spilled_downward"]})
    return out


def write_sweep(out: Path, rows: Sequence[dict]) -> None:
    """sweep.csv, runs.csv, scale.png and index.html for the sweep's ``rows``."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    _csv(out / "sweep.csv", columns, rows)
    _csv(out / "runs.csv", [*RUN_COLUMNS, "source"], run_rows(rows))
    plot(out / "scale.png", rows)
    _page(out / "index.html", rows)


def _csv(path: Path, columns: Sequence[str], rows: Sequence[dict]) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in columns})


def plot(path: Path, rows: Sequence[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(dict.fromkeys(r["mode"] for r in rows))
    fig, axes = plt.subplots(1, len(PANELS), figsize=(15, 4.6))
    for ax, (key, title) in zip(axes, PANELS):
        zero, some = [], []
        for mode in modes:
            pts = sorted((int(r["stores"]), int(r[key])) for r in rows if r["mode"] == mode)
            shown = [(x, y) for x, y in pts if y > 0]
            if not shown:
                zero.append(mode)
            elif len(shown) < len(pts):
                some.append(mode)
            if shown:
                ax.plot(*zip(*shown), marker="o", label=mode)
        notes = ([f"0 at every size: {', '.join(zero)}"] if zero else []) \
            + ([f"0 at some sizes (not drawn): {', '.join(some)}"] if some else [])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("stores in the estate (log)")
        ax.set_ylabel(f"{title} (log)")
        ax.set_title("\n".join([title, *notes]), fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    scenario = rows[0]["scenario"].split("@")[0] if rows else ""
    fig.suptitle(f"modelled (first convergence, not emulated): {scenario}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _page(path: Path, rows: Sequence[dict]) -> None:
    cols = ("stores", "regions", "stores_per_region", "mode", "brokers", "consumers",
            "adds_sent", "adds_received", "demand", "max_demand", "sibling_spill",
            "downward_interest", "wall_s")
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "\n".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(c, '')))}</td>" for c in cols)
        + "</tr>" for r in rows)
    scenario = html.escape(rows[0]["scenario"].split("@")[0]) if rows else ""
    path.write_text(f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>treefed model sweep: {scenario}
(modelled)</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:2px 8px;text-align:right}}
.modelled{{background:#fff3cd;padding:4px 8px}}</style></head><body>
<h1>{scenario}: scale sweep <span class="modelled">modelled</span></h1>
<p class="modelled">Every figure on this page is <strong>modelled</strong> by
<code>treefed model</code> (the estate's first convergence: advisories, demand,
refusals), not measured in an emulated estate. Timelines and messages are not modelled.</p>
<img src="scale.png" alt="advisory frames, demand and sibling spill per mode against
stores, log scale (modelled)">
<table><thead><tr>{head}</tr></thead><tbody>
{body}
</tbody></table>
<p>Data: <a href="sweep.csv">sweep.csv</a>, <a href="runs.csv">runs.csv</a> (the report's
runs schema, <code>source = model</code>).</p>
</body></html>
""", encoding="utf-8")


def _fmt(v) -> str:
    return f"{v:,}" if isinstance(v, int) else str(v)
