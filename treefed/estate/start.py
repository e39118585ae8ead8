"""``treefed estate start DIR``: run a generated estate's brokers on this machine.

Theory of operation
-------------------
One ``treefed broker --config <site>.toml`` process per site config in ``DIR`` (or the
sites named), started parents first, each with its working directory at ``DIR`` (the
configs' relative paths -- data, certificates -- resolve there) and its event log in
``DIR/logs/<site>.log``.  ``wait_linked`` reads those logs until every started site that
has a started parent logged ``link.up`` with it: the estate is linked.  ``stop`` sends
SIGTERM (a broker's graceful shutdown) and SIGKILL to whatever has not exited after
``grace`` seconds.  For demos and tests on one machine; a real estate runs one broker per
host under its own supervisor.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from treefed.errors import ConfigError

__all__ = ["RunningEstate", "start_estate"]


@dataclass(slots=True)
class RunningEstate:
    folder: Path
    parents: dict[str, str | None]                  # started site -> its parent
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def log(self, site: str) -> Path:
        return self.folder / "logs" / f"{site}.log"

    def links_up(self) -> set[tuple[str, str]]:
        """(site, peer) pairs whose link.up the site has logged."""
        out = set()
        for site in self.procs:
            try:
                text = self.log(site).read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                if '"link.up"' in line:
                    try:
                        out.add((site, json.loads(line)["peer"]))
                    except (ValueError, KeyError):
                        pass
        return out

    def missing_links(self) -> list[tuple[str, str]]:
        up = self.links_up()
        return [(s, p) for s, p in self.parents.items()
                if p is not None and p in self.procs and (s, p) not in up]

    def wait_linked(self, timeout: float = 60.0) -> list[tuple[str, str]]:
        """Wait until every child-parent link is up; returns those still missing."""
        deadline = time.monotonic() + timeout
        while True:
            for site, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"broker {site} exited with {proc.returncode}: "
                                       + self.log(site).read_text()[-1500:])
            missing = self.missing_links()
            if not missing or time.monotonic() > deadline:
                return missing
            time.sleep(0.1)

    def stop(self, grace: float = 10.0) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def start_estate(folder: str | Path, sites: Iterable[str] | None = None) -> RunningEstate:
    """Start the brokers of ``folder`` (all, or ``sites``), parents first."""
    from treefed.estate.forecast import load_estate

    folder = Path(folder).resolve()
    est = load_estate([folder])
    wanted = list(est.configs) if sites is None else list(sites)
    for s in wanted:
        if s not in est.configs:
            raise ConfigError("sites", f"no site {s!r} in {folder}")
    parent: dict[str, str | None] = {s: None for s in est.configs}
    for link in est.links:
        parent.setdefault(link.dialer, None)
        parent[link.dialer] = link.acceptor

    def depth(s: str) -> int:
        d, p = 0, parent.get(s)
        while p is not None and d <= len(parent):
            d, p = d + 1, parent.get(p)
        return d

    running = RunningEstate(folder, {s: parent[s] for s in wanted})
    (folder / "logs").mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                else "")
    try:
        for s in sorted(wanted, key=lambda x: (depth(x), x)):
            config = Path(est.files[s]).resolve()
            running.procs[s] = subprocess.Popen(
                [sys.executable, "-m", "treefed.cli", "broker", "--config", str(config)],
                cwd=folder, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=running.log(s).open("ab"), env=env)
    except BaseException:
        running.stop(grace=2.0)
        raise
    return running
