"""Frame types of the treefed wire protocol (DESIGN §2).

Theory of operation
-------------------
A frame on the wire is a 4-byte big-endian length N followed by N bytes of CBOR.  The CBOR
item is an *array* ``[code, field1, field2, ...]`` (arrays are cheaper than maps): ``code``
is the frame type's small integer and the fields follow in the order of ``FIELDS`` below.
Trailing optional fields may be omitted by the encoder; the decoder fills their defaults.

In memory a frame is one of the slotted dataclasses below.  ``SPECS`` is the table the
codec validates against: for every field its name, its type tag and its default.  Type tags:

  ``str``  ``int``  ``bool``  ``bytes``  ``float`` (int accepted)  ``num?`` (float or None)
  ``str?`` (str or None)  ``strlist`` (list of str)  ``headers`` (dict str -> str/int/float/
  bool/None)  ``map`` (dict with str keys, any CBOR values; for admin replies)

This module only *describes* frames; encoding, decoding and validation live in
``codec.py``.  Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PROTOCOL_VERSION",
    "Frame",
    "Hello",
    "Send",
    "Subscribe",
    "Unsubscribe",
    "Ack",
    "Nack",
    "Deliver",
    "Receipt",
    "Ping",
    "Pong",
    "Error",
    "Bye",
    "Advisory",
    "Subtree",
    "Forward",
    "ForwardAck",
    "StatRequest",
    "StatReply",
    "Admin",
    "FieldSpec",
    "SPECS",
    "CODES",
    "BY_CODE",
    "LIMITS",
    "MAX_NAME",
    "MAX_PATH",
    "MAX_EPOCH",
]

PROTOCOL_VERSION = 1


class Frame:
    """Marker base class of every frame type."""

    __slots__ = ()


@dataclass(slots=True)
class Hello(Frame):
    """First frame each side sends.

    role: "client" | "broker".  For broker links: connector ("tree" | "mesh"),
    node_type ("leaf" | "branch" | "root" | "mesh"), ancestry (broker ids from the
    sender's parent up to the root, tree links only), link name (mesh connectors may
    link one pair several times under distinct names), duplex flag, and ``options``: the
    dialing side's connector settings (network_ttl, conduit_subscriptions, filters...) so
    the accepting side of a duplex or one-way link applies the same rules.
    """

    version: int
    role: str
    broker_id: str | None = None
    name: str | None = None
    connector: str | None = None
    node_type: str | None = None
    ancestry: list[str] = field(default_factory=list)
    link_name: str | None = None
    duplex: bool = False
    username: str | None = None
    password: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Send(Frame):
    """A producer's message. ``ttl`` in milliseconds (0 = never expires)."""

    dst: str
    id: str
    headers: dict[str, Any] = field(default_factory=dict)
    body: bytes = b""
    persistent: bool = False
    priority: int = 4
    ttl: int = 0
    reply_to: str | None = None
    receipt: bool = False


@dataclass(slots=True)
class Subscribe(Frame):
    """Open a consumer. The broker answers with Receipt(id) or Error(ref=id)."""

    id: str
    dst: str
    selector: str | None = None
    prefetch: int = 1000
    priority: int = 0


@dataclass(slots=True)
class Unsubscribe(Frame):
    id: str


@dataclass(slots=True)
class Ack(Frame):
    """Acknowledge (and so delete) message ``msg`` delivered to subscription ``sub``.

    ``upto`` (cumulative acknowledgement, as JMS client-ack and ActiveMQ's
    optimizeAcknowledge): every message still in flight on ``sub`` that was delivered
    before ``msg``, and ``msg`` itself, in delivery order.  One frame settles a batch."""

    sub: str
    msg: str
    upto: bool = False


@dataclass(slots=True)
class Nack(Frame):
    """Give a delivered message back for redelivery (or the DLQ after max redeliveries)."""

    sub: str
    msg: str


@dataclass(slots=True)
class Deliver(Frame):
    """A message delivered to subscription ``sub``. ``redelivered`` counts earlier tries.
    ``timestamp`` is the broker's receive time in epoch seconds, ``expires`` epoch seconds
    (0 = never)."""

    sub: str
    msg: str
    dst: str
    headers: dict[str, Any] = field(default_factory=dict)
    body: bytes = b""
    persistent: bool = False
    priority: int = 4
    redelivered: int = 0
    reply_to: str | None = None
    timestamp: float = 0.0
    expires: float = 0.0


@dataclass(slots=True)
class Receipt(Frame):
    """Confirms request ``id``: a persistent send once committed, a subscribe once open."""

    id: str


@dataclass(slots=True)
class Ping(Frame):
    token: int = 0


@dataclass(slots=True)
class Pong(Frame):
    token: int = 0


