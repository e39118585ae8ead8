"""The procs engine starts the plan only on a linked estate.

Regression (CI run of 9651103 at load 32): ``test_procs_matches_replay[mesh-ttl2]`` saw 22
``link.up`` instead of 24 -- one store's first dial had come before its region listened,
and its redial back-off was longer than the engine's ``QUIET_S`` wait for quiet logs, so
the plan ran on an estate with one link missing.  Shrinking ``QUIET_S`` to nothing and
starting the plan at its first step makes that race certain instead of load-dependent.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from pathlib import Path

import pytest

from treefed.estate.sites import EstateSites
from treefed.scenario.engines import engine_class, procs
from treefed.scenario.results import Recorder
from treefed.scenario.spec import load_scenario
from treefed.scenario.workload import build_plan

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


@pytest.mark.slow
def test_every_link_is_up_before_the_first_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procs, "QUIET_S", 0.0)
    missing_at_first_step: list = []
    step = procs.ProcsEngine._step

    async def first_step_sees(self, s):   # what the brokers had logged when the plan began
        if not missing_at_first_step:
            parents = {x.spec.id: x.spec.parent for x in self.sites.values()}
            logs = {sid: x.log for sid, x in self.sites.items()}
            missing_at_first_step.append(EstateSites.missing_links(parents, logs))
        await step(self, s)

    monkeypatch.setattr(procs.ProcsEngine, "_step", first_step_sees)
    sc = load_scenario(SCENARIOS / "retail-small.toml")
    plan = build_plan(sc)
    start = plan.steps[0].at   # the plan begins the moment the logs are quiet
    plan = dataclasses.replace(plan, steps=tuple(dataclasses.replace(x, at=x.at - start)
                                                 for x in plan.steps))
    engine_class("procs")(plan, sc.mode("tree"), Recorder(plan, _Discard())).run()
    assert missing_at_first_step == [[]]


class _Discard:
    def write(self, *args) -> None:
        pass


async def test_a_proxy_whose_parent_refuses_drops_the_connection() -> None:
    """Regression (s8 guard run at load 13-14: ``test_procs_matches_replay[tree]``): the
    proxy dialled a parent the engine held alive but whose port refused the connection
    (the broker process not listening yet, or already gone); ``open_tcp`` raised
    RemoteError("unreachable"), which the proxy did not catch, and the engine's run ended.
    A refused dial must end that one proxied connection, as a reset would: the child's
    connector redials."""
    import trio

    from treefed.transport.ports import free_port

    parent = SimpleNamespace(alive=True, port=free_port())     # nothing listens there
    engine = SimpleNamespace(sites={"region": parent},
                             topology=SimpleNamespace(broker=lambda _: SimpleNamespace(
                                 parent="region")))
    proxy = procs._Proxy(engine, "store")
    a, b = trio.socket.socketpair()
    down, other = trio.SocketStream(a), trio.SocketStream(b)
    with trio.fail_after(10):
        await proxy._handle(down)          # raised RemoteError before the fix
        assert await other.receive_some(1) == b""     # the child's side sees the close
    assert not proxy._live
    await other.aclose()
