"""Tests for treefed.transport.framed: frames over memory streams and loopback TCP."""

from __future__ import annotations

import struct

import pytest
import trio
import trio.testing

from treefed.errors import FrameError
from treefed.transport.framed import FramedStream
from treefed.transport.streams import memory_stream_pair, open_tcp, serve_tcp
from treefed.transport.uri import Endpoint
from treefed.wire import Advisory, Forward, Ping, Send, encode, encode_many


class RecordingStream(trio.abc.Stream):
    """A fake stream around another one that records send_all / receive_some calls."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.sends: list[int] = []
        self.receive_sizes: list[int | None] = []

    async def send_all(self, data) -> None:
        self.sends.append(len(data))
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes=None) -> bytes:
        self.receive_sizes.append(max_bytes)
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


def sample(n: int) -> list:
    return [Send(dst="queue://STORE.%04d" % i, id="m%d" % i, headers={"i": i}, body=b"x" * i)
            for i in range(n)]


def framed_pair(**kw) -> tuple[FramedStream, FramedStream, RecordingStream, RecordingStream]:
    left, right = memory_stream_pair()
    rec_left, rec_right = RecordingStream(left), RecordingStream(right)
    return FramedStream(rec_left, **kw), FramedStream(rec_right, **kw), rec_left, rec_right


class TestFramedStreamMemory:
    async def test_batch_is_one_send_and_one_receive(self):
        """send_frames writes a batch with one send_all; the reader returns all of it."""
        a, b, rec_a, _ = framed_pair()
        frames = sample(50)
        with trio.fail_after(5):
            await a.send_frames(frames)
            assert rec_a.sends == [len(encode_many(frames))]
            assert await b.receive_frames() == frames

    async def test_empty_batch_sends_nothing(self):
        """An empty batch does not touch the stream."""
        a, _, rec_a, _ = framed_pair()
        await a.send_frames([])
        assert rec_a.sends == []

    async def test_waits_for_a_complete_frame(self):
        """receive_frames never returns an empty list: it reads until a frame completes."""
        a, b, _, _ = framed_pair()
        data = encode(Ping(token=3))
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                got = []

                async def reader():
                    got.extend(await b.receive_frames())

                nursery.start_soon(reader)
                for i in range(len(data)):
                    await a.stream.send_all(data[i:i + 1])
                    await trio.testing.wait_all_tasks_blocked()
        assert got == [Ping(token=3)]

    async def test_reads_are_bounded_by_receive_size(self):
        """Each read asks for at most receive_size bytes, however much is waiting."""
        a, b, _, rec_b = framed_pair(receive_size=1000)
        frames = sample(200)
        with trio.fail_after(5):
            await a.send_frames(frames)
            got = []
            while len(got) < len(frames):
                got.extend(await b.receive_frames())
        assert got == frames
        assert rec_b.receive_sizes and set(rec_b.receive_sizes) == {1000}

    async def test_large_frame_spans_many_reads(self):
        """A frame bigger than one read is reassembled."""
        a, b, _, rec_b = framed_pair(receive_size=4096)
        big = Forward(dst="queue://A", id="big", path=["hq"], body=bytes(range(256)) * 4096)
        with trio.fail_after(5):
            await a.send_frame(big)
            assert await b.receive_frames() == [big]
        assert len(rec_b.receive_sizes) > 200

    async def test_clean_eof_is_end_of_channel(self):
        """The peer closing between frames raises trio.EndOfChannel after the last frame."""
        a, b, _, _ = framed_pair()
        with trio.fail_after(5):
            await a.send_frames([Ping(token=1)])
            await a.aclose()
            assert await b.receive_frames() == [Ping(token=1)]
            with pytest.raises(trio.EndOfChannel):
                await b.receive_frames()

    async def test_eof_inside_a_frame_is_truncated(self):
        """The peer closing mid-frame is FrameError(code='truncated')."""
        a, b, _, _ = framed_pair()
        with trio.fail_after(5):
            await a.stream.send_all(encode(Ping(token=1))[:-1])
            await a.aclose()
            with pytest.raises(FrameError) as info:
                await b.receive_frames()
        assert info.value.code == "truncated"

    async def test_good_frames_then_the_error(self):
        """Frames ahead of a malformed one are returned; the next call raises."""
        a, b, _, _ = framed_pair()
        bad = struct.pack(">I", 2) + b"\xff\xff"
        with trio.fail_after(5):
            await a.stream.send_all(encode_many(sample(3)) + bad)
            assert await b.receive_frames() == sample(3)
            with pytest.raises(FrameError) as info:
                await b.receive_frames()
        assert info.value.code == "bad_cbor"

    async def test_oversized_refused_without_the_body(self):
        """A length over max_frame is refused as soon as the prefix arrives."""
        a, b, _, _ = framed_pair(max_frame=1024)
        with trio.fail_after(5):
            await a.stream.send_all(struct.pack(">I", 10_000_000))
            with pytest.raises(FrameError) as info:
                await b.receive_frames()
        assert info.value.code == "oversized"


class TestFramedStreamTcp:
    async def test_relay_over_loopback(self, nursery):
        """Batches of frames cross a real 127.0.0.1 socket, echoed back in order."""
        async def echo_frames(stream):
            framed = FramedStream(stream)
            while True:
                try:
                    frames = await framed.receive_frames()
                except trio.EndOfChannel:
                    return
                await framed.send_frames(frames)

        frames = sample(300) + [Advisory(kind="add", consumer="s1/c1/1", dst="queue://A",
                                         origin="s1")]
        with trio.fail_after(10):
            port = await nursery.start(serve_tcp, echo_frames, "127.0.0.1", 0)
            client = FramedStream(await open_tcp(Endpoint("tcp", "127.0.0.1", port)))
            for start in range(0, len(frames), 50):
                await client.send_frames(frames[start:start + 50])
            got = []
            while len(got) < len(frames):
                got.extend(await client.receive_frames())
            assert got == frames
            await client.stream.send_eof()
            with pytest.raises(trio.EndOfChannel):
                await client.receive_frames()
            await client.aclose()