@dataclass(slots=True)
class Error(Frame):
    """``code`` names the problem (see errors.py); ``ref`` is the refused request's id,
    or None when the error is fatal and the connection is being closed."""

    code: str
    message: str
    ref: str | None = None


@dataclass(slots=True)
class Bye(Frame):
    reason: str = ""


@dataclass(slots=True)
class Advisory(Frame):
    """Consumer interest crossing a broker link.

    ``path`` lists the brokers the advisory has passed, **origin first, the sender
    excluded**: a consumer local to the sender arrives with ``path == []``; one the
    sender learned from its origin O arrives with ``["O"]``, and so on.  The receiver
    keys the instance by ``(consumer, path + [sender])``.
    """

    kind: str
    consumer: str
    dst: str
    origin: str
    selector: str | None = None
    priority: int = 0
    path: list[str] = field(default_factory=list)
    # issue 18 part 2 (federation/summary.py): set only on a summarising child's covering
    # entry -- the ownership pattern ("queue://Store.{broker}.>") it stands for.  None is
    # the default, so a plain advisory encodes exactly as before (trailing default cut).
    cover: str | None = None


@dataclass(slots=True)
class Subtree(Frame):
    """A summarising tree child's subtree membership (issue 18 part 2): broker ids now
    below it (``add``) and no longer (``remove``).  Sent only on a link whose parent
    agreed to summaries in its hello (``federation/summary.py``)."""

    add: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Forward(Frame):
    """A message crossing a broker link. ``path`` lists the brokers it has left,
    the sender last."""

    dst: str
    id: str
    path: list[str]
    headers: dict[str, Any] = field(default_factory=dict)
    body: bytes = b""
    persistent: bool = False
    priority: int = 4
    expires: float = 0.0
    reply_to: str | None = None
    timestamp: float = 0.0
    redelivered: int = 0


@dataclass(slots=True)
class ForwardAck(Frame):
    """The receiver has taken (stored, if persistent) these forwarded message ids."""

    ids: list[str]


@dataclass(slots=True)
class StatRequest(Frame):
    """Ask for statistics: ``what`` = all | summary | one list section; list sections
    come in pages (``offset``, ``limit``; 0 = the broker's default) and may be filtered
    by a destination pattern ``match`` (issue #12: a big broker's reply passed 4 MiB)."""

    what: str = "all"
    match: str | None = None
    offset: int = 0
    limit: int = 0


@dataclass(slots=True)
class StatReply(Frame):
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Admin(Frame):
    """An operator's request to change or inspect a running broker (``treefed link``,
    ``treefed reload``): needs admin on ``>`` like StatRequest, answered in the same
    order by a StatReply (the result) or an Error with ``ref="stat"``."""

    command: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FieldSpec:
    name: str
    kind: str
    required: bool
    default: Any = None
    default_factory: Any = None


def _specs(cls: type) -> tuple[FieldSpec, ...]:
    import dataclasses

    out = []
    for f in dataclasses.fields(cls):
        kind = _KINDS[cls.__name__][f.name]
        if f.default is not dataclasses.MISSING:
            out.append(FieldSpec(f.name, kind, False, default=f.default))
        elif f.default_factory is not dataclasses.MISSING:
            out.append(FieldSpec(f.name, kind, False, default_factory=f.default_factory))
        else:
            out.append(FieldSpec(f.name, kind, True))
    return tuple(out)


_KINDS: dict[str, dict[str, str]] = {
    "Hello": dict(version="int", role="str", broker_id="str?", name="str?", connector="str?",
                  node_type="str?", ancestry="strlist", link_name="str?", duplex="bool",
                  username="str?", password="str?", options="map"),
    "Send": dict(dst="str", id="str", headers="headers", body="bytes", persistent="bool",
                 priority="int", ttl="int", reply_to="str?", receipt="bool"),
    "Subscribe": dict(id="str", dst="str", selector="str?", prefetch="int", priority="int"),
    "Unsubscribe": dict(id="str"),
    "Ack": dict(sub="str", msg="str", upto="bool"),
    "Nack": dict(sub="str", msg="str"),
    "Deliver": dict(sub="str", msg="str", dst="str", headers="headers", body="bytes",
                    persistent="bool", priority="int", redelivered="int", reply_to="str?",
                    timestamp="float", expires="float"),
    "Receipt": dict(id="str"),
    "Ping": dict(token="int"),
    "Pong": dict(token="int"),
    "Error": dict(code="str", message="str", ref="str?"),
    "Bye": dict(reason="str"),
    "Advisory": dict(kind="str", consumer="str", dst="str", origin="str", selector="str?",
                     priority="int", path="strlist", cover="str?"),
    "Subtree": dict(add="strlist", remove="strlist"),
    "Forward": dict(dst="str", id="str", path="strlist", headers="headers", body="bytes",
                    persistent="bool", priority="int", expires="float", reply_to="str?",
                    timestamp="float", redelivered="int"),
    "ForwardAck": dict(ids="strlist"),
    "StatRequest": dict(what="str", match="str?", offset="int", limit="int"),
    "StatReply": dict(data="map"),
    "Admin": dict(command="str", args="map"),
}

