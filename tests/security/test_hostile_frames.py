"""Defect 1 of issue #12: one frame must never kill a broker.

A client sent a 40-byte persistent ``Forward`` (a broker-link frame) with ``redelivered``
2**63; the SQLite store raised OverflowError, nothing caught it and the process exited.
Now: every number field has a checked range at the decoder, broker-link frames from a
client are refused (``bad_frame``), and an exception while handling one connection's
input closes that connection only -- the process lives, stored messages stay."""

from __future__ import annotations

import math
import struct

import cbor2
import pytest
import trio

from treefed.client import connect
from treefed.errors import FrameError
from treefed.persistence import SqliteStore
from treefed.wire.codec import FrameDecoder, encode
from treefed.wire.frames import MAX_NAME, MAX_PATH, Error, Receipt, Send
from treefed.wire.ids import original

from tests.node.helpers import RawPeer, make_config, start_node
from tests.security.canary import open_canary


def raw(item: object) -> bytes:
    body = cbor2.dumps(item)
    return struct.pack(">I", len(body)) + body


# Forward = [21, dst, id, path, headers, body, persistent, priority, expires, reply_to,
#            timestamp, redelivered]
KILLER = raw([21, "queue://attack", "1", [], {}, b"", True, 4, 0, None, 0, 2 ** 63])


def decode_one(data: bytes):
    decoder = FrameDecoder()
    decoder.receive_data(data)
    return decoder.next_frame()


OUT_OF_RANGE = {
    "forward_redelivered_2_63": ([21, "q", "1", [], {}, b"", True, 4, 0.0, None, 0.0,
                                  2 ** 63], "Forward.redelivered"),
    "forward_priority_2_40": ([21, "q", "1", [], {}, b"", True, 2 ** 40], "Forward.priority"),
    "forward_timestamp_negative": ([21, "q", "1", [], {}, b"", True, 4, 0.0, None, -1e300],
                                   "Forward.timestamp"),
    "forward_expires_nan": ([21, "q", "1", [], {}, b"", True, 4, math.nan],
                            "Forward.expires"),
    "forward_expires_inf": ([21, "q", "1", [], {}, b"", True, 4, math.inf],
                            "Forward.expires"),
    "forward_path_too_long": ([21, "q", "1", ["b"] * (MAX_PATH + 1)], "Forward.path"),
    "forward_path_item_too_long": ([21, "q", "1", ["b" * (MAX_NAME + 1)]], "Forward.path"),
    "send_priority_negative": ([2, "q", "1", {}, b"", False, -1], "Send.priority"),
    "send_ttl_negative": ([2, "q", "1", {}, b"", False, 4, -5], "Send.ttl"),
    "send_id_too_long": ([2, "q", "i" * (MAX_NAME + 1)], "Send.id"),
    "deliver_redelivered_negative": ([7, "s", "m", "q", {}, b"", False, 4, -1],
                                     "Deliver.redelivered"),
    "subscribe_priority_huge": ([3, "s", "q", None, 10, 2 ** 62], "Subscribe.priority"),
    "advisory_priority_huge": ([20, "add", "c", "q", "o", None, -2 ** 40],
                               "Advisory.priority"),
    "ping_token_past_64_bits": ([9, -(2 ** 64)], "Ping.token"),
    "hello_version_negative": ([1, -1, "client"], "Hello.version"),
}


class TestDecoderRanges:
    @pytest.mark.parametrize("case", list(OUT_OF_RANGE))
    def test_out_of_range_field_is_refused_naming_it(self, case):
        """Every number field has a checked range and every name a length limit: an
        out-of-range value is a bad_field FrameError naming the frame and field."""
        item, where = OUT_OF_RANGE[case]
        with pytest.raises(FrameError) as info:
            decode_one(raw(item))
        assert info.value.code == "bad_field" and info.value.message.startswith(where)

    def test_the_killer_frame_is_refused_and_is_40_bytes(self):
        """The attack's frame, byte for byte, no longer decodes."""
        assert len(KILLER) == 40
        with pytest.raises(FrameError, match="Forward.redelivered"):
            decode_one(KILLER)

    def test_edges_of_the_ranges_still_decode(self):
        """The limits themselves are valid values (0..9 priority, 2**31-1 redeliveries)."""
        f = decode_one(raw([21, "q", "1", ["b"] * MAX_PATH, {}, b"", True, 9, 0.0, None,
                            1e11, 2 ** 31 - 1]))
        assert (f.priority, f.redelivered, f.timestamp) == (9, 2 ** 31 - 1, 1e11)
        assert decode_one(raw([2, "q", "1", {}, b"", False, 0, 0])).priority == 0


