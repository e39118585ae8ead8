"""One STOMP connection mapped onto the native protocol (pure, no I/O).

Theory of operation
-------------------
``StompSession`` stands between a STOMP client and the broker's site task, which only
ever sees native frames (``wire.frames``).  So a STOMP client is, to the core, the
federation, the guard and the store, exactly a native client: its SUBSCRIBE is a native
``Subscribe`` (interest that travels the tree or mesh), its SEND a native ``Send``
(routed, stored, screened, flow-controlled as any other).

* ``receive(frame, now)`` -> native frames for the broker.  CONNECT / STOMP becomes the
  client ``Hello`` (login / passcode as username / password, so the one authenticator
  checks them); the broker's ``Hello`` answer comes back through ``send`` as CONNECTED.
* ``send(native)`` -> (STOMP frames for the client, native frames to feed back to the
  broker); ``message(deliver)`` is its per-message case.  ``ack:auto`` deliveries
  (subscriptions in ``auto_subs``) are acknowledged by the shell once written: one
  cumulative ``Ack`` per subscription per written batch.
* Receipts.  A STOMP ``receipt`` waits for a set of native confirmations: a send's
  ``Receipt`` (given once the message is admitted and, if persistent, committed), a
  subscription's ``Receipt``, or the ``Pong`` answering a ``Ping`` barrier the session
  adds behind frames that have no confirmation of their own (ACK, BEGIN, DISCONNECT...).
  The site task answers in order and only after the batch's commit, so RECEIPT means
  "done".  A native ``Error`` whose ``ref`` a receipt waits for becomes ERROR with that
  ``receipt-id``.
* Errors are fatal, as STOMP wants: any ERROR sent sets ``failed``; the shell closes.
  A protocol violation raises ``FrameError`` (with ``receipt_id`` set when the offending
  frame asked for a receipt); the shell turns it into ERROR and a close.
* Acknowledgement.  ``ack`` header values are per-delivery tags; ``client`` mode ACK is
  cumulative (native ``Ack(upto=True)``), ``client-individual`` per message; NACK gives
  the message (in client mode every earlier unacked one too) back for redelivery / DLQ.
* Transactions buffer SEND / ACK / NACK until COMMIT, which releases them in one batch
  (one store transaction); ABORT drops them.  Transactional sends carry ``receipt=True``
  natively so a COMMIT receipt waits for every one of them to be admitted and stored.
* Destinations: ``/queue/X`` <-> ``queue://X``, ``/topic/X`` <-> ``topic://X``,
  ``/temp-queue/X`` <-> ``temp-queue://<session>.X`` (private to this connection, so two
  connections' ``/temp-queue/reply`` never collide); another connection's temporary
  destination is shown as ``/remote-temp-queue/<native name>`` and can be sent to.
  A bare name is a queue; a native ``queue://X`` is accepted as is.
* Headers: see ``HEADER_MAP``.  User headers pass through as strings both ways.

Never: imports trio, reads a clock (``now`` arrives), or decides routing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from treefed.errors import FrameError
from treefed.stomp.codec import StompFrame
from treefed.wire.frames import (PROTOCOL_VERSION, Ack, Bye, Deliver, Error, Hello, Nack,
                                 Ping, Pong, Receipt, Send, Subscribe, Unsubscribe)

__all__ = ["StompSession", "VERSIONS", "HEADER_MAP", "MIN_HEARTBEAT_MS",
           "stomp_destination", "native_destination"]

VERSIONS = ("1.0", "1.1", "1.2")
#: Shortest heart-beat period either side is held to, in ms (a client asking for 1 ms
#: would otherwise make the broker write a newline per millisecond).
MIN_HEARTBEAT_MS = 100
#: STOMP header -> native field or header, for the README table and for ``_to_send``.
HEADER_MAP = {
    "destination": "Send.dst (/queue/X -> queue://X, /topic/X -> topic://X)",
    "persistent": "Send.persistent ('true' -> stored before the receipt)",
    "priority": "Send.priority (0-9; left out of MESSAGE when 4, the default)",
    "expires": "Send.ttl (absolute epoch ms -> ms from now; 0 or absent = never)",
    "reply-to": "Send.reply_to (destination mapped as above)",
    "correlation-id": "header JMSCorrelationID",
    "type": "header JMSType",
    "message-id": "Deliver.msg (ignored on SEND: the broker names messages)",
    "redelivered": "Deliver.redelivered > 0",
    "timestamp": "Deliver.timestamp (epoch ms)",
}
_RESERVED = frozenset({"destination", "transaction", "receipt", "content-length",
                       "persistent", "priority", "expires", "reply-to", "correlation-id",
                       "type", "message-id", "redelivered", "subscription", "ack",
                       "timestamp"})
_ACK_MODES = ("auto", "client", "client-individual")
_TRUE = ("true", "1", "yes")
#: destinations a session remembers the mapping of (per direction)
_CACHE_SIZE = 1024
#: refusals of a fed-back auto ack that lost a race with UNSUBSCRIBE (see ``send``)
_RACE_CODES = ("no_such_subscription", "no_such_message")


def native_destination(text: str, temp_prefix: str) -> str:
    """A STOMP destination header -> canonical-ish native name (the core validates)."""
    if text.startswith("/queue/"):
        return "queue://" + text[7:]
    if text.startswith("/topic/"):
        return "topic://" + text[7:]
    if text.startswith("/temp-queue/"):
        return f"temp-queue://{temp_prefix}.{text[12:]}"
    if text.startswith("/temp-topic/"):
        return f"temp-topic://{temp_prefix}.{text[12:]}"
    if text.startswith("/remote-temp-queue/"):
        return "temp-queue://" + text[19:]
    if text.startswith("/remote-temp-topic/"):
        return "temp-topic://" + text[19:]
    if text.startswith("/"):
        raise FrameError(f"destination {text!r}: expected /queue/, /topic/, /temp-queue/ "
                         "or /temp-topic/", code="bad_destination")
    return text   # a bare name (a queue) or a native queue:// name


def stomp_destination(dst: str, temp_prefix: str) -> str:
    """A native destination -> how a STOMP client names it."""
    scheme, _, name = dst.partition("://")
    if scheme in ("temp-queue", "temp-topic"):
        own = temp_prefix + "."
        if name.startswith(own):
            return f"/{scheme}/{name[len(own):]}"
        return f"/remote-{scheme}/{name}"
    return f"/{scheme}/{name}"


@dataclass(slots=True)
class _Sub:
    """One STOMP subscription."""

    id: str                     # the client's id == the native subscription id
    ack: str                    # auto | client | client-individual
    unacked: dict[str, str] = field(default_factory=dict)  # ack tag -> message id, in
    #                             delivery order (client modes only)


class StompSession:
    """The STOMP side of one connection; see the module doc."""

    def __init__(self, session_id: str, *, server: str = "treefed",
                 heartbeat_ms: tuple[int, int] = (0, 0)) -> None:
        self.session_id = session_id        # unique in the estate: names messages, temps
        self.server = server
        #: what this broker offers: (can send every, wants every) in ms; 0 = honour the
        #: client's wish as is (above MIN_HEARTBEAT_MS).
        self.offer = heartbeat_ms
        self.version = "1.0"
        self.state = "new"                  # new | connecting | connected | closed
        self.failed = False                 # an ERROR went out: the shell closes
        self.send_every = 0.0               # negotiated heart-beats, seconds (0: none)
        self.expect_every = 0.0
        self.host: str | None = None
        self.login: str | None = None
        self._subs: dict[str, _Sub] = {}
        self.auto_subs: set[str] = set()    # ids of the ack:auto subscriptions
        self._acks: dict[str, _Sub] = {}    # ack tag -> its subscription
        self._tx: dict[str, list[StompFrame]] = {}
        self._waits: dict[tuple[str, Any], str] = {}   # native confirmation -> receipt
        self._receipts: dict[str, set] = {}            # receipt -> confirmations left
        self._next = 0
        self._client_hb = (0, 0)
        self._to_native: dict[str, str] = {}   # destination header -> native name
        self._to_stomp: dict[str, str] = {}    # native name -> destination header
        self.fatal: FrameError | None = None   # the client frame refused (the shell
        #                                        closes with its ERROR)

    # ------------------------------------------------------------------ inbound
    def receive(self, frame: StompFrame, now: float) -> list:
        """A client frame -> native frames for the broker; FrameError when refused."""
        cmd = frame.command
        try:
            if self.state == "new":
                if cmd not in ("CONNECT", "STOMP"):
                    raise FrameError(f"{cmd} before CONNECT", code="not_connected")
                return self._connect(frame)
            if cmd in ("CONNECT", "STOMP"):
                raise FrameError("already connected", code="bad_frame")
            handler = self._HANDLERS[cmd]
            return handler(self, frame, now)
        except FrameError as exc:
            receipt = frame.headers.get("receipt")
            if receipt is not None and getattr(exc, "receipt_id", None) is None:
                exc.receipt_id = receipt
            raise

    def _connect(self, f: StompFrame) -> list:
        h = f.headers
        accepted = h.get("accept-version", "1.0").split(",")
        common = [v for v in VERSIONS if v in {a.strip() for a in accepted}]
        if not common:
            exc = FrameError(f"no supported protocol version in accept-version "
                             f"{h.get('accept-version')!r} (supported: "
                             f"{','.join(VERSIONS)})", code="bad_version")
            raise exc
        self.version = common[-1]
        self.host = h.get("host")
        self.login = h.get("login")
        hb = h.get("heart-beat", "0,0")
        try:
            cx, cy = (int(p) for p in hb.split(","))
            if cx < 0 or cy < 0:
                raise ValueError
        except ValueError:
            raise FrameError(f"bad heart-beat header {hb!r}: expected two "
                             "non-negative integers 'cx,cy'", code="bad_header") from None
        self._client_hb = (cx, cy)
        self.state = "connecting"
        return [Hello(PROTOCOL_VERSION, "client", name=h.get("client-id") or h.get("host"),
                      username=self.login, password=h.get("passcode"))]

    def _send(self, f: StompFrame, now: float) -> list:
        h = f.headers
        tx = h.get("transaction")
        if tx is not None:
            self._tx_list(tx).append(f)
            return self._barrier(h.get("receipt"))
        send = self._to_send(f, now, receipt=h.get("receipt") is not None)
        if send.receipt:
            self._wait(h["receipt"], [("r", send.id)])
        return [send]

    def _to_send(self, f: StompFrame, now: float, *, receipt: bool) -> Send:
        h = f.headers
        dst = h.get("destination")
        if not dst:
            raise FrameError("SEND without a destination header", code="bad_frame")
        headers: dict[str, Any] = {k: v for k, v in h.items() if k not in _RESERVED}
        if "correlation-id" in h:
            headers["JMSCorrelationID"] = h["correlation-id"]
        if "type" in h:
            headers["JMSType"] = h["type"]
        priority = _int_header(h, "priority", 4)
        if not 0 <= priority <= 9:
            raise FrameError(f"priority must be 0..9, not {priority}", code="bad_header")
        expires = _int_header(h, "expires", 0)
        ttl = 0
        if expires > 0:
            ttl = max(1, expires - int(now * 1000))
        reply_to = h.get("reply-to")
        self._next += 1
        native = self._to_native.get(dst)
        if native is None:
            native = native_destination(dst, self.session_id)
            if len(self._to_native) < _CACHE_SIZE:
                self._to_native[dst] = native
        return Send(native,
                    f"ID:{self.session_id}:{self._next}", headers, f.body,
                    h.get("persistent", "").lower() in _TRUE, priority, ttl,
                    native_destination(reply_to, self.session_id) if reply_to else None,
                    receipt)

    def _subscribe(self, f: StompFrame, now: float) -> list:
        h = f.headers
        dst = h.get("destination")
        sub_id = h.get("id")
        if sub_id is None:
            if self.version != "1.0":
                raise FrameError("SUBSCRIBE without an id header", code="bad_frame")
            sub_id = dst or ""
        if not dst:
            raise FrameError("SUBSCRIBE without a destination header", code="bad_frame")
        if sub_id in self._subs:
            raise FrameError(f"subscription {sub_id!r} already exists",
                             code="duplicate_subscription")
        ack = h.get("ack", "auto")
        if ack not in _ACK_MODES:
            raise FrameError(f"ack mode {ack!r} is not one of {', '.join(_ACK_MODES)}",
                             code="bad_header")
        prefetch = _int_header(h, "activemq.prefetchSize", 0) or _int_header(
            h, "prefetch-count", 1000)
        if prefetch < 1:
            raise FrameError(f"prefetch must be at least 1, not {prefetch}",
                             code="bad_header")
        priority = _int_header(h, "activemq.priority", 0)
        self._subs[sub_id] = _Sub(sub_id, ack)
        if ack == "auto":
            self.auto_subs.add(sub_id)
        self._wait(h.get("receipt"), [("r", sub_id)])
        return [Subscribe(sub_id, native_destination(dst, self.session_id),
                          h.get("selector") or None, prefetch, priority)]

    def _unsubscribe(self, f: StompFrame, now: float) -> list:
        h = f.headers
        sub_id = h.get("id") or (h.get("destination") if self.version == "1.0" else None)
        if sub_id is None:
            raise FrameError("UNSUBSCRIBE without an id header", code="bad_frame")
        sub = self._subs.pop(sub_id, None)
        if sub is None:
            raise FrameError(f"no subscription {sub_id!r}", code="no_such_subscription")
        self.auto_subs.discard(sub_id)
        for tag in sub.unacked:
            self._acks.pop(tag, None)
        self._wait(h.get("receipt"), [("r", sub_id)])
        return [Unsubscribe(sub_id)]

    def _ack(self, f: StompFrame, now: float) -> list:
        h = f.headers
        tx = h.get("transaction")
        self._find(f)     # refuse an unknown tag now, not at COMMIT
        if tx is not None:
            self._tx_list(tx).append(f)
            return self._barrier(h.get("receipt"))
        return self._settle(f) + self._barrier(h.get("receipt"))

    def _find(self, f: StompFrame) -> tuple[_Sub, str]:
        """(subscription, ack tag) an ACK / NACK names (1.2: ``id``; 1.0 / 1.1:
        ``message-id`` and, in 1.1, ``subscription``)."""
        h = f.headers
        if self.version == "1.2":
            tag = h.get("id")
            if tag is None:
                raise FrameError(f"{f.command} without an id header", code="bad_frame")
            sub = self._acks.get(tag)
            if sub is None:
                raise FrameError(f"{f.command}: no unacknowledged message with ack id "
                                 f"{tag!r}", code="no_such_message")
            return sub, tag
        msg_id = h.get("message-id")
        if msg_id is None:
            raise FrameError(f"{f.command} without a message-id header", code="bad_frame")
        subs = ([self._subs[h["subscription"]]] if h.get("subscription") in self._subs
                else self._subs.values())
        for sub in subs:
            for tag, mid in sub.unacked.items():
                if mid == msg_id:
                    return sub, tag
        raise FrameError(f"{f.command}: message {msg_id!r} is not unacknowledged here",
                         code="no_such_message")

    def _settle(self, f: StompFrame) -> list:
        sub, tag = self._find(f)
        unacked = sub.unacked
        if sub.ack == "client":
            tags = []
            for t in unacked:
                tags.append(t)
                if t == tag:
                    break
        else:
            tags = [tag]
        msgs = [unacked.pop(t) for t in tags]
        for t in tags:
            self._acks.pop(t, None)
        if f.command == "ACK":
            return [Ack(sub.id, msgs[-1], upto=len(msgs) > 1)]
        return [Nack(sub.id, m) for m in msgs]

    def _begin(self, f: StompFrame, now: float) -> list:
        tx = f.headers.get("transaction")
        if not tx:
            raise FrameError("BEGIN without a transaction header", code="bad_frame")
        if tx in self._tx:
            raise FrameError(f"transaction {tx!r} already begun", code="bad_transaction")
        self._tx[tx] = []
        return self._barrier(f.headers.get("receipt"))

    def _commit(self, f: StompFrame, now: float) -> list:
        frames = self._tx.pop(self._tx_name(f), None)
        out: list = []
        for g in frames:
            if g.command == "SEND":
                out.append(self._to_send(g, now, receipt=True))
            else:
                out += self._settle(g)
        receipt = f.headers.get("receipt")
        if receipt is not None:
            token = self._token()
            self._wait(receipt, [("r", s.id) for s in out if type(s) is Send]
                       + [("p", token)])
            out.append(Ping(token))
        return out

    def _abort(self, f: StompFrame, now: float) -> list:
        self._tx.pop(self._tx_name(f), None)
        return self._barrier(f.headers.get("receipt"))

    def _disconnect(self, f: StompFrame, now: float) -> list:
        self._tx.clear()
        self.state = "closed"
        return self._barrier(f.headers.get("receipt")) + [Bye("DISCONNECT")]

    _HANDLERS = {"SEND": _send, "SUBSCRIBE": _subscribe, "UNSUBSCRIBE": _unsubscribe,
                 "ACK": _ack, "NACK": _ack, "BEGIN": _begin, "COMMIT": _commit,
                 "ABORT": _abort, "DISCONNECT": _disconnect}

    def _tx_name(self, f: StompFrame) -> str:
        tx = f.headers.get("transaction")
        if not tx:
            raise FrameError(f"{f.command} without a transaction header", code="bad_frame")
        if tx not in self._tx:
            raise FrameError(f"{f.command}: no transaction {tx!r} was begun",
                             code="bad_transaction")
        return tx

    def _tx_list(self, tx: str) -> list:
        frames = self._tx.get(tx)
        if frames is None:
            raise FrameError(f"no transaction {tx!r} was begun", code="bad_transaction")
        return frames

    def _token(self) -> int:
        self._next += 1
        return self._next

    def _barrier(self, receipt: str | None) -> list:
        """A Ping whose Pong releases ``receipt`` (nothing without a receipt)."""
        if receipt is None:
            return []
        token = self._token()
        self._wait(receipt, [("p", token)])
        return [Ping(token)]

    def _wait(self, receipt: str | None, keys: list) -> None:
        if receipt is None:
            return
        self._receipts[receipt] = set(keys)
        for key in keys:
            self._waits[key] = receipt

    # ------------------------------------------------------------------ outbound
    def send(self, frame: Any) -> tuple[list[StompFrame], list]:
        """A native frame for this client -> (STOMP frames, native frames to feed back)."""
        kind = type(frame)
        if kind is Deliver:
            return [self.message(frame)], []
        if kind is Receipt:
            return self._confirmed(("r", frame.id)), []
        if kind is Pong:
            return self._confirmed(("p", frame.token)), []
        if kind is Hello:
            return [self._connected(frame)], []
        if kind is Error:
            if frame.ref is not None and frame.code in _RACE_CODES:
                # An ack the session fed back for ack:auto crossed an UNSUBSCRIBE (the
                # core requeued the message already).  Client ACKs never get here: the
                # session refuses unknown tags itself.  Nothing for the client to hear.
                return [], []
            return [self._error(frame)], []
        if kind is Bye:
            return ([] if self.state == "closed" else
                    [self._error(Error("shutdown", frame.reason or "broker closing"))]), []
        return [], []   # Ping (native heart-beats are not used), StatReply: not for STOMP

    def _connected(self, hello: Hello) -> StompFrame:
        self.state = "connected"
        cx, cy = self._client_hb
        sx, sy = self.offer
        # honour the client: we send as often as it wants (cy), and expect what it
        # offers (cx); an offer of ours, when set, is a floor
        send = max(cy, sx, MIN_HEARTBEAT_MS) if cy else 0
        expect = max(cx, sy, MIN_HEARTBEAT_MS) if cx else 0
        self.send_every = send / 1000
        self.expect_every = expect / 1000
        headers = {"version": self.version, "heart-beat": f"{send},{expect}",
                   "server": self.server, "session": self.session_id}
        if self.version == "1.0":
            del headers["version"]   # a 1.0 CONNECTED carries no version header
        return StompFrame("CONNECTED", headers)

    def message(self, d: Deliver) -> StompFrame:
        """The MESSAGE frame for a delivery (client modes: its ack tag is recorded)."""
        prefix = self.session_id
        dst = self._to_stomp.get(d.dst)
        if dst is None:
            dst = stomp_destination(d.dst, prefix)
            if len(self._to_stomp) < _CACHE_SIZE:
                self._to_stomp[d.dst] = dst
        headers = {"subscription": d.sub, "message-id": d.msg, "destination": dst}
        sub = self._subs.get(d.sub)
        if sub is not None and sub.ack != "auto":
            self._next += 1
            tag = str(self._next)
            sub.unacked[tag] = d.msg
            self._acks[tag] = sub
            headers["ack"] = tag
        if d.persistent:
            headers["persistent"] = "true"
        # defaults are left out, as RabbitMQ does: a client parses every header of every
        # message (stomp.py spends about 1.5 us a header), and absent means the default
        if d.priority != 4:
            headers["priority"] = str(d.priority)
        headers["timestamp"] = str(round(d.timestamp * 1000))
        if d.expires:
            headers["expires"] = str(round(d.expires * 1000))
        if d.redelivered:
            headers["redelivered"] = "true"
        if d.reply_to:
            headers["reply-to"] = stomp_destination(d.reply_to, prefix)
        for name, value in d.headers.items():
            if name == "JMSCorrelationID":
                headers["correlation-id"] = _text(value)
            elif name == "JMSType":
                headers["type"] = _text(value)
            elif name not in headers and name != "content-length":
                headers[name] = _text(value)
        return StompFrame("MESSAGE", headers, d.body)

    def _confirmed(self, key: tuple) -> list[StompFrame]:
        receipt = self._waits.pop(key, None)
        if receipt is None:
            return []
        left = self._receipts.get(receipt)
        if left is None:
            return []
        left.discard(key)
        if left:
            return []
        del self._receipts[receipt]
        return [StompFrame("RECEIPT", {"receipt-id": receipt})]

    def _error(self, e: Error) -> StompFrame:
        fatal = self.fatal
        if e.ref is None and fatal is not None and fatal.code == e.code:
            return self.error_frame(fatal)
        self.failed = True
        headers = {"message": f"{e.code}: {e.message}", "content-type": "text/plain"}
        receipt = None
        if e.ref is not None:
            receipt = (self._waits.get(("r", e.ref)))
        if receipt is not None:
            headers["receipt-id"] = receipt
        return StompFrame("ERROR", headers, f"{e.code}: {e.message}\n".encode())

    def error_frame(self, exc: FrameError) -> StompFrame:
        """The ERROR for a refused client frame (the shell closes afterwards)."""
        self.failed = True
        headers = {"message": f"{exc.code}: {exc.message}", "content-type": "text/plain"}
        receipt = getattr(exc, "receipt_id", None)
        if receipt is not None:
            headers["receipt-id"] = receipt
        if exc.code == "bad_version":
            headers["version"] = ",".join(VERSIONS)
        return StompFrame("ERROR", headers, f"{exc.code}: {exc.message}\n".encode())


def _int_header(h: dict, name: str, default: int) -> int:
    text = h.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise FrameError(f"header {name}: {text!r} is not an integer",
                         code="bad_header") from None


def _text(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return ""
    return str(value)
