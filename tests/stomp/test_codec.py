"""The STOMP frame codec: incremental parsing (byte at a time), heart-beats, bodies with
NUL, 1.2 header escaping, limits, and encode/decode round trips."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treefed.errors import FrameError
from treefed.stomp.codec import NEED_DATA, StompDecoder, StompFrame, encode, unescape


def parse_all(data: bytes, *, byte_at_a_time: bool = False, **kw) -> list[StompFrame]:
    d = StompDecoder(**kw)
    d.escapes = True
    out: list[StompFrame] = []
    chunks = [data[i:i + 1] for i in range(len(data))] if byte_at_a_time else [data]
    for chunk in chunks:
        d.receive_data(chunk)
        out += list(d.frames())
    return out


class TestDecoder:
    def test_simple_frame(self):
        """A frame's command, headers and body come back as sent."""
        [f] = parse_all(b"SEND\ndestination:/queue/a\n\nhello\0")
        assert (f.command, f.headers, f.body) == ("SEND", {"destination": "/queue/a"},
                                                  b"hello")

    def test_byte_at_a_time(self):
        """Fed one byte at a time, the parser returns the same frames as in one chunk."""
        data = (b"\n\r\nSEND\r\ndestination:/queue/a\r\ncontent-length:3\r\n\r\na\0b\0\n"
                b"SUBSCRIBE\nid:1\ndestination:/topic/x\n\n\0"
                b"SEND\ndestination:/queue/b\n\nno length\0")
        whole = parse_all(data)
        assert parse_all(data, byte_at_a_time=True) == whole
        assert [f.command for f in whole] == ["SEND", "SUBSCRIBE", "SEND"]
        assert whole[0].body == b"a\0b"
        assert whole[2].body == b"no length"

    def test_heartbeats_between_frames(self):
        """Bare EOLs (LF or CR LF) between frames are heart-beats: counted, skipped."""
        d = StompDecoder()
        d.receive_data(b"\n\r\n\n")
        assert d.next_frame() is NEED_DATA
        assert d.heartbeats == 3
        d.receive_data(b"ACK\nid:1\n\n\0\n")
        assert d.next_frame().command == "ACK"
        assert d.next_frame() is NEED_DATA
        assert d.heartbeats == 4

    def test_content_length_body_with_nuls(self):
        """A content-length body may contain NULs; the frame's NUL follows it."""
        body = b"\0\0x\0"
        [f] = parse_all(b"SEND\ndestination:/queue/a\ncontent-length:4\n\n" + body + b"\0")
        assert f.body == body

    def test_missing_nul_after_content_length(self):
        """A content-length body not followed by NUL is refused."""
        with pytest.raises(FrameError) as e:
            parse_all(b"SEND\ndestination:/queue/a\ncontent-length:2\n\nabc\0")
        assert e.value.code == "bad_frame"

    def test_header_escapes(self):
        """1.2 escapes \\r \\n \\c \\\\ are decoded in names and values."""
        [f] = parse_all(b"SEND\na\\cb:x\\ny\\\\z\\r\n\n\0")
        assert f.headers == {"a:b": "x\ny\\z\r"}

    def test_undefined_escape_refused(self):
        """An undefined escape sequence is a protocol error."""
        with pytest.raises(FrameError) as e:
            parse_all(b"SEND\nk:\\t\n\n\0")
        assert e.value.code == "bad_header"

    def test_connect_not_unescaped(self):
        """CONNECT headers are taken literally (the spec exempts CONNECT/CONNECTED)."""
        [f] = parse_all(b"CONNECT\npasscode:a\\cb\n\n\0")
        assert f.headers["passcode"] == "a\\cb"

    def test_repeated_header_first_wins(self):
        """A repeated header keeps its first value."""
        [f] = parse_all(b"SEND\nk:1\nk:2\n\n\0")
        assert f.headers == {"k": "1"}

    def test_unknown_command(self):
        """An unknown command is refused with unknown_command."""
        with pytest.raises(FrameError) as e:
            parse_all(b"FROB\n\n\0")
        assert e.value.code == "unknown_command"

    def test_too_many_headers(self):
        """More than max_headers headers: too_many_headers, naming the limit."""
        data = b"SEND\n" + b"".join(b"h%d:v\n" % i for i in range(11)) + b"\n\0"
        with pytest.raises(FrameError) as e:
            parse_all(data, max_headers=10)
        assert e.value.code == "too_many_headers" and "10" in e.value.message

    def test_header_block_too_large_before_it_ends(self):
        """An endless header block is refused once it passes the limit, without waiting
        for its end."""
        d = StompDecoder(max_header_bytes=100)
        d.receive_data(b"SEND\nk:" + b"x" * 200)
        with pytest.raises(FrameError) as e:
            d.next_frame()
        assert e.value.code == "headers_too_large"

    def test_body_too_large_by_content_length(self):
        """A content-length above max_body is refused before the body arrives."""
        d = StompDecoder(max_body=10)
        d.receive_data(b"SEND\ncontent-length:11\n\n")
        with pytest.raises(FrameError) as e:
            d.next_frame()
        assert e.value.code == "body_too_large"

    def test_body_too_large_without_nul(self):
        """A body without content-length that grows past max_body is refused."""
        d = StompDecoder(max_body=10)
        d.receive_data(b"SEND\n\n" + b"y" * 11)
        with pytest.raises(FrameError) as e:
            d.next_frame()
        assert e.value.code == "body_too_large"

    def test_nul_inside_header_block(self):
        """A frame that ends (NUL) before its header block ended is refused."""
        with pytest.raises(FrameError) as e:
            parse_all(b"SEND\ndestination:/queue/a\0")
        assert e.value.code == "bad_frame"

    def test_header_without_colon(self):
        """A header line without ':' is refused."""
        with pytest.raises(FrameError) as e:
            parse_all(b"SEND\nnocolon\n\n\0")
        assert e.value.code == "bad_header"

    def test_broken_decoder_stays_broken(self):
        """After an error, frames before it were returned and every call raises again."""
        d = StompDecoder()
        d.receive_data(b"ACK\nid:1\n\n\0JUNK\n\n\0")
        assert d.next_frame().command == "ACK"
        for _ in range(2):
            with pytest.raises(FrameError):
                d.next_frame()

    def test_non_utf8(self):
        """Bytes that are not UTF-8 in the header block are refused."""
        with pytest.raises(FrameError) as e:
            parse_all(b"SEND\nk:\xff\n\n\0")
        assert e.value.code == "bad_frame"


