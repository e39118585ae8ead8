"""Property tests for treefed.wire.codec: hostile bytes only ever raise FrameError, and
every valid frame round-trips."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from treefed.errors import FrameError
from treefed.wire import SPECS, FrameDecoder, encode, encode_many
from treefed.wire.frames import LIMITS

PROFILE = settings(max_examples=150, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow])

# CBOR's native integer range; anything larger would need a bignum tag, which we refuse.
ints = st.integers(min_value=-(2**64), max_value=2**64 - 1)
floats = st.floats(allow_nan=False)
scalars = st.one_of(st.none(), st.booleans(), ints, floats, st.text(max_size=8),
                    st.binary(max_size=8))
plain_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=12,
)

KIND_STRATEGIES = {
    "str": st.text(max_size=20),
    "int": ints,
    "bool": st.booleans(),
    "bytes": st.binary(max_size=40),
    "float": floats,
    "num?": st.none() | floats,
    "str?": st.none() | st.text(max_size=20),
    "strlist": st.lists(st.text(max_size=10), max_size=4),
    "headers": st.dictionaries(
        st.text(max_size=8),
        st.one_of(st.none(), st.booleans(), ints, floats, st.text(max_size=8)),
        max_size=4),
    "map": st.dictionaries(st.text(max_size=6), plain_values, max_size=3),
}


def _field_strategy(cls: type, spec) -> st.SearchStrategy:
    """A valid value: of the field's kind and within its ``LIMITS`` range (issue #12)."""
    low, high = LIMITS[cls.__name__].get(spec.name, (None, None))
    if low is None:
        return KIND_STRATEGIES[spec.kind]
    if spec.kind == "int":
        return st.integers(low, high)
    return st.floats(low, high)


def frame_strategy(cls: type) -> st.SearchStrategy:
    fields = {spec.name: _field_strategy(cls, spec) for spec in SPECS[cls]}
    return st.builds(cls, **fields)


frames = st.sampled_from(sorted(SPECS, key=lambda c: c.__name__)).flatmap(frame_strategy)


def drain(chunks: list[bytes], max_frame: int = 1 << 16) -> list:
    """Feed chunks to a decoder, collecting frames; FrameError is the one allowed failure."""
    decoder = FrameDecoder(max_frame)
    out = []
    try:
        for chunk in chunks:
            decoder.receive_data(chunk)
            out.extend(decoder.frames())
    except FrameError:
        pass
    return out


@st.composite
def chunked(draw, data: bytes) -> list[bytes]:
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=6)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


@st.composite
def mutated_stream(draw) -> bytes:
    data = bytearray(encode_many(draw(st.lists(frames, min_size=1, max_size=4))))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "splice", "delete", "insert"]))
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[at:]
        elif op == "splice":
            other = encode(draw(frames))
            data[at:at] = other[draw(st.integers(0, len(other) - 1)):]
        elif op == "delete":
            del data[at:at + draw(st.integers(1, 8))]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


class TestDecoderProperties:
    @PROFILE
    @given(st.data())
    def test_random_bytes_raise_only_frame_error(self, data):
        """Arbitrary bytes, arbitrarily chunked, never raise anything but FrameError."""
        blob = data.draw(st.binary(max_size=300))
        drain(data.draw(chunked(blob)))

    @PROFILE
    @given(st.data())
    def test_framed_random_cbor_raises_only_frame_error(self, data):
        """Random bodies behind a correct length prefix never raise anything but FrameError."""
        body = data.draw(st.binary(min_size=1, max_size=200))
        drain([len(body).to_bytes(4, "big") + body])

    @PROFILE
    @given(st.data())
    def test_mutated_encodings_raise_only_frame_error(self, data):
        """Bit flips, truncations, splices of valid streams never raise anything else."""
        blob = data.draw(mutated_stream())
        drain(data.draw(chunked(blob)))

    @PROFILE
    @given(st.lists(frames, max_size=5), st.data())
    def test_valid_frames_round_trip(self, sent, data):
        """Any valid frames survive encode -> chunked stream -> decode unchanged."""
        blob = encode_many(sent)
        decoder = FrameDecoder()
        got = []
        for chunk in data.draw(chunked(blob)):
            decoder.receive_data(chunk)
            got.extend(decoder.frames())
        assert got == sent
        assert decoder.buffered == 0
