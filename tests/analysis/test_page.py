"""The report page as a person sees it: index.html rendered by headless Chromium in a
1,400-pixel window.  Fails on a table wider than the page; keeps a screenshot to look at.

Chromium is a Debian package (`make test` installs it when it can: see the Makefile's
``browser`` step); without it this test skips and says why.  The page is rendered with a
probe script appended to a copy (the report itself has no script): it writes, for every
table, its right edge against the window width into the DOM, which ``--dump-dom`` prints.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from treefed.analysis import report

from .test_report import DEPTH_RUNS, ROLES, RUNS

WIDTH = 1400
PROBE = """<script>
const width = document.documentElement.clientWidth;
const tables = [...document.querySelectorAll('table')].map((t, i) => ({
  i, right: Math.ceil(t.getBoundingClientRect().right), cols: t.rows[0].cells.length,
  head: t.rows[0].cells[0].textContent}));
const imgs = [...document.querySelectorAll('img')].map(im => ({
  right: Math.ceil(im.getBoundingClientRect().right), w: im.naturalWidth}));
const pre = document.createElement('pre');
pre.id = 'probe';
pre.textContent = JSON.stringify({width, tables, imgs});
document.body.appendChild(pre);
</script></body>"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") \
        or shutil.which("google-chrome")


def estate_rows():
    """A realistic page: every compared mode (tree, TTL 1-3, the tuned baselines) at
    several sizes."""
    rows = []
    for r in RUNS + DEPTH_RUNS:
        rows.append(dict(r, sibling_spill=r["spilled_advisories"], downward_spill=12,
                         dropped=0, lost=0, dropped_reasons=None,
                         stranded_at="store-r1-0002: 3, hq: 1, +1,234 more brokers",
                         fault_events=2, recovery_max_s=0.004,
                         recovery="10.000 s: 0.00400, 20.000 s: 0.00200"))
        if r["mode"] == "mesh-ttl2":
            rows.append(dict(rows[-1], mode="mesh-tuned", run=r["run"] + "-tuned",
                             spilled_advisories=4_020_024, advisory_receipts=8_016_020))
            rows.append(dict(rows[-1], mode="mesh-tuned-oneway", run=r["run"] + "-oneway",
                             dropped=1_000_000, dropped_reasons="no_route: 1,000,000"))
            rows.append(dict(rows[-1], mode="nats-isolated", ttl=None,
                             run=r["run"] + "-isolated", dropped=0, dropped_reasons=None))
    return rows


needs_browser = pytest.mark.skipif(
    chromium() is None,
    reason="headless Chromium not installed (Debian package `chromium`; `make test` "
           "installs it when run as root with apt-get)")


@needs_browser
@pytest.mark.slow
def test_page_fits_a_1400_pixel_window(tmp_path):
    out = tmp_path / "report"
    report.render(estate_rows(), ROLES, out)
    page = (out / "index.html").read_text(encoding="utf-8")
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("</body>", PROBE), encoding="utf-8")
    base = [chromium(), "--headless", "--no-sandbox", "--disable-gpu",
            "--disable-dev-shm-usage", f"--window-size={WIDTH},1000",
            "--hide-scrollbars", "--virtual-time-budget=3000"]
    done = subprocess.run([*base, "--dump-dom", probed.as_uri()], capture_output=True,
                          text=True, timeout=120)
    found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.S)
    assert found, done.stderr[-2000:]
    facts = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert facts["width"] <= WIDTH
    wide = [t for t in facts["tables"] if t["right"] > facts["width"]]
    assert not wide, f"tables wider than the {facts['width']} px page: {wide}"
    assert all(im["right"] <= facts["width"] for im in facts["imgs"]), facts["imgs"]
    # the screenshot a person looks at (kept under the test's tmp dir)
    shot = tmp_path / "page.png"
    subprocess.run([*base, f"--screenshot={shot}", (out / "index.html").as_uri()],
                   capture_output=True, timeout=120)
    assert shot.read_bytes().startswith(b"\x89PNG")


def test_page_check_says_why_it_skips():
    """Without Chromium the skip reason names the package and the Makefile step."""
    assert "Debian package `chromium`" in needs_browser.kwargs["reason"]
    assert Path(__file__).resolve().parents[2].joinpath("Makefile").read_text() \
        .count("chromium") >= 1