#: Longest id, destination, subscription or broker name a frame may carry (characters).
MAX_NAME = 4096
#: Most broker ids in a path or an ancestry (the core drops a forward at 64 hops).
MAX_PATH = 256
#: Most broker ids in one Subtree frame (a sender splits longer lists).
MAX_MEMBERS = 10_000
#: Latest timestamp / expiry accepted, epoch seconds (about the year 5138).
MAX_EPOCH = 1e11
_INT63 = 2 ** 63 - 1

#: Checked range of every number field and longest text / list per frame type (issue
#: #12: a peer's priority 2**40, redelivered 2**63 or timestamp -1e300 must be refused
#: at the door, not discovered by SQLite).  Numbers: ``(low, high)`` inclusive (a NaN
#: fits no range); ``str`` / ``str?`` / ``strlist``: ``(None, longest)``.  Fields not
#: listed (bodies, headers, admin maps, selectors) are bounded by the frame size.
LIMITS: dict[str, dict[str, tuple]] = {
    "Hello": dict(version=(0, 0xFFFF), broker_id=(None, MAX_NAME), name=(None, MAX_NAME),
                  connector=(None, 64), node_type=(None, 64), ancestry=(None, MAX_PATH),
                  link_name=(None, MAX_NAME), username=(None, MAX_NAME),
                  password=(None, MAX_NAME)),
    # a client's id gets its producer scope appended (wire/ids.py): room for it
    "Send": dict(dst=(None, MAX_NAME), id=(None, MAX_NAME - 64), priority=(0, 9),
                 ttl=(0, 2 ** 53), reply_to=(None, MAX_NAME)),
    "Subscribe": dict(id=(None, MAX_NAME), dst=(None, MAX_NAME), prefetch=(0, 1_000_000),
                      priority=(-1000, 1000)),
    "Unsubscribe": dict(id=(None, MAX_NAME)),
    "Ack": dict(sub=(None, MAX_NAME), msg=(None, MAX_NAME)),
    "Nack": dict(sub=(None, MAX_NAME), msg=(None, MAX_NAME)),
    "Deliver": dict(sub=(None, MAX_NAME), msg=(None, MAX_NAME), dst=(None, MAX_NAME),
                    priority=(0, 9), redelivered=(0, 2 ** 31 - 1), reply_to=(None, MAX_NAME),
                    timestamp=(0.0, MAX_EPOCH), expires=(0.0, MAX_EPOCH)),
    "Receipt": dict(id=(None, MAX_NAME)),
    "Ping": dict(token=(-_INT63 - 1, _INT63)),
    "Pong": dict(token=(-_INT63 - 1, _INT63)),
    "Error": dict(code=(None, 64), ref=(None, MAX_NAME)),
    "Bye": dict(),
    "Advisory": dict(kind=(None, 64), consumer=(None, MAX_NAME), dst=(None, MAX_NAME),
                     origin=(None, MAX_NAME), priority=(-1000, 1000), path=(None, MAX_PATH),
                     cover=(None, MAX_NAME)),
    "Subtree": dict(add=(None, MAX_MEMBERS), remove=(None, MAX_MEMBERS)),
    "Forward": dict(dst=(None, MAX_NAME), id=(None, MAX_NAME), path=(None, MAX_PATH),
                    priority=(0, 9), expires=(0.0, MAX_EPOCH), reply_to=(None, MAX_NAME),
                    timestamp=(0.0, MAX_EPOCH), redelivered=(0, 2 ** 31 - 1)),
    "ForwardAck": dict(),
    "StatRequest": dict(what=(None, 64), match=(None, MAX_NAME), offset=(0, 2 ** 31 - 1),
                        limit=(0, 2 ** 31 - 1)),
    "StatReply": dict(),
    "Admin": dict(command=(None, 64)),
}

#: frame class -> wire code. Codes are part of the protocol: never renumber.
CODES: dict[type, int] = {
    Hello: 1, Send: 2, Subscribe: 3, Unsubscribe: 4, Ack: 5, Nack: 6, Deliver: 7,
    Receipt: 8, Ping: 9, Pong: 10, Error: 11, Bye: 12, Advisory: 20, Forward: 21,
    ForwardAck: 22, Subtree: 23, StatRequest: 30, StatReply: 31, Admin: 32,
}
BY_CODE: dict[int, type] = {code: cls for cls, code in CODES.items()}
SPECS: dict[type, tuple[FieldSpec, ...]] = {cls: _specs(cls) for cls in CODES}
