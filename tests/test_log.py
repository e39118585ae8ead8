"""Tests for treefed.log: structlog configuration and the event-log writer."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs

from treefed.errors import ConfigError
from treefed.events import SCHEMA_VERSION, validate_event
from treefed.log import EventWriter, configure_logging, get_logger


@pytest.fixture(autouse=True)
def _reset_structlog():
    yield
    configure_logging(file=io.StringIO())  # closes a log file a test had opened by path
    structlog.reset_defaults()


class TestConfigureLogging:
    def test_json_lines_with_schema_fields(self) -> None:
        """Each line is JSON with event, level, float ts, v and the bound broker."""
        out = io.StringIO()
        configure_logging("info", file=out, json=True)
        get_logger(broker="hq").info("link.up", link="L:tree:region-1", peer="region-1",
                                     connector="tree", role="root")
        record = json.loads(out.getvalue())
        assert record["event"] == "link.up" and record["level"] == "info"
        assert record["broker"] == "hq" and record["v"] == SCHEMA_VERSION
        assert isinstance(record["ts"], float) and record["ts"] > 1e9
        assert validate_event(record) == []

    def test_level_filters(self) -> None:
        """Below the configured level nothing is written."""
        out = io.StringIO()
        configure_logging("warning", file=out, json=True)
        log = get_logger(broker="b")
        log.info("quiet")
        log.debug("quieter")
        log.warning("loud")
        lines = out.getvalue().splitlines()
        assert [json.loads(line)["event"] for line in lines] == ["loud"]

    def test_file_path_is_appended(self, tmp_path: Path) -> None:
        """A path is opened for append, keeping earlier lines."""
        path = tmp_path / "broker.log"
        path.write_text('{"event":"earlier"}\n')
        configure_logging("info", file=path, json=True)
        get_logger().info("later")
        configure_logging(file=io.StringIO())  # closes (and so flushes) the file
        events = [json.loads(line)["event"] for line in path.read_text().splitlines()]
        assert events == ["earlier", "later"]

    def test_console_renderer_when_not_json(self) -> None:
        """json=False renders for people: the event is there, the line is not JSON."""
        out = io.StringIO()
        configure_logging("info", file=out, json=False)
        get_logger(broker="hq").info("link.down", peer="region-1")
        text = out.getvalue()
        assert "link.down" in text and "region-1" in text
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)

    def test_json_by_default_off_a_terminal(self) -> None:
        """With json=None a non-terminal stream gets JSON lines."""
        out = io.StringIO()
        configure_logging(file=out)
        get_logger().info("x")
        assert json.loads(out.getvalue())["event"] == "x"

    def test_bad_level(self) -> None:
        """An unknown level is a ConfigError naming logging.level."""
        with pytest.raises(ConfigError) as info:
            configure_logging("loud")
        assert info.value.key == "logging.level"

    def test_capture_logs_sees_bound_context(self) -> None:
        """Tests can capture events with structlog.testing.capture_logs."""
        configure_logging("debug", file=io.StringIO(), json=True)
        log = get_logger(broker="store-r1-0001", link="L:tree:region-1")
        with capture_logs() as logs:
            log.info("advisory.dropped", reason="ttl")
        assert logs == [{"event": "advisory.dropped", "reason": "ttl", "log_level": "info",
                         "broker": "store-r1-0001", "link": "L:tree:region-1"}]


FIELDS = {"link": "L:tree:hq", "peer": "hq", "consumer": "store-r1-0001/c1/s1",
          "dst": "queue://Store.store-r1-0001.Incoming", "origin": "store-r1-0001",
          "kind": "add", "hops": 1}


class TestEventWriter:
    def test_lines_follow_the_schema(self, tmp_path: Path) -> None:
        """Every line has ts, broker, event, run, v and the fields, and validates."""
        path = tmp_path / "events.jsonl"
        with EventWriter(path, run="run-1") as writer:
            writer.write(1.5, "region-1", "advisory.received", FIELDS)
            writer.write(2, "hq", "run.finished", {"scenario": "s", "mode": "tree",
                                                   "params": "{}", "brokers": 3, "links": 2,
                                                   "engine": "replay"})
        records = [json.loads(line) for line in path.read_text().splitlines()]
        assert records[0] == {"ts": 1.5, "broker": "region-1", "event": "advisory.received",
                              "run": "run-1", "v": SCHEMA_VERSION, **FIELDS}
        assert records[1]["ts"] == 2 and records[1]["broker"] == "hq"
        assert all(validate_event(r) == [] for r in records)

    def test_no_run_no_fields(self) -> None:
        """Without run or fields a line carries only the common keys."""
        out = io.StringIO()
        writer = EventWriter(out)
        writer.write(0.25, "b", "message.stranded")
        writer.close()
        assert json.loads(out.getvalue()) == {"ts": 0.25, "broker": "b",
                                              "event": "message.stranded", "v": SCHEMA_VERSION}
        assert not out.closed  # a file passed in is flushed, not closed

    def test_gz_suffix_compresses(self, tmp_path: Path) -> None:
        """A .gz path is written as gzip."""
        path = tmp_path / "events.jsonl.gz"
        with EventWriter(path, run="r") as writer:
            for i in range(100):
                writer.write(i / 10, "hq", "message.produced", {"msg": f"m{i}", "dst": "q"})
        lines = gzip.decompress(path.read_bytes()).decode().splitlines()
        assert len(lines) == 100 and json.loads(lines[-1])["msg"] == "m99"

    def test_buffers_until_the_limit(self) -> None:
        """Lines reach the file in chunks of buffer_lines, the rest on close."""
        out = io.BytesIO()
        writer = EventWriter(out, buffer_lines=3)
        for i in range(4):
            writer.write(i, "b", "message.produced", {"msg": str(i), "dst": "q"})
        assert out.getvalue().count(b"\n") == 3
        writer.close()
        assert out.getvalue().count(b"\n") == 4 and writer.lines == 4

    def test_unicode_and_escapes(self) -> None:
        """Broker ids and values with quotes or non-ASCII text stay valid JSON."""
        out = io.StringIO()
        with EventWriter(out, run='r"1') as writer:
            writer.write(1.0, 'b"é', "message.produced", {"msg": "ü\n", "dst": "q"})
        assert json.loads(out.getvalue())["broker"] == 'b"é'

    def test_same_schema_as_structlog(self) -> None:
        """A structlog line and an EventWriter line for one event carry the same keys."""
        logged = io.StringIO()
        configure_logging("info", file=logged, json=True)
        get_logger(broker="hq").info("advisory.sent", **FIELDS)
        written = io.StringIO()
        with EventWriter(written) as writer:
            writer.write(1.0, "hq", "advisory.sent", FIELDS)
        from_log = json.loads(logged.getvalue())
        from_writer = json.loads(written.getvalue())
        assert set(from_log) - {"level"} == set(from_writer)
        assert {k: v for k, v in from_log.items() if k not in ("ts", "level")} == {
            k: v for k, v in from_writer.items() if k != "ts"}


class TestEventWriterFastPath:
    def test_escaping_matches_the_json_encoder(self, tmp_path: Path) -> None:
        """Cached fragments escape quotes, backslashes, control and non-ASCII characters
        exactly as json does, the first time and on every repeat."""
        path = tmp_path / "events.jsonl"
        odd = {"msg": 'q"\\\n\t\x01é', "dst": "queue://Q"}
        with EventWriter(path, run="r") as writer:
            for _ in range(3):
                writer.write(1.0, "b", "message.produced", odd)
        records = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
        assert [r["msg"] for r in records] == [odd["msg"]] * 3

    def test_types_survive_the_cache(self) -> None:
        """Ints, bools, None and floats come back with their JSON types."""
        out = io.StringIO()
        with EventWriter(out) as writer:
            writer.write(0.5, "b", "demand.created", {
                "link": "l", "peer": "p", "consumer": "c", "dst": "queue://Q",
                "origin": "o", "priority": -5, "conduit": True})
            writer.write(0.5, "b", "demand.created", {
                "link": "l", "peer": "p", "consumer": "c", "dst": "queue://Q",
                "origin": None, "priority": 0, "conduit": False})
        first, second = (json.loads(line) for line in out.getvalue().splitlines())
        assert first["priority"] == -5 and first["conduit"] is True
        assert second["origin"] is None and second["conduit"] is False
        assert validate_event(first) == [] and validate_event(second) == []

    def test_time_changes_between_lines(self) -> None:
        """Each line carries its own ts even when the writer reuses the previous text."""
        out = io.StringIO()
        with EventWriter(out) as writer:
            for ts in (1.0, 1.0, 1.001, 2):
                writer.write(ts, "b", "message.stranded", {"msg": "m", "dst": "q"})
        assert [json.loads(line)["ts"] for line in out.getvalue().splitlines()] == \
            [1.0, 1.0, 1.001, 2]

    def test_unhashable_values_fall_back_to_the_encoder(self) -> None:
        """A list value (not cacheable) is still written as JSON."""
        out = io.StringIO()
        with EventWriter(out) as writer:
            writer.write(1.0, "b", "run.started", {"params": ["a", 1]})
        assert json.loads(out.getvalue())["params"] == ["a", 1]

    def test_batch_writes_the_same_lines_as_single_writes(self) -> None:
        """write_logs gives, line for line, what write gives for each Log action."""
        from treefed.core.actions import Log

        logs = [Log("advisory.sent", {"link": "l", "peer": "p", "consumer": "c/a/s",
                                      "dst": "queue://q", "origin": "c", "kind": "add",
                                      "hops": 2}),
                Log("run.started", {"params": ["a", 1]}),     # unhashable: the encoder
                Log("broker.info", {}),
                Log("advisory.sent", {"link": "l", "peer": "p2", "consumer": "c/a/s",
                                      "dst": "queue://q", "origin": "c", "kind": "add",
                                      "hops": 2})]
        single, batch = io.StringIO(), io.StringIO()
        with EventWriter(single, run="r") as one, EventWriter(batch, run="r",
                                                             buffer_lines=3) as many:
            for ts in (1.0, 2.5):
                for log in logs:
                    one.write(ts, "hq", log.event, log.fields)
                many.write_logs(ts, "hq", logs)
            assert many.lines == 8
        assert batch.getvalue() == single.getvalue()
        assert len(batch.getvalue().splitlines()) == 8

    def test_gzip_level_and_many_chunks_through_the_thread(self, tmp_path: Path) -> None:
        """A path is written by the helper thread: every chunk arrives, in order."""
        path = tmp_path / "events.jsonl.gz"
        with EventWriter(path, run="r", buffer_lines=7, compresslevel=1) as writer:
            for i in range(1000):
                writer.write(i, "hq", "message.produced", {"msg": f"m{i}", "dst": "q"})
            assert writer.lines == 1000
        lines = gzip.decompress(path.read_bytes()).decode().splitlines()
        assert [json.loads(line)["msg"] for line in lines] == [f"m{i}" for i in range(1000)]

    def test_a_failing_file_is_reported_to_the_caller(self, tmp_path: Path) -> None:
        """An error in the writer thread surfaces on the caller's flush or close."""
        writer = EventWriter(tmp_path / "events.jsonl", buffer_lines=1)
        writer._file.close()  # the disk "goes away" under the thread
        writer.write(1.0, "b", "message.stranded", {"msg": "m", "dst": "q"})
        with pytest.raises(ValueError):
            writer.flush()
        with pytest.raises(ValueError):
            writer.close()