class TestClientMayNotSendLinkFrames:
    @pytest.mark.parametrize("frame", [
        [21, "queue://x", "f1", ["invented"], {}, b"x", True],     # Forward
        [22, ["f1"]],                                                # ForwardAck
        [20, "add", "c1", "queue://x", "hq"],                        # Advisory
    ], ids=["forward", "forward_ack", "advisory"])
    async def test_link_frame_from_a_client_is_refused_and_closed(self, frame, nursery,
                                                                  tmp_path):
        """A broker-link frame on a client connection gets bad_frame and that connection
        is closed; nothing of it is stored or delivered, other clients carry on."""
        node, uri = await start_node(nursery, make_config(tmp_path / "d"))
        with trio.fail_after(10):
            peer = await RawPeer.open(uri)
            await peer.send_raw(raw(frame))
            err = await peer.error_and_close()
            assert err.code == "bad_frame" and "broker links" in err.message
            await peer.aclose()
            async with connect(uri) as conn:
                stats = await conn.stat()
                assert "queue://attack" not in stats["destinations"]
                await conn.send("queue://ok", b"fine", persistent=True)


class _PickyStore(SqliteStore):
    """A real SQLite store whose ``apply`` raises a foreign exception (not a
    StoreError) for one message id, as a store bug or an unforeseen value would."""

    def __init__(self, path, bad_id: str) -> None:
        super().__init__(path)
        self.bad_id = bad_id

    def apply(self, stores, deletes, *args):
        if any(original(m.id) == self.bad_id for m in stores):
            raise OverflowError("Python int too large to convert to SQLite INTEGER")
        return super().apply(stores, deletes, *args)


class TestContainment:
    async def test_a_store_exception_refuses_only_that_message(self, nursery, tmp_path):
        """An exception the store raises for one message in a batch: that producer's
        send is refused, the same batch's other messages are stored and confirmed, and
        the broker keeps serving."""
        store = _PickyStore(tmp_path / "d", bad_id="poison")
        node, uri = await start_node(nursery, make_config(tmp_path / "d"), store=store)
        with trio.fail_after(15):
            peer = await RawPeer.open(uri)
            # one read: the three sends land in one batch, so one commit
            await peer.send_raw(b"".join(encode(Send("queue://q", i, body=b"x",
                                                     persistent=True, receipt=True))
                                         for i in ("a", "poison", "b")))
            got: list = []
            while len(got) < 3:
                got += await peer.framed.receive_frames()
            receipts = {f.id for f in got if type(f) is Receipt}
            errors = {f.ref: f.code for f in got if type(f) is Error}
            assert receipts == {"a", "b"} and set(errors) == {"poison"}
            await peer.aclose()
            assert sorted(original(m.id) for m in store.load()) == ["a", "b"]
            async with connect(uri) as conn:
                await conn.send("queue://q", b"c", persistent=True)
                assert (await conn.stat())["destinations"]["queue://q"]["depth"] == 3


class TestAttackOnARealEstate:
    @pytest.mark.slow
    async def test_the_40_byte_frame_leaves_hq_alive_and_its_store_intact(self, tmp_path):
        """Against real broker processes (store -> region -> HQ, SQLite), the killer
        frame and a well-formed client Forward are each refused with an error frame on
        that connection only; HQ lives, its stored messages are intact and the canary
        flows through the attack, every confirmed message delivered once, in order."""
        async with open_canary(tmp_path) as (estate, canary):
            hq = estate.uri("hq")
            async with connect(hq) as conn:
                for i in range(5):
                    await conn.send("queue://kept", f"k{i}".encode(), persistent=True)
            canary.attack_started()
            with trio.fail_after(20):
                for attack, code in ((KILLER, "bad_field"),
                                     (raw([21, "queue://kept", "evil", ["s9"], {}, b"",
                                           True, 9]), "bad_frame")):
                    peer = await RawPeer.open(hq)
                    await peer.send_raw(attack)
                    err = await peer.error_and_close()
                    assert err.code == code
                    await peer.aclose()
                await trio.sleep(0.5)
            canary.attack_ended()
            figures = await canary.finish()
            stats = await estate.brokers["hq"].stat()
            assert stats["destinations"]["queue://kept"]["depth"] == 5
            assert "queue://attack" not in stats["destinations"]
            print("canary", figures)
