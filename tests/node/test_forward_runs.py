"""A chunk of forwards read from a link goes to the core as one run (issue #14):
``_handle_frames`` hands it to ``Site.handle_forwards`` -> ``Broker.accept_forwards``,
which answers it with ONE ForwardAck action, not one per forward; a chunk that mixes
other frames in still takes the frame-by-frame path."""

from __future__ import annotations

import trio

from tests.node.helpers import RawPeer, make_config, start_node
from treefed.core.actions import Out
from treefed.wire.codec import encode
from treefed.wire.frames import PROTOCOL_VERSION, Forward, ForwardAck, Hello, Ping

N = 200


async def _link(uri: str, name: str) -> RawPeer:
    peer = await RawPeer.open(uri, hello=False)
    await peer.send_raw(encode(Hello(PROTOCOL_VERSION, "broker", broker_id=name,
                                     connector="mesh", link_name="m")))
    assert type((await peer.framed.receive_frames())[0]) is Hello
    return peer


def _record_acks(node) -> list:
    """Wrap ``node._perform``: the ForwardAck actions (their id counts) of each batch."""
    seen: list = []
    perform = node._perform

    async def recording(actions: list, now: float) -> None:
        seen.append([len(a.frame.ids) for a in actions
                     if type(a) is Out and type(a.frame) is ForwardAck])
        await perform(actions, now)

    node._perform = recording
    return seen


async def _acked(peer: RawPeer, n: int) -> list:
    ids: list = []
    with trio.fail_after(10):
        while len(ids) < n:
            ids += [i for f in await peer.framed.receive_frames()
                    if type(f) is ForwardAck for i in f.ids]
    return ids


async def test_a_chunk_of_forwards_is_one_run_with_one_ack_action(nursery, tmp_path):
    node, uri = await start_node(nursery, make_config(tmp_path))
    peer = await _link(uri, "p")
    seen = _record_acks(node)
    await peer.send_raw(b"".join(encode(Forward("queue://in", f"p:{i}", ["p"], body=b"x"))
                                 for i in range(N)))
    assert await _acked(peer, N) == [f"p:{i}" for i in range(N)]
    counts = [n for batch in seen for n in batch]
    assert sum(counts) == N
    # before: one ForwardAck action per forward (N of them)
    assert len(counts) <= sum(1 for batch in seen if batch), counts
    assert node.site.broker.received == N
    await peer.aclose()


async def test_a_mixed_chunk_is_handled_frame_by_frame(nursery, tmp_path):
    node, uri = await start_node(nursery, make_config(tmp_path))
    peer = await _link(uri, "p")
    seen = _record_acks(node)
    frames = [Forward("queue://in", f"p:{i}", ["p"], body=b"x") for i in range(5)]
    frames.insert(2, Ping(7))
    await peer.send_raw(b"".join(encode(f) for f in frames))
    assert await _acked(peer, 5) == [f"p:{i}" for i in range(5)]
    assert sum(n for batch in seen for n in batch) == 5
    await peer.aclose()



def test_nothing_paged_out_costs_the_batch_no_scan(tmp_path):
    """``_page_in`` looks for paged-out bodies only while the core has some: before, a
    pageable broker (the default config) walked every Deliver / Forward of every batch."""
    from tests.wire.test_decode_flat import _bytecodes
    from treefed.node.node import BrokerNode
    from treefed.persistence.sqlite import SqliteStore
    from treefed.wire.frames import Deliver

    node = BrokerNode(make_config(tmp_path), store=SqliteStore(tmp_path / "store"))
    assert node._pageable and node.site.broker._paged == 0

    def page_in(deferred: list) -> None:
        coro = node._page_in([], deferred)
        try:
            coro.send(None)
        except StopIteration:
            pass

    few = [Out("c", Deliver("s", "m", "queue://Q", {}, b"x"))]
    many = few * 100
    assert _bytecodes(page_in, many) == _bytecodes(page_in, few)
    node.store.close()


async def test_a_chunk_of_sends_is_one_core_call_with_each_id_scoped(nursery, tmp_path,
                                                                     monkeypatch):
    """A producer's pipelined sends reach the core as runs (``Site.handle_sends``), not
    frame by frame; each id is still scoped to its producer, and a consumer gets every
    message, in order, under the id the producer gave it."""
    from treefed.client import connect
    from treefed.federation.site import Site

    node, uri = await start_node(nursery, make_config(tmp_path))
    one_by_one: list = []
    runs: list = []
    handle_frame = Site.handle_frame
    handle_sends = getattr(Site, "handle_sends", None)

    def counted_frame(self, conn, frame, now):  # noqa: ANN001
        one_by_one.append(type(frame).__name__)
        return handle_frame(self, conn, frame, now)

    def counted_sends(self, conn, frames, now, out):  # noqa: ANN001
        runs.append(len(frames))
        handle_sends(self, conn, frames, now, out)

    monkeypatch.setattr(Site, "handle_frame", counted_frame)
    if handle_sends is not None:
        monkeypatch.setattr(Site, "handle_sends", counted_sends)
    async with connect(uri, client_id="cons") as cons, connect(uri, client_id="prod") as prod:
        sub = await cons.subscribe("queue://runs", prefetch=1000)
        for i in range(N):
            await prod.send("queue://runs", f"m{i}".encode(), confirm=False)
        await prod.flush()
        got = []
        with trio.fail_after(10):
            while len(got) < N:
                msg = await sub.receive()
                got.append(msg.body)
                msg.ack_nowait()
    assert got == [f"m{i}".encode() for i in range(N)]
    assert "Send" not in one_by_one          # before: N calls, one per Send
    assert sum(runs) == N
    held = node.site.broker._dups.held
    assert not held