class TestSharedFields:
    """SharedFields: one dict logged by many sites is rendered once, found by identity."""

    FIELDS = {"link": "mesh", "peer": "region-1", "consumer": "store-2/app/q",
              "dst": "queue://Store.store-2.Incoming", "origin": "store-2", "kind": "add",
              "hops": 2}

    def test_renders_as_a_plain_dict_would(self) -> None:
        from treefed.core.actions import Log, SharedFields

        shared = SharedFields(self.FIELDS)
        plain, fast = io.StringIO(), io.StringIO()
        with EventWriter(plain, run="r") as one, EventWriter(fast, run="r") as many:
            for broker in ("store-1", "store-3", "store-1"):
                one.write(1.0, broker, "advisory.received", dict(self.FIELDS))
                many.write_logs(1.0, broker, [Log("advisory.received", shared)])
        assert fast.getvalue() == plain.getvalue()
        assert len(fast.getvalue().splitlines()) == 3

    def test_distinct_dicts_never_share_a_body(self, monkeypatch) -> None:
        """Past the cache limit, and with equal-looking dicts made and dropped in turn
        (ids free to be reused), every line still shows its own dict."""
        import treefed.log as log_module
        from treefed.core.actions import Log, SharedFields

        monkeypatch.setattr(log_module, "_SHARED_LIMIT", 4)
        out = io.StringIO()
        with EventWriter(out) as writer:
            for i in range(50):
                fields = SharedFields(self.FIELDS, consumer=f"store-{i}/app/q")
                writer.write_logs(float(i), "hq", [Log("advisory.received", fields)] * 2)
                del fields
        got = [json.loads(line)["consumer"] for line in out.getvalue().splitlines()]
        assert got == [f"store-{i // 2}/app/q" for i in range(100)]


