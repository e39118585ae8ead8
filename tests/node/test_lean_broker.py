"""An idle ``treefed broker`` process loads only what serving needs (issue #14, idle RSS).

A real ``treefed broker`` runs in a subprocess through the CLI's own ``main``; a helper
thread in that process waits until the broker logged ``broker.listening``, writes the
process's ``sys.modules`` to a file and sends the process SIGTERM.  Parsers, renderers
and protocol stacks that only some brokers use must not be among them: each costs MiB
of RSS in every one of thousands of store brokers.

(``ssl`` itself cannot be kept out: trio imports it at ``import trio``.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: loaded on demand only: the selector grammar, the console renderer's pretty
#: tracebacks, certificate generation, monitoring, STOMP, the operator tools, Spark
NOT_AT_START = ("lark", "rich", "pygments", "cryptography", "prometheus_client", "h11",
                "treefed.monitor", "treefed.stomp",
                "treefed.node.stomp_conn", "treefed.ops.estate_map", "treefed.scenario",
                "pyspark", "difflib")

_DRIVER = textwrap.dedent(r"""
    import json, os, signal, socket, sys, threading, time

    log, out, config = sys.argv[1:4]

    def talk_stomp(text):
        # a STOMP client connects: the broker then needs its STOMP stack
        for line in text.splitlines():
            entry = json.loads(line)
            if entry.get("event") == "broker.listening" and entry["uri"].startswith("stomp:"):
                host, port = entry["uri"].split("//")[1].rsplit(":", 1)
                with socket.create_connection((host, int(port))) as s:
                    s.sendall(b"CONNECT\naccept-version:1.2\nhost:lean\n\n\0")
                    assert s.recv(4096).startswith(b"CONNECTED")

    def watch():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                text = open(log).read()
            except FileNotFoundError:
                text = ""
            if text.count("broker.listening") >= int(sys.argv[4]):
                break
            time.sleep(0.05)
        time.sleep(0.3)
        talk_stomp(text)
        with open(out, "w") as f:
            json.dump(sorted(sys.modules), f)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True).start()
    from treefed.cli import main
    sys.exit(main(["broker", "--config", config]))
""")


def _modules_of_idle_broker(tmp_path: Path, extra: str = "") -> list[str]:
    log = tmp_path / "broker.log"
    config = tmp_path / "broker.toml"
    config.write_text(textwrap.dedent(f"""
        [broker]
        id = "lean"
        data_dir = "{tmp_path / 'data'}"
        listen = ["tcp://127.0.0.1:0"{extra}]

        [logging]
        level = "info"
        file = "{log}"
    """))
    out = tmp_path / "modules.json"
    listeners = 2 if extra else 1
    proc = subprocess.run([sys.executable, "-c", _DRIVER, str(log), str(out), str(config),
                           str(listeners)],
                          cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text())


def _loaded(modules: list[str], name: str) -> bool:
    return any(m == name or m.startswith(name + ".") for m in modules)


def test_idle_broker_does_not_load_what_it_does_not_use(tmp_path):
    modules = _modules_of_idle_broker(tmp_path)
    # the check sees the real process: the broker itself is there
    assert "treefed.node.node" in modules and "trio" in modules and "sqlite3" in modules
    loaded = [name for name in NOT_AT_START if _loaded(modules, name)]
    assert loaded == [], f"an idle broker imported {loaded}"


def test_a_stomp_client_loads_stomp(tmp_path):
    # the same check notices a module that IS needed: a STOMP client's connection
    modules = _modules_of_idle_broker(tmp_path, ', "stomp://127.0.0.1:0"')
    assert _loaded(modules, "treefed.stomp") and "treefed.node.stomp_conn" in modules


def test_rich_stays_importable_after_the_broker_hid_it():
    code = ("from treefed.cli import _import_structlog_plain\n"
            "_import_structlog_plain()\n"
            "import structlog.dev, sys\n"
            "assert structlog.dev.rich is None\n"
            "assert 'rich' not in sys.modules\n"
            "try:\n"
            "    import rich\n"
            "except ImportError:\n"
            "    pass   # not installed: nothing to check\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
