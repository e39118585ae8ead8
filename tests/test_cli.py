"""The `treefed` command: config validation, the client tools against a broker process,
and the lazily imported subcommands."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import trio

from treefed import cli
from treefed.client import connect

from tests.node.helpers import REPO_ROOT, BrokerProcess, child_env, write_config


def run_cli(*args: str, timeout: float = 30.0, stdin: str | None = None,
            ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "treefed.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout, env=child_env(),
                          cwd=str(REPO_ROOT))


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """One `treefed broker` process shared by this module's client-tool tests."""
    tmp = tmp_path_factory.mktemp("cli-broker")
    proc = BrokerProcess(write_config(tmp / "b.toml", "cli-broker", tmp / "data"),
                         tmp / "broker.log")
    proc.start()
    yield proc
    proc.cleanup()


class TestBrokerCommand:
    def test_invalid_config_exits_2_naming_key(self, tmp_path, capsys):
        """An invalid config exits with status 2 and names the key and the problem."""
        path = tmp_path / "bad.toml"
        path.write_text('[broker]\nid = "x"\nmax_redeliveries = -3\n')
        assert cli.main(["broker", "--config", str(path)]) == 2
        err = capsys.readouterr().err
        assert "broker.max_redeliveries" in err and ">= 0" in err

    def test_unknown_key_as_a_process(self, tmp_path):
        """The real command exits 2 for a typo'd key and suggests the right one."""
        path = tmp_path / "typo.toml"
        path.write_text('[broker]\nid = "x"\nlisten = ["tcp://127.0.0.1:0"]\n'
                        'max_redeliverys = 3\n')
        result = run_cli("broker", "--config", str(path))
        assert result.returncode == 2
        assert "broker.max_redeliverys" in result.stderr
        assert "max_redeliveries" in result.stderr

    def test_missing_file_exits_2(self, tmp_path, capsys):
        """A config file that does not exist is a config error (status 2)."""
        assert cli.main(["broker", "--config", str(tmp_path / "nope.toml")]) == 2
        assert "cannot read" in capsys.readouterr().err

    def test_sigterm_stops_gracefully_with_status_0(self, tmp_path):
        """SIGTERM makes the broker process stop cleanly and exit 0."""
        proc = BrokerProcess(write_config(tmp_path / "b.toml", "term", tmp_path / "d"),
                             tmp_path / "log")
        try:
            proc.start()
            assert proc.terminate() == 0
            assert '"broker.stopped"' in proc.log_path.read_text()
        finally:
            proc.cleanup()


class TestBrokerStartFailures:
    def test_port_in_use_exits_1(self, broker, tmp_path):
        """A listener that cannot bind fails the start with status 1 and a message."""
        port = int(broker.uri.rsplit(":", 1)[1])
        path = write_config(tmp_path / "clash.toml", "clash", tmp_path / "d", port=port)
        result = run_cli("broker", "--config", str(path))
        assert result.returncode == 1
        assert "cannot listen" in result.stderr and "Traceback" not in result.stderr

    def test_locked_data_dir_exits_1(self, broker, tmp_path):
        """A second broker on a data directory in use is refused (status 1)."""
        data_dir = broker.config_path.parent / "data"
        path = write_config(tmp_path / "twin.toml", "twin", data_dir)
        result = run_cli("broker", "--config", str(path))
        assert result.returncode == 1
        assert "locked by another broker" in result.stderr


class TestClientTools:
    def test_send_consume_stat(self, broker):
        """send puts messages (headers typed), consume prints them as JSON lines and
        acks them, stat shows the destination's counters."""
        sent = run_cli("send", broker.uri, "queue://cli.q", "hello", "--count", "3",
                       "--persistent", "--header", "store=0001", "--header", "n=7")
        assert sent.returncode == 0, sent.stderr
        assert json.loads(sent.stdout)["sent"] == 3
        got = run_cli("consume", broker.uri, "queue://cli.q", "--count", "3")
        assert got.returncode == 0, got.stderr
        lines = [json.loads(line) for line in got.stdout.splitlines()]
        assert [m["body"] for m in lines] == ["hello"] * 3
        assert lines[0]["headers"] == {"store": 1, "n": 7}
        assert lines[0]["persistent"] is True
        stat = run_cli("stat", broker.uri)
        assert stat.returncode == 0, stat.stderr
        dst = json.loads(stat.stdout)["destinations"]["queue://cli.q"]
        assert (dst["enqueued"], dst["dequeued"], dst["depth"]) == (3, 3, 0)

    def test_consume_selector_and_idle_timeout(self, broker):
        """consume applies the selector and stops after --timeout idle seconds."""
        async def produce():
            async with connect(broker.uri) as conn:
                for store in ("a", "b", "a"):
                    await conn.send("queue://cli.sel", store, headers={"store": store})

        trio.run(produce)
        got = run_cli("consume", broker.uri, "queue://cli.sel", "--selector",
                      "store = 'a'", "--timeout", "0.5")
        assert got.returncode == 0, got.stderr
        assert [json.loads(line)["body"] for line in got.stdout.splitlines()] == ["a", "a"]

    def test_send_body_from_stdin(self, broker):
        """Without a BODY argument, send reads it from stdin."""
        assert run_cli("send", broker.uri, "queue://cli.stdin", stdin="piped").returncode == 0
        got = run_cli("consume", broker.uri, "queue://cli.stdin", "--count", "1")
        assert json.loads(got.stdout)["body"] == "piped"

    def test_bad_selector_exits_1_with_broker_error(self, broker):
        """A refused subscription reports the broker's error code and exits 1."""
        got = run_cli("consume", broker.uri, "queue://cli.q", "--selector", "a = = 1",
                      "--timeout", "0.2")
        assert got.returncode == 1
        assert "bad_selector" in got.stderr and "position" in got.stderr

    def test_unreachable_broker_exits_1(self, tmp_path):
        """stat against a port nobody listens on fails with status 1, not a traceback."""
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        got = run_cli("stat", f"tcp://127.0.0.1:{port}")
        assert got.returncode == 1
        assert "cannot connect" in got.stderr and "Traceback" not in got.stderr


class TestDelegatedCommands:
    def test_missing_module_exits_2(self, monkeypatch, capsys):
        """A subcommand whose package is not installed says so and exits 2."""
        monkeypatch.setitem(cli._DELEGATED, "report", "treefed.not_built_yet:main")
        assert cli.main(["report", "runs/x"]) == 2
        assert "not available" in capsys.readouterr().err

    def test_arguments_are_passed_through(self, monkeypatch):
        """The delegated function receives the remaining argv untouched."""
        seen = []
        monkeypatch.setitem(cli._DELEGATED, "compare", "tests.test_cli:_record")
        monkeypatch.setattr(sys.modules[__name__], "_record",
                            lambda argv: seen.append(argv) or 3)
        assert cli.main(["compare", "--engine", "replay", "a.toml"]) == 3
        assert seen == [["--engine", "replay", "a.toml"]]


class TestHeaders:
    def test_header_values_are_typed(self):
        """--header values become int, float, bool or str."""
        assert cli._headers(["a=1", "b=2.5", "c=true", "d=x=y", "e="]) == {
            "a": 1, "b": 2.5, "c": True, "d": "x=y", "e": ""}

    def test_header_without_equals_is_refused(self):
        """A --header without '=' is a usage error."""
        with pytest.raises(SystemExit):
            cli._headers(["oops"])


def _record(argv):  # replaced per test; referenced by name through _DELEGATED
    raise AssertionError("not patched")