class TestLogParts:
    """part_lines: a long log goes on in further files, split between whole chunks."""

    @pytest.mark.parametrize("count", [0, 25, 26, 31, 90, 100])
    def test_every_line_once_in_order_no_empty_part(self, tmp_path: Path, count) -> None:
        from treefed.log import part_path

        first = tmp_path / "events.jsonl.gz"
        writer = EventWriter(first, run="r", buffer_lines=10, part_lines=25)
        for i in range(count):
            writer.write(float(i), "b", "message.produced", {"msg": f"m{i}", "dst": "q"})
        writer.close()
        paths = writer.paths
        assert paths[0] == first
        assert paths[1:] == [part_path(first, i) for i in range(1, len(paths))]
        assert sorted(p.name for p in tmp_path.iterdir()) == [p.name for p in paths]
        sizes, msgs = [], []
        for p in paths:
            lines = gzip.decompress(p.read_bytes()).decode().splitlines()
            sizes.append(len(lines))
            msgs += [json.loads(line)["msg"] for line in lines]
        assert msgs == [f"m{i}" for i in range(count)]
        assert len(paths) == 1 or all(n > 0 for n in sizes)
        assert all(n <= 30 for n in sizes)   # 25, rounded up to the next chunk of 10

    def test_part_names_sort_after_the_first(self) -> None:
        from treefed.log import part_path

        first = Path("run/events.jsonl.gz")
        names = [first.name] + [part_path(first, i).name for i in (1, 2, 10)]
        assert names == sorted(names) and names[1] == "events.part-0001.jsonl.gz"
        assert part_path(Path("x/events.jsonl"), 3).name == "events.part-0003.jsonl"

    def test_no_parts_for_an_open_file(self) -> None:
        out = io.BytesIO()
        with EventWriter(out, part_lines=1) as writer:
            for i in range(5):
                writer.write(1.0, "b", "broker.info", {})
        assert writer.paths == [] and len(out.getvalue().splitlines()) == 5
