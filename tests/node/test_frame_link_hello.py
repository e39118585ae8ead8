"""A node's reader on an in-process frame link (issue #14, in-process estate): when the
peer's hello is there already -- an accepted link or App always sent it first -- it is
taken without arming the hello timeout (a cancel scope per connection: ~8,000 in a
4 x 1,000 estate); a frame-link peer that says nothing is still closed with a
``hello_timeout`` error after ``[broker] hello_timeout``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import trio
import trio.testing

from treefed.config import parse_config
from treefed.node import BrokerNode
from treefed.scenario.engines.memory import MemoryEngine
from treefed.scenario.results import Recorder
from treefed.scenario.spec import load_scenario
from treefed.scenario.workload import build_plan
from treefed.transport.memory import frame_link
from treefed.wire.frames import PROTOCOL_VERSION, Error, Hello

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


class _Lines:
    def write(self, *args) -> None:
        pass


def test_an_estate_arms_a_hello_timeout_only_where_it_waits(monkeypatch) -> None:
    """retail-small (13 sites, 12 links): the dialing side of each link waits for its
    parent's answer (12 timeouts); the accepted ends of links and Apps (25) find the
    hello waiting -- 37 timeouts before."""
    armed: list = []
    move_on_after = trio.move_on_after

    def counted(seconds, *args, **kwargs):
        armed.append(seconds)
        return move_on_after(seconds, *args, **kwargs)

    monkeypatch.setattr(trio, "move_on_after", counted)
    sc = load_scenario(SCENARIOS / "retail-small.toml")
    plan = build_plan(sc)
    figures = MemoryEngine(plan, sc.mode("tree"), Recorder(plan, _Lines())).run()["outcome"]
    assert figures["delivered"] == figures["expected"] > 0
    links = len(plan.topology.brokers) - 1
    hello_timeout = 30.0
    assert armed.count(hello_timeout) <= links, armed


def _serve(near_hello: bool) -> list:
    """A node serving one frame link whose other end sends a hello first or nothing;
    what that end receives, and when (virtual seconds)."""
    config = parse_config({"broker": {"id": "b1", "hello_timeout": 0.5}})
    got: list = []

    async def main() -> None:
        node = BrokerNode(config)
        near, far = frame_link()
        async with trio.open_nursery() as nursery:
            await nursery.start(node.serve)
            if near_hello:
                near.send_now([Hello(PROTOCOL_VERSION, "client", name="app")])
            nursery.start_soon(node.serve_stream, far)
            started = trio.current_time()
            try:
                while True:
                    for frame in await near.receive_frames():
                        got.append((type(frame), trio.current_time() - started, frame))
                    if not near_hello or any(t is Hello for t, _, _ in got):
                        break
            except trio.EndOfChannel:
                pass
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return got


def test_a_hello_waiting_is_answered() -> None:
    got = _serve(near_hello=True)
    assert [t for t, _, _ in got] == [Hello]


def test_a_silent_frame_link_peer_is_closed_after_the_hello_timeout() -> None:
    got = _serve(near_hello=False)
    assert [t for t, _, _ in got] == [Error]
    _, at, error = got[0]
    assert error.code == "hello_timeout" and "0.5 s" in error.message
    assert at >= 0.5


def test_a_waiting_hello_is_taken_without_a_task_step(monkeypatch) -> None:
    """The accepted end's reader takes a hello that is waiting without a checkpoint of its
    own (``FrameEnd.take_frames``): ``receive_frames`` is not awaited for it."""
    from treefed.transport.memory import FrameEnd

    waits: list = []
    receive = FrameEnd.receive_frames

    async def counted(self):
        waits.append(self.receive_ready())
        return await receive(self)

    monkeypatch.setattr(FrameEnd, "receive_frames", counted)
    got = _serve(near_hello=True)
    assert [t for t, _, _ in got] == [Hello]
    assert True not in waits, waits   # no receive found its frames already waiting


def test_a_waiting_hello_reaches_the_site_task_without_a_checkpoint(monkeypatch) -> None:
    """Nor is the inbox's awaited ``send`` used to hand it on (``send_nowait``: the
    reader's next wait is its checkpoint) -- a second task step fewer per accepted link."""
    sends: list = []
    send = trio.MemorySendChannel.send

    async def counted(self, value):
        sends.append(value)
        return await send(self, value)

    monkeypatch.setattr(trio.MemorySendChannel, "send", counted)
    got = _serve(near_hello=True)
    assert [t for t, _, _ in got] == [Hello]
    assert sends == [], sends
