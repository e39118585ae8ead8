"""The wire codec: frames to bytes and bytes to validated frames (DESIGN §2).

Theory of operation
-------------------
``encode`` turns a frame into ``[4-byte big-endian length][CBOR array [code, *fields]]``,
fields in ``frames.SPECS`` order, trailing fields equal to their default left out.  The
per-class field tuples are computed once at import so a frame costs one attribute fetch
and one cbor2 encode; ``encode_many`` runs one encoder over the whole batch.  Deliver,
the frame a broker writes per message, is built by hand (cbor2 pays a Python-level
``write`` call per item) with exactly the bytes the generic path would produce.

``FrameDecoder`` is an h11-style parser with no I/O: ``receive_data(bytes)`` buffers,
``next_frame()`` returns a validated frame or ``NEED_DATA``.  Invariants:

* A length prefix is checked against ``max_frame`` as soon as its 4 bytes are buffered,
  before the body is waited for, so a hostile length never makes us hold a large body.
* Every complete frame in the buffer is decoded in one pass with one ``CBORDecoder``
  over one copy of the complete region (readers drain whole receive buffers).
* Validation: a frame whose field types are all exactly as expected (one type-signature
  set lookup) only has its non-empty containers checked; any other goes field by
  field, which names what is wrong.  Both accept and refuse exactly the same frames.
  Both then check ``frames.LIMITS``: every number field in its range, every id, name
  and path within its length (``bad_field``), so no out-of-range value reaches the core
  or the store.
* The body must be exactly one CBOR item: no trailing bytes, no overrun into the next
  frame.  Tags, ``undefined`` and simple values are refused: a semantic tag would make
  cbor2 build arbitrary objects (datetimes, sets, big numbers) from peer input.
* Every failure is a ``FrameError`` with a machine ``code`` (``bad_cbor``, ``oversized``,
  ``not_array``, ``unknown_type``, ``missing_field``, ``bad_field``,
  ``too_many_fields``) and a message naming the frame and field.  Foreign exceptions
  from cbor2 are translated here and nowhere else.
* After a malformed frame the decoder stays broken: frames that preceded it are still
  returned, then every call raises the same error (the connection is closing anyway).

The codec never checks destination syntax or selectors (core/ does) and never looks at
the protocol version except through ``check_hello``, which the connection owner calls
on the first frame.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from functools import partial
from io import SEEK_CUR, BytesIO
from itertools import product
from operator import attrgetter
from typing import Any

import cbor2

from treefed.errors import FrameError, LocalError
from treefed.wire.frames import (BY_CODE, CODES, LIMITS, MAX_NAME, SPECS, Deliver, Forward,
                                 Frame, Hello, Send)

__all__ = [
    "DEFAULT_MAX_FRAME",
    "NEED_DATA",
    "HELLO_ROLES",
    "encode",
    "encode_many",
    "FrameDecoder",
    "check_hello",
]

DEFAULT_MAX_FRAME = 4 * 1024 * 1024
HELLO_ROLES = ("client", "broker")

#: Nesting limit for decoded CBOR; frames need 3 levels, admin maps a few more.
_MAX_DEPTH = 32

_LEN = struct.Struct(">I")
_pack_len = _LEN.pack
_pack_len_into = _LEN.pack_into
_unpack_len = _LEN.unpack_from
_NO_LENGTH = bytes(4)   # placeholder for a length patched in once the body is written
_dumps = cbor2.dumps


class _Sentinel:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


#: Returned by ``FrameDecoder.next_frame`` when no complete frame is buffered.
NEED_DATA: Any = _Sentinel("NEED_DATA")
_REQUIRED = _Sentinel("REQUIRED")

# --------------------------------------------------------------------------- encoding


def _encoder_table() -> dict[type, tuple[int, Any, tuple[Any, ...], int]]:
    table = {}
    for cls, specs in SPECS.items():
        names = [s.name for s in specs]
        if len(names) == 1:
            (name,) = names
            getter = lambda frame, _n=name: (getattr(frame, _n),)  # noqa: E731
        else:
            getter = attrgetter(*names)
        defaults = tuple(
            _REQUIRED if s.required
            else (s.default_factory() if s.default_factory is not None else s.default)
            for s in specs
        )
        n_required = sum(1 for s in specs if s.required)
        table[cls] = (CODES[cls], getter, defaults, n_required)
    return table


_ENCODERS = _encoder_table()


def _item_builder(cls: type) -> Any:
    """A straight-line ``frame -> (code, *fields)`` for ``cls``, trailing defaults cut:
    one test per optional field from the last, each returning at once (a loop over the
    defaults cost a Forward ~90 bytecodes on every hop, issue #14).  A field equals its
    default when it is the default or of its exact type and equal (0 never stands in
    for False)."""
    code, getter, defaults, n_required = _ENCODERS[cls]
    n = len(defaults)
    names = {"getter": getter, "code": code}
    lines = ["def item(frame):", "    v = getter(frame)"]
    for i in range(n - 1, n_required - 1, -1):
        names[f"d{i}"], names[f"t{i}"] = defaults[i], type(defaults[i])
        rest = "*v" if i == n - 1 else f"*v[:{i + 1}]"
        lines.append(f"    x = v[{i}]")
        lines.append(f"    if not (x is d{i} or (type(x) is t{i} and x == d{i})): "
                     f"return (code, {rest})")
    lines.append(f"    return (code, *v[:{n_required}])")
    exec("\n".join(lines), names)   # noqa: S102 - generated from SPECS
    return names["item"]


_ITEMS = {cls: _item_builder(cls) for cls in _ENCODERS}


def _item(frame: Frame) -> tuple:
    """The CBOR array of ``frame`` as a tuple ``(code, *fields)``, trailing defaults cut.
    A tuple, not a list: cbor2 encodes a top-level tuple without first probing it for
    being a Mapping (a Python-level ABC check that costs a list about a microsecond)."""
    try:
        build = _ITEMS[type(frame)]
    except KeyError:
        raise LocalError(f"not a frame: {type(frame).__name__}", code="not_a_frame") from None
    return build(frame)


# CBOR heads for the hand-built Deliver (major type and length), by length below 256.
_TEXT = tuple(bytes((0x60 | n,)) if n < 24 else bytes((0x78, n)) for n in range(256))
_BYTES = tuple(bytes((0x40 | n,)) if n < 24 else bytes((0x58, n)) for n in range(256))
_UINT = tuple(bytes((n,)) for n in range(24))
_DELIVER_TYPES = (str, str, str, dict, bytes, bool, int, int, float, float)
_pack_double = struct.Struct(">d").pack
_INF = float("inf")


def _head(major: int, n: int) -> bytes:
    """CBOR head of major type ``major`` (shifted) with argument ``n`` >= 0."""
    if n < 24:
        return bytes((major | n,))
    if n < 0x100:
        return bytes((major | 24, n))
    if n < 0x10000:
        return bytes((major | 25,)) + n.to_bytes(2, "big")
    if n < 0x100000000:
        return bytes((major | 26,)) + n.to_bytes(4, "big")
    return bytes((major | 27,)) + n.to_bytes(8, "big")


#: CBOR text items (head + UTF-8) of the strings every Deliver of a subscription repeats
#: -- its subscription id and destination -- so they are encoded once, not per message
#: (issue #14).  Bounded: emptied when it reaches ``_TEXT_MEMO_MAX`` entries.
_TEXT_MEMO: dict[str, bytes] = {}
_TEXT_MEMO_MAX = 4096


def _text_item(s: str) -> bytes:
    """``s`` as a CBOR text item, remembered in ``_TEXT_MEMO``.  Raises as ``str.encode``
    does (a lone surrogate), exactly where the unmemoised encoding raised."""
    b = s.encode()
    n = len(b)
    item = (_TEXT[n] if n < 256 else _head(0x60, n)) + b
    if len(_TEXT_MEMO) >= _TEXT_MEMO_MAX:
        _TEXT_MEMO.clear()
    _TEXT_MEMO[s] = item
    return item


def _reply_item(reply_to: object) -> bytes | None:
    """A hand-built frame's ``reply_to`` item: null, or a text string; None for any
    other value (the caller falls back to the generic path)."""
    if reply_to is None:
        return b"\xf6"
    if type(reply_to) is str:
        b = reply_to.encode()
        return (_TEXT[len(b)] if len(b) < 256 else _head(0x60, len(b))) + b
    return None


def _headers_item(headers: dict) -> bytes | None:
    """A hand-built frame's ``headers`` item (an empty map costs no encoder call); None
    when cbor2 cannot encode them: the generic path then refuses the frame, naming it."""
    if not headers:
        return b"\xa0"
    try:
        return _dumps(headers)
    except (cbor2.CBOREncodeError, TypeError, ValueError):
        return None


def _deliver_cbor(f: Deliver) -> bytes | None:
    """A Deliver's CBOR, built by hand: the broker writes one per message, and cbor2
    spends most of its time calling its output's ``write`` once per item.  Covers the
    usual shape (exact types, a timestamp, priority and redelivery count below 24,
    finite times) and returns None otherwise; the generic path then encodes the frame
    -- or refuses it -- exactly as before.  The bytes are identical to the generic
    path's (tests/wire/test_wire_fastpaths.py checks it)."""
    sub, msg, dst, headers, body = f.sub, f.msg, f.dst, f.headers, f.body
    priority, redelivered, reply_to, ts, exp = (f.priority, f.redelivered, f.reply_to,
                                                f.timestamp, f.expires)
    if ((type(sub), type(msg), type(dst), type(headers), type(body), type(f.persistent),
         type(priority), type(redelivered), type(ts), type(exp)) != _DELIVER_TYPES
            or not (0 <= priority < 24 and 0 <= redelivered < 24)
            or not (ts and -_INF < ts < _INF and -_INF < exp < _INF)):
        return None
    reply = _reply_item(reply_to)
    if reply is None:
        return None
    head_b = _headers_item(headers)
    if head_b is None:
        return None
    msg_b = msg.encode()
    m = len(msg_b)
    k = len(body)
    memo = _TEXT_MEMO
    return b"".join((
        b"\x8c\x07" if exp else b"\x8b\x07",   # code + 11 fields, or 10: expires 0.0 is cut
        memo.get(sub) or _text_item(sub),
        _TEXT[m] if m < 256 else _head(0x60, m), msg_b,
        memo.get(dst) or _text_item(dst),
        head_b,
        _BYTES[k] if k < 256 else _head(0x40, k), body,
        b"\xf5" if f.persistent else b"\xf4",
        _UINT[priority], _UINT[redelivered], reply,
        b"\xfb", _pack_double(ts),
        b"\xfb" + _pack_double(exp) if exp else b"",
    ))


#: ``_forward_cbor``: the field types it builds by hand (all but reply_to, in order)
_FORWARD_TYPES = (str, str, list, dict, bytes, bool, int, float, float, int)
#: ``_forward_cbor``: a path's CBOR array (text items only), by path
_PATH_MEMO: dict[tuple, bytes] = {}


def _path_item(path: list) -> bytes | None:
    """``path`` as a CBOR array of text, remembered in ``_PATH_MEMO`` (a chain's paths
    are few); None if an item is not exactly a str or the array is not short."""
    key = tuple(path)
    if len(key) >= 24 or not _ONLY_STR.issuperset(map(type, key)):
        return None
    item = bytes((0x80 | len(key),)) + b"".join(_TEXT_MEMO.get(p) or _text_item(p)
                                                 for p in key)
    if len(_PATH_MEMO) >= _TEXT_MEMO_MAX:
        _PATH_MEMO.clear()
    _PATH_MEMO[key] = item
    return item


def _forward_cbor(f: Forward) -> bytes | None:
    """A Forward's CBOR, built by hand as ``_deliver_cbor`` builds a Deliver's: every
    broker of a chain but the last writes one per message, and cbor2 calls its output's
    ``write`` once per item (issue #14).  Covers the usual shape (exact types, a short
    text path, a timestamp -- so no field before it is cut -- priority and redelivery
    count below 24, finite times) and returns None otherwise; the generic path then
    encodes the frame (or refuses it) as before.  The bytes are identical to the generic
    path's (tests/wire/test_forward_cbor.py)."""
    dst, msg, path, headers, body = f.dst, f.id, f.path, f.headers, f.body
    priority, redelivered, reply_to, ts, exp = (f.priority, f.redelivered, f.reply_to,
                                                f.timestamp, f.expires)
    if ((type(dst), type(msg), type(path), type(headers), type(body), type(f.persistent),
         type(priority), type(exp), type(ts), type(redelivered)) != _FORWARD_TYPES
            or not (0 <= priority < 24 and 0 <= redelivered < 24)
            or not (ts and -_INF < ts < _INF and -_INF < exp < _INF)):
        return None
    try:
        path_b = _PATH_MEMO.get(tuple(path)) or _path_item(path)
    except TypeError:   # an unhashable path item: not a text path
        return None
    if path_b is None:
        return None
    reply = _reply_item(reply_to)
    if reply is None:
        return None
    head_b = _headers_item(headers)
    if head_b is None:
        return None
    msg_b = msg.encode()
    m = len(msg_b)
    k = len(body)
    return b"".join((
        b"\x8c\x15" if redelivered else b"\x8b\x15",   # code + 11 fields, or 10
        _TEXT_MEMO.get(dst) or _text_item(dst),
        _TEXT[m] if m < 256 else _head(0x60, m), msg_b,
        path_b,
        head_b,
        _BYTES[k] if k < 256 else _head(0x40, k), body,
        b"\xf5" if f.persistent else b"\xf4",
        _UINT[priority],
        b"\xfb", _pack_double(exp),
        reply,
        b"\xfb", _pack_double(ts),
        _UINT[redelivered] if redelivered else b"",
    ))


#: ``_send_cbor``: the field types it builds by hand (all but reply_to, in order)
_SEND_TYPES = (str, str, dict, bytes, bool, int, int, bool)
#: ``_send_cbor``: an array head and Send's code, by the number of fields present
_SEND_HEADS = tuple(bytes((0x80 | (n + 1), CODES[Send])) for n in range(10))


def _send_cbor(f: Send) -> bytes | None:
    """A Send's CBOR, built by hand as a Deliver's and a Forward's are: a producer
    writes one per message (issue #14: the chain bench's driver shares the 2 cores
    with the brokers).  Trailing fields equal to their defaults are cut as the generic
    encoder cuts them; exact types, priority below 24 and ttl below 2**32 only -- else
    None and the generic path encodes (or refuses) the frame as before.  The bytes are
    identical to the generic path's (tests/wire/test_forward_cbor.py)."""
    dst, msg, headers, body, persistent = f.dst, f.id, f.headers, f.body, f.persistent
    priority, ttl, reply_to, receipt = f.priority, f.ttl, f.reply_to, f.receipt
    if ((type(dst), type(msg), type(headers), type(body), type(persistent), type(priority),
         type(ttl), type(receipt)) != _SEND_TYPES
            or not (0 <= priority < 24 and 0 <= ttl < 0x100000000)):
        return None
    reply = _reply_item(reply_to)
    if reply is None:
        return None
    # the fields present: up to the last one that is not its default
    n = (9 if receipt else 8 if reply_to is not None else 7 if ttl else
         6 if priority != 4 else 5 if persistent else 4 if body else 3 if headers else 2)
    head_b = _headers_item(headers)
    if head_b is None:
        return None
    msg_b = msg.encode()
    m = len(msg_b)
    k = len(body)
    return _SEND_HEADS[n] + b"".join((
        _TEXT_MEMO.get(dst) or _text_item(dst),
        (_TEXT[m] if m < 256 else _head(0x60, m)) + msg_b,
        head_b,
        (_BYTES[k] if k < 256 else _head(0x40, k)) + body,
        b"\xf5" if persistent else b"\xf4",
        _UINT[priority],
        _UINT[ttl] if ttl < 24 else _head(0, ttl),
        reply,
        b"\xf5" if receipt else b"\xf4",
    )[:n])


#: the frame types built by hand when their shape allows (else None: the generic path)
_HAND_BUILT = {Deliver: _deliver_cbor, Forward: _forward_cbor, Send: _send_cbor}


def _unencodable(frame: Frame, exc: Exception) -> LocalError:
    return LocalError(f"cannot encode {type(frame).__name__}: {exc}", code="unencodable")


def encode(frame: Frame) -> bytes:
    """One frame as length-prefixed CBOR. Raises LocalError for a non-frame or a value
    cbor2 cannot encode (our own misuse, never the peer's)."""
    build = _HAND_BUILT.get(type(frame))
    body = None if build is None else build(frame)
    if body is None:
        item = _item(frame)
        try:
            body = _dumps(item)
        except (cbor2.CBOREncodeError, TypeError, ValueError) as exc:
            raise _unencodable(frame, exc) from exc
    return _pack_len(len(body)) + body


def encode_many(frames: Iterable[Frame]) -> bytes:
    """Several frames as one bytes object, for a single ``send_all``.

    One encoder writes the whole batch into one buffer: a generic frame gets a 4-byte
    placeholder, then its CBOR, and its length is patched in at the end.  That spares a
    ``dumps`` (a fresh encoder and buffer) and a join part per frame.  A hand-built
    Deliver or Forward is written with its length at once."""
    out = BytesIO()
    write = out.write
    tell = out.tell
    encode_item = cbor2.CBOREncoder(out).encode
    patches = []   # (offset, length) of the generic frames' length prefixes
    hand_built = _HAND_BUILT.get
    pos = 0
    for frame in frames:
        build = hand_built(type(frame))
        body = None if build is None else build(frame)
        if body is not None:
            n = len(body)
            write(_pack_len(n))
            write(body)
        else:
            item = _ITEMS.get(type(frame), _item)(frame)   # _item: refuses a non-frame
            write(_NO_LENGTH)
            try:
                encode_item(item)
            except (cbor2.CBOREncodeError, TypeError, ValueError) as exc:
                raise _unencodable(frame, exc) from exc
            n = tell() - pos - 4
            patches.append((pos, n))
        pos += 4 + n
    if patches:
        with out.getbuffer() as view:
            for offset, n in patches:
                _pack_len_into(view, offset, n)
    return out.getvalue()


# --------------------------------------------------------------------------- validation


class _Bad(Exception):
    """Internal: a value does not fit its field kind; ``detail`` says how."""

    def __init__(self, detail: str) -> None:
        self.detail = detail


_TYPE_NAMES = {
    type(None): "null", bool: "bool", int: "int", float: "float", str: "str",
    bytes: "bytes", list: "array", dict: "map",
}


def _tname(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _want(expected: str, value: Any) -> _Bad:
    return _Bad(f"expected {expected}, got {_tname(value)}")


def _check_str(v: Any) -> Any:
    if type(v) is not str:
        raise _want("str", v)
    return v


def _check_int(v: Any) -> Any:
    if type(v) is not int:  # bool is an int subclass; a peer's true is not a number
        raise _want("int", v)
    return v


def _check_bool(v: Any) -> Any:
    if type(v) is not bool:
        raise _want("bool", v)
    return v


def _check_bytes(v: Any) -> Any:
    if type(v) is not bytes:
        raise _want("bytes", v)
    return v


def _check_float(v: Any) -> Any:
    t = type(v)
    if t is float:
        return v
    if t is int:
        return float(v)  # CBOR encoders may shorten 2.0 to 2
    raise _want("float", v)


def _check_num_opt(v: Any) -> Any:
    return None if v is None else _check_float(v)


def _check_str_opt(v: Any) -> Any:
    if v is not None and type(v) is not str:
        raise _want("str or null", v)
    return v


#: ``str`` alone: a container whose items' types are a subset holds only text
_ONLY_STR = frozenset((str,))


def _check_strlist(v: Any) -> Any:
    if type(v) is not list:
        raise _want("array of str", v)
    if _ONLY_STR.issuperset(map(type, v)):   # no per-item bytecode (issue #14)
        return v
    for i, item in enumerate(v):
        if type(item) is not str:
            raise _Bad(f"item {i}: expected str, got {_tname(item)}")
    return v


_HEADER_TYPES = frozenset((str, int, float, bool, type(None)))


def _check_headers(v: Any) -> Any:
    if type(v) is not dict:
        raise _want("map", v)
    if _ONLY_STR.issuperset(map(type, v)) and _HEADER_TYPES.issuperset(map(type, v.values())):
        return v   # the usual case, without a bytecode per header (issue #14)
    for key, item in v.items():
        if type(key) is not str:
            raise _Bad(f"key {key!r}: expected str, got {_tname(key)}")
        if type(item) not in _HEADER_TYPES:
            raise _Bad(f"[{key!r}]: expected str/int/float/bool/null, got {_tname(item)}")
    return v


_MAP_SCALARS = frozenset((str, int, float, bool, bytes, type(None)))


def _check_map_value(v: Any, where: str) -> None:
    t = type(v)
    if t in _MAP_SCALARS:
        return
    if t is list:
        for i, item in enumerate(v):
            _check_map_value(item, f"{where}[{i}]")
    elif t is dict:
        for key, item in v.items():
            if type(key) is not str:
                raise _Bad(f"{where} key {key!r}: expected str, got {_tname(key)}")
            _check_map_value(item, f"{where}[{key!r}]")
    else:
        raise _Bad(f"{where}: {_tname(v)} is not a plain CBOR value")


def _check_map(v: Any) -> Any:
    if type(v) is not dict:
        raise _want("map", v)
    _check_map_value(v, "")
    return v


_CHECKS = {
    "str": _check_str, "int": _check_int, "bool": _check_bool, "bytes": _check_bytes,
    "float": _check_float, "num?": _check_num_opt, "str?": _check_str_opt,
    "strlist": _check_strlist, "headers": _check_headers, "map": _check_map,
}

#: Types that pass a kind's check as they are, so most fields cost one set lookup.
_FAST_TYPES = {
    "str": frozenset((str,)), "int": frozenset((int,)), "bool": frozenset((bool,)),
    "bytes": frozenset((bytes,)), "float": frozenset((float,)),
    "num?": frozenset((float, type(None))), "str?": frozenset((str, type(None))),
    "strlist": frozenset(), "headers": frozenset(), "map": frozenset(),
}

#: Kinds whose value is a container: its type alone does not validate it when non-empty.
_DEEP_KINDS = frozenset(("strlist", "headers", "map"))
#: Container type of each deep kind (an empty one of these is valid as it is).
_CONTAINER = {"strlist": list, "headers": dict, "map": dict}


def _signatures(specs: tuple) -> frozenset:
    """Every ``tuple(map(type, item))`` of a valid item of this frame type whose scalar
    fields need no conversion, for each length from the required fields to all of them.
    A decoded item whose signature is here is valid once its non-empty containers are
    checked; anything else takes the field-by-field path, which names the problem."""
    options = [(_CONTAINER[s.kind],) if s.kind in _DEEP_KINDS
               else tuple(_FAST_TYPES[s.kind]) for s in specs]
    n_required = sum(1 for s in specs if s.required)
    sigs: set[tuple] = set()
    for n in range(n_required, len(specs) + 1):
        sigs.update((int, *combo) for combo in product(*options[:n]))
    return frozenset(sigs)


def _limits(cls: type) -> tuple[tuple[int, str, Any, Any, bool], ...]:
    """``frames.LIMITS`` of ``cls`` as ``(field index, name, low, high, is text)``;
    a text or list field has ``low`` None and ``high`` its longest length."""
    table = LIMITS[cls.__name__]
    out = []
    for i, s in enumerate(SPECS[cls]):
        if s.name in table:
            low, high = table[s.name]
            out.append((i, s.name, low, high, low is None))
    unknown = set(table) - {s.name for s in SPECS[cls]}
    assert not unknown, f"LIMITS names unknown fields of {cls.__name__}: {unknown}"
    return tuple(out)


def _check_limits(name: str, limits: tuple, values: Any, offset: int) -> None:
    """Every limited field of a type-valid item is in its range (issue #12)."""
    n = len(values)
    for i, field_name, low, high, text in limits:
        i += offset
        if i >= n:
            break
        v = values[i]
        if text:
            if v is None:
                continue
            if len(v) > high:
                what = "items" if type(v) is list else "characters"
                raise FrameError(f"{name}.{field_name}: {len(v)} {what}, at most {high}",
                                 code="bad_field")
            if type(v) is list:
                for j, item in enumerate(v):
                    if len(item) > MAX_NAME:
                        raise FrameError(f"{name}.{field_name}: item {j} has {len(item)} "
                                         f"characters, at most {MAX_NAME}", code="bad_field")
        elif not low <= v <= high:   # a NaN fails both comparisons
            raise FrameError(f"{name}.{field_name}: {v!r} is out of range {low!r}..{high!r}",
                             code="bad_field")


def _field_checks(cls: type, ref: str) -> list[tuple[int, str]]:
    """``(item index j, expression)`` per field of ``cls`` whose containers or limits need
    a test (see ``_limits_checker``); ``ref.format(j)`` names field ``j`` of the item."""
    specs = SPECS[cls]
    limited = {i: (low, high, text) for i, _, low, high, text in _limits(cls)}
    checks = []
    for i, spec in enumerate(specs):
        j = i + 1
        x = ref.format(j)
        if spec.kind in _DEEP_KINDS:
            if spec.kind == "strlist":
                inner = [f"_str_only(map(type, {x}))"]
                if i in limited:
                    inner.append(f"len({x}) <= {limited[i][1]}")
                    # no item longer than MAX_NAME: all of them together are not (a join
                    # is ~4x cheaper than max(map(len, …)) for a broker path), or else
                    # the longest is not
                    inner.append(f"(len(_join({x})) <= {MAX_NAME} "
                                 f"or max(map(len, {x})) <= {MAX_NAME})")
            elif spec.kind == "headers":
                inner = [f"_str_only(map(type, {x}))",
                         f"_header_values(map(type, {x}.values()))"]
                if i in limited:
                    inner.append(f"len({x}) <= {limited[i][1]}")
            else:   # "map": any CBOR inside, checked field by field
                inner = ["False"]
            checks.append((j, f"(not {x} or ({' and '.join(inner)}))"))
        elif i in limited:
            low, high, text = limited[i]
            if not text:
                checks.append((j, f"{low!r} <= {x} <= {high!r}"))
            elif spec.kind == "str?":
                checks.append((j, f"({x} is None or len({x}) <= {high})"))
            else:
                checks.append((j, f"len({x}) <= {high}"))
    return checks


def _limits_checker(cls: type) -> tuple:
    """Straight-line functions ``item -> bool``, one per item length ``n`` (the tuple's
    index; ``n`` = 1 + the fields present): True when a type-valid CBOR item
    ``[code, *fields]`` of that length has plainly valid containers (a list of text, a
    map of text to header values: tested in C as sets of item types; any other map: not
    vouched for) and every limited field within its limits.  Generated once per frame
    type: one boolean expression per length spares a length test, a local and a call
    per field (this is the per-message path, issue #14).  On False the caller checks
    field by field, which names the problem (or finds none)."""
    specs = SPECS[cls]
    checks = _field_checks(cls, "v[{}]")
    lines = []
    for n in range(len(specs) + 2):
        tests = [test for j, test in checks if j < n]
        lines.append(f"def check{n}(v):")
        lines.append(f"    return {' and '.join(tests) if tests else 'True'}")
    namespace: dict = {"_str_only": _ONLY_STR.issuperset,
                       "_header_values": _HEADER_TYPES.issuperset, "_join": "".join}
    exec("\n".join(lines), namespace)   # noqa: S102 - generated from SPECS and LIMITS
    return tuple(namespace[f"check{n}"] for n in range(len(specs) + 2))


def _fast_builders(cls: type) -> tuple:
    """Per item length ``n`` (the tuple's index), a generated ``item -> frame or None``:
    the frame when the item's type signature is valid (``_signatures``) and its
    containers and limits pass (``_limits_checker``), built from the unpacked fields;
    None otherwise, and the caller takes the usual path (which then names the problem).
    One function per length tests each field's type by identity and its limits in one
    expression: no signature tuple to build and hash, no checker call, no slice of the
    item per frame (issue #14: every broker and client decodes every message once).
    None in the tuple: no valid item has that length."""
    specs = SPECS[cls]
    checks = _field_checks(cls, "f{}")
    n_required = sum(1 for s in specs if s.required)
    namespace: dict = {"_str_only": _ONLY_STR.issuperset,
                       "_header_values": _HEADER_TYPES.issuperset, "_join": "".join,
                       "_cls": cls, "_code": CODES[cls]}
    lines = []
    lengths = []
    for n in range(len(specs) + 2):
        k = n - 1   # fields present
        if not n_required <= k <= len(specs):
            continue
        lengths.append(n)
        names = [f"f{j}" for j in range(1, n)]
        # the code: the int itself (codes are small ints, one object each in CPython;
        # True or 21.0 find a code's builders too, and fail here -- as would an int that
        # is not that object, which then merely takes the usual path)
        tests = ["_c is _code"]
        limits = dict(checks)
        for j, spec in enumerate(specs[:k], 1):
            allowed = ((_CONTAINER[spec.kind],) if spec.kind in _DEEP_KINDS
                       else tuple(_FAST_TYPES[spec.kind]))
            plain = [t for t in allowed if t is not type(None)]
            for t in plain:
                namespace[f"_t_{t.__name__}"] = t
            test = " or ".join(f"type(f{j}) is _t_{t.__name__}" for t in plain)
            if len(plain) < len(allowed):   # optional: None, or the type (and its limit)
                none_or = f"(f{j} is None or "
                limit = limits.get(j, "")
                if limit.startswith(none_or):
                    del limits[j]
                    test = f"f{j} is None or {test} and {limit[len(none_or):-1]}"
                else:
                    test = f"f{j} is None or {test}"
            tests.append(f"({test})" if " or " in test else test)
        tests += [test for j, test in limits.items() if j < n]
        lines.append(f"def fast{n}(v):")
        lines.append(f"    _c, {', '.join(names)}{'' if names else ''} = v")
        lines.append(f"    if {' and '.join(tests)}:")
        lines.append(f"        return _cls({', '.join(names)})")
        lines.append("    return None")
    exec("\n".join(lines), namespace)   # noqa: S102 - generated from SPECS and LIMITS
    return tuple(namespace[f"fast{n}"] if n in lengths else None
                 for n in range(len(specs) + 2))


#: code -> (class, class name, ((field name, fast types, check), ...), required count,
#:          valid signatures, ((item index, check) of container fields, ...),
#:          range / length limits (see ``_limits``), their generated checkers by length).
_DECODERS: dict[int, tuple[type, str, tuple[tuple[str, frozenset, Any], ...], int,
                           frozenset, tuple[tuple[int, Any], ...], tuple, Any]] = {
    code: (
        cls,
        cls.__name__,
        tuple((s.name, _FAST_TYPES[s.kind], _CHECKS[s.kind]) for s in SPECS[cls]),
        sum(1 for s in SPECS[cls] if s.required),
        _signatures(SPECS[cls]),
        tuple((i + 1, _CHECKS[s.kind]) for i, s in enumerate(SPECS[cls])
              if s.kind in _DEEP_KINDS),
        _limits(cls),
        _limits_checker(cls),
    )
    for code, cls in BY_CODE.items()
}
class _Builders(dict):
    """code -> the generated builders of ``_fast_builders`` by item length (None: invalid),
    generated when a frame of that type is first decoded: a broker meets a few of the frame
    types, and every type's builders at import added ~125 KiB to each process's idle
    memory (issue #14: idle RSS <= 35 MiB).  A float or bool equal to a code finds that
    code's builders too (``_FAST[21.0]``): each builder tests that its item's code is that
    int.  An unknown code raises KeyError, an unhashable one TypeError (``_build``'s usual
    path then names it)."""

    def __missing__(self, code: Any) -> tuple:
        builders = self[code] = _fast_builders(BY_CODE[code])
        return builders


_FAST: dict[int, tuple] = _Builders()


def _build(item: Any) -> Frame:
    """A decoded CBOR item -> a validated frame, or FrameError naming the problem."""
    if type(item) is not list:
        raise FrameError(f"frame must be a CBOR array, got {_tname(item)}", code="not_array")
    try:   # the usual frame: its code's builder for its length (``_fast_builders``)
        frame = _FAST[item[0]][len(item)](item)
    except (KeyError, IndexError, TypeError):   # no such code or length; an empty item
        frame = None
    if frame is not None:
        return frame
    if not item:
        raise FrameError("frame array is empty: no type code", code="unknown_type")
    code = item[0]
    entry = _DECODERS.get(code) if type(code) is int else None
    if entry is None:
        raise FrameError(f"unknown frame type code {code!r}", code="unknown_type")
    cls, name, fields, n_required, signatures, deep, limits, within = entry
    if tuple(map(type, item)) in signatures:
        # The common case: one set lookup validates every scalar field at once, one
        # generated expression the containers and the limits.
        n = len(item)
        if within[n](item):
            return cls(*item[1:])
        for i, check in deep:
            if i < n and item[i]:
                try:
                    check(item[i])
                except _Bad as bad:
                    raise _bad_field(name, fields[i - 1][0], bad) from None
        _check_limits(name, limits, item, 1)   # raises, naming the field, if one is out
        return cls(*item[1:])
    values = item[1:]
    n = len(values)
    if n > len(fields):
        raise FrameError(
            f"{name} frame has {n} fields, at most {len(fields)} allowed",
            code="too_many_fields",
        )
    if n < n_required:
        raise FrameError(
            f"{name} frame is missing required field '{fields[n][0]}'", code="missing_field"
        )
    for i, value in enumerate(values):
        field_name, fast, check = fields[i]
        if type(value) in fast:
            continue
        try:
            values[i] = check(value)
        except _Bad as bad:
            raise _bad_field(name, field_name, bad) from None
    if limits:
        _check_limits(name, limits, values, 0)
    return cls(*values)


def _bad_field(frame_name: str, field_name: str, bad: _Bad) -> FrameError:
    sep = "" if bad.detail.startswith("[") else ": "
    return FrameError(f"{frame_name}.{field_name}{sep}{bad.detail}", code="bad_field")


# --------------------------------------------------------------------------- decoding


def _refuse_tag(*args: Any) -> Any:
    raise ValueError("CBOR tags are not allowed in frames")


class _RefuseAllTags(Mapping):
    """semantic_decoders that answer every tag number with a refusal, so no built-in
    decoder (datetime, bignum, set, shared value...) ever runs on peer input."""

    def __getitem__(self, tag: int) -> Any:
        return _refuse_tag

    def __contains__(self, tag: object) -> bool:
        return True

    def __iter__(self) -> Iterator[int]:
        return iter(())

    def __len__(self) -> int:
        return 0


_DECODER_OPTIONS = dict(
    tag_hook=_refuse_tag,
    semantic_decoders=_RefuseAllTags(),
    max_depth=_MAX_DEPTH,
    allow_duplicate_keys=False,
    strict_hashable_types=True,
    str_errors="strict",
)


class FrameDecoder:
    """Incremental frame parser: feed bytes, take validated frames."""

    __slots__ = ("max_frame", "_buf", "_off", "_ready", "_error")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        if type(max_frame) is not int or not 1 <= max_frame <= 0xFFFFFFFF:
            raise LocalError(f"max_frame must be 1..2**32-1, got {max_frame!r}",
                             code="bad_argument")
        self.max_frame = max_frame
        self._buf = bytearray()
        self._off = 0                           # start of unparsed bytes in _buf
        self._ready: deque[Frame] = deque()     # decoded, not yet handed out
        self._error: FrameError | None = None   # set once; the decoder is then broken

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buf) - self._off

    def receive_data(self, data: bytes) -> None:
        """Buffer bytes from the peer. Raises the decoder's FrameError once broken."""
        if self._error is not None:
            raise self._error
        self._buf += data

    def next_frame(self) -> Any:
        """The next complete frame, or NEED_DATA. Raises FrameError on malformed input."""
        ready = self._ready
        if not ready:
            self._parse()
            if not ready:
                if self._error is not None:
                    raise self._error
                return NEED_DATA
        return ready.popleft()

    def frames(self) -> Iterator[Frame]:
        """Every complete frame currently buffered, in order (raises like next_frame)."""
        ready = self._ready
        while True:
            if not ready:
                self._parse()
                if not ready:
                    if self._error is not None:
                        raise self._error
                    return
            yield ready.popleft()

    def take(self) -> list:
        """Every complete frame currently buffered, in order, as one list (what
        ``list(self.frames())`` gives, without a generator step and an append per frame:
        issue #14).  Raises the decoder's FrameError only when no frame precedes it; a
        later call raises it then."""
        ready = self._ready
        self._parse()   # appends after any frames still ready: order kept
        if not ready:
            if self._error is not None:
                raise self._error
            return []
        frames = list(ready)
        ready.clear()
        return frames

    def _fail(self, message: str, code: str) -> None:
        if self._error is None:
            self._error = FrameError(message, code=code)
        self._buf = bytearray()  # doomed connection: free what it sent
        self._off = 0

    def _parse(self) -> None:
        if self._error is not None:
            return
        buf = self._buf
        start = pos = self._off
        end = len(buf)
        max_frame = self.max_frame
        ends = []  # where each complete frame ends, relative to ``start``
        problem = None
        while end - pos >= 4:
            (n,) = _unpack_len(buf, pos)
            if n == 0:
                problem = ("zero-length frame", "bad_cbor")
                break
            if n > max_frame:
                problem = (f"frame length {n} exceeds the maximum {max_frame}", "oversized")
                break
            if end - pos - 4 < n:
                break
            pos += 4 + n
            ends.append(pos - start)
        if ends:
            with memoryview(buf) as view:
                region = view[start:pos]
                stream = BytesIO(region)  # one copy for the whole batch
                region.release()
            decode = cbor2.CBORDecoder(stream, **_DECODER_OPTIONS).decode
            tell = stream.tell
            # each frame's body starts 4 bytes (its length) after the previous frame's end,
            # where the decoder stopped (checked below): one relative seek, no offset kept
            skip_length = partial(stream.seek, 4, SEEK_CUR)
            append = self._ready.append
            for frame_end in ends:
                skip_length()
                try:
                    item = decode()
                except Exception as exc:  # the one edge where cbor2's errors are translated
                    self._fail(f"undecodable CBOR: {exc}", "bad_cbor")
                    return
                if tell() != frame_end:
                    i = ends.index(frame_end)
                    body = (ends[i - 1] if i else 0) + 4
                    self._fail(f"CBOR item is {tell() - body} bytes but the frame length "
                               f"is {frame_end - body}", "bad_cbor")
                    return
                try:
                    append(_build(item))
                except FrameError as exc:
                    self._fail(exc.message, exc.code)
                    return
            self._off = pos
        if problem is not None:
            self._fail(*problem)
        elif pos == end:
            buf.clear()
            self._off = 0
        elif pos > 65536 and pos * 2 > end:
            del buf[:pos]  # compact now and then, not per frame
            self._off = 0


def check_hello(frame: Frame, expected_version: int, roles: Iterable[str] = HELLO_ROLES) -> Hello:
    """The first frame of a connection must be a Hello of our version and a known role."""
    if type(frame) is not Hello:
        raise FrameError(f"expected hello as the first frame, got {type(frame).__name__}",
                         code="not_hello")
    if frame.version != expected_version:
        raise FrameError(
            f"protocol version {frame.version} is not supported (this side speaks "
            f"{expected_version})", code="bad_version")
    if frame.role not in roles:
        raise FrameError(f"role {frame.role!r} is not one of {', '.join(roles)}",
                         code="bad_role")
    return frame