#: any text but NUL, which the parser refuses inside a header block (see test below)
_HEADER_CHARS = st.characters(blacklist_characters="\0", blacklist_categories=("Cs",))


class TestEncode:
    def test_round_trip_escapes_and_body(self):
        """encode then parse gives the frame back, escapes and NULs in the body included."""
        f = StompFrame("SEND", {"destination": "/queue/a", "we:ird": "line\nbreak\\"},
                       b"a\0b")
        [g] = parse_all(encode(f))
        assert g.headers.pop("content-length") == "3"
        assert g == f

    def test_connected_not_escaped(self):
        """CONNECTED headers are written literally."""
        assert b"server:a:b" in encode(StompFrame("CONNECTED", {"server": "a:b"}))

    @settings(max_examples=60, deadline=None)
    @given(st.dictionaries(st.text(_HEADER_CHARS, min_size=1, max_size=8),
                           st.text(_HEADER_CHARS, max_size=12), max_size=5),
           st.binary(max_size=40), st.integers(1, 7))
    def test_round_trip_any_split(self, headers, body, step):
        """Any headers and body survive encode and a parse in chunks of any size."""
        headers.pop("content-length", None)
        f = StompFrame("SEND", headers, body)
        data = b"\n" + encode(f) + encode(f)
        d = StompDecoder()
        d.escapes = True
        out = []
        for i in range(0, len(data), step):
            d.receive_data(data[i:i + step])
            out += list(d.frames())
        for g in out:
            if body:
                assert g.headers.pop("content-length") == str(len(body))
        assert out == [f, f]


def test_unescape_backslash_pairs():
    """An escaped backslash next to an escape decodes correctly."""
    assert unescape("a\\\\\\nb") == "a\\\nb"
