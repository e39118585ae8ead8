"""Malformed input against a running broker: each case gets an error frame naming the
problem and closes only that connection (or refuses only that request), while another
client keeps sending and receiving and a stored message survives."""

from __future__ import annotations

import struct
from dataclasses import replace

import cbor2
import pytest
import trio

from treefed.client import connect
from treefed.persistence import SqliteStore
from treefed.wire.codec import encode
from treefed.wire.frames import PROTOCOL_VERSION, Error, Hello, Receipt, Send, Subscribe

from tests.node.helpers import RawPeer, make_config, start_node, wait_for


def raw_frame(item: object) -> bytes:
    body = cbor2.dumps(item)
    return struct.pack(">I", len(body)) + body


# name -> (say hello first?, bytes to send, half-close after?, error code, words in message)
FATAL_CASES = {
    "garbage_bytes": (False, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", False, "oversized",
                      "exceeds the maximum"),
    "bad_cbor": (True, struct.pack(">I", 5) + b"\xff\xfe\xfd\xfc\xfb", False, "bad_cbor",
                 "CBOR"),
    "truncated_then_close": (True, struct.pack(">I", 100) + b"\x82" * 10, True,
                             "truncated", "inside a frame"),
    "oversized_length": (True, struct.pack(">I", 0x7FFFFFF0), False, "oversized",
                         "exceeds the maximum"),
    "wrong_version": (False, encode(Hello(99, "client")), False, "bad_version",
                      "version 99"),
    "unknown_frame_type": (True, raw_frame([99, "x"]), False, "unknown_type",
                           "unknown frame type"),
    "missing_field": (True, raw_frame([2]), False, "missing_field", "dst"),
    "mistyped_field": (True, raw_frame([2, 5, "id-1"]), False, "bad_field",
                       "Send.dst"),
    "not_hello_first": (False, encode(Send("queue://x", "m1")), False, "not_hello",
                        "hello"),
}


async def _healthy_round_trip(uri: str, tag: str) -> None:
    async with connect(uri) as conn:
        sub = await conn.subscribe(f"queue://live.{tag}")
        await conn.send(f"queue://live.{tag}", tag.encode())
        msg = await sub.receive()
        assert msg.body == tag.encode()
        await msg.ack()


class TestMalformedInput:
    @pytest.mark.parametrize("case", list(FATAL_CASES))
    async def test_error_frame_and_only_that_connection_closes(self, case, nursery,
                                                              tmp_path):
        """The offending connection gets an error frame naming the problem and is
        closed; another client keeps working and a stored message is not lost."""
        hello, data, half_close, code, words = FATAL_CASES[case]
        store = SqliteStore(tmp_path / "data")
        try:
            with trio.fail_after(15):
                node, uri = await start_node(nursery, make_config(tmp_path / "data"),
                                             store=store)
                async with connect(uri) as keeper:
                    await keeper.send("queue://kept", b"precious", persistent=True)
                    bystander_sub = await keeper.subscribe("queue://bystander")
                    peer = await RawPeer.open(uri, hello=hello)
                    await peer.send_raw(data)
                    if half_close:
                        await peer.stream.send_eof()
                    error = await peer.error_and_close()
                    await peer.aclose()
                    assert error.code == code
                    assert words in error.message
                    assert error.ref is None
                    # the same connection that was open all along still works
                    await keeper.send("queue://bystander", b"still here")
                    assert (await bystander_sub.receive()).body == b"still here"
                    await _healthy_round_trip(uri, case)
                    assert len(node.statistics()["conns"]) <= 2
                assert [m.body for m in store.load()] == [b"precious"]
                async with connect(uri) as consumer:
                    sub = await consumer.subscribe("queue://kept")
                    assert (await sub.receive()).body == b"precious"
        finally:
            store.close()

    async def test_invalid_destination_refuses_only_that_send(self, nursery, tmp_path):
        """A send to an invalid destination gets Error(ref=its id); the connection
        stays open and its next valid send is accepted."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path))
            peer = await RawPeer.open(uri)
            await peer.send_raw(encode(Send("queue://bad name", "m1", receipt=True))
                                + encode(Send("queue://good", "m2", persistent=True,
                                              receipt=True)))
            frames: list = []
            while not any(type(f) is Receipt for f in frames):
                frames += await peer.framed.receive_frames()
            error = next(f for f in frames if type(f) is Error)
            assert (error.code, error.ref) == ("bad_destination", "m1")
            assert "bad name" in error.message or "whitespace" in error.message
            assert any(type(f) is Receipt and f.id == "m2" for f in frames)
            await _healthy_round_trip(uri, "dst")
            await peer.aclose()

    async def test_bad_selector_refuses_only_that_subscription(self, nursery, tmp_path):
        """A subscription with a malformed selector is refused with the position;
        the connection stays usable."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path))
            peer = await RawPeer.open(uri)
            await peer.send_raw(encode(Subscribe("s1", "queue://q", "price > > 3"))
                                + encode(Subscribe("s2", "queue://q", "price > 3")))
            frames: list = []
            while not any(type(f) is Receipt for f in frames):
                frames += await peer.framed.receive_frames()
            error = next(f for f in frames if type(f) is Error)
            assert (error.code, error.ref) == ("bad_selector", "s1")
            assert "position" in error.message
            assert [f.id for f in frames if type(f) is Receipt] == ["s2"]
            await peer.aclose()

    async def test_second_hello_is_refused_not_fatal(self, nursery, tmp_path):
        """A repeated hello gets an error frame but the connection stays open."""
        with trio.fail_after(10):
            node, uri = await start_node(nursery, make_config(tmp_path))
            peer = await RawPeer.open(uri)
            await peer.send_raw(encode(Hello(PROTOCOL_VERSION, "client")))
            frames = await peer.framed.receive_frames()
            assert type(frames[0]) is Error and "hello" in frames[0].message
            await wait_for(lambda: any(c["kind"] == "client"
                                       for c in node.statistics()["conns"]))
            await peer.aclose()

    async def test_silent_connection_closed_after_hello_timeout(self, nursery, tmp_path):
        """A connection that never says hello is closed with a hello_timeout error after
        ``[broker] hello_timeout``, not before."""
        config = make_config(tmp_path)
        config = replace(config, broker=replace(config.broker, hello_timeout=0.3))
        with trio.fail_after(10):
            node, uri = await start_node(nursery, config)
            started = trio.current_time()
            peer = await RawPeer.open(uri, hello=False)
            error = await peer.error_and_close()
            assert error.code == "hello_timeout" and "0.3 s" in error.message
            assert trio.current_time() - started >= 0.3
            await peer.aclose()
