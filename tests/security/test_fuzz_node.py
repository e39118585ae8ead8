"""Issue #12: a stateful fuzz test of one broker node (hypothesis).

A ``RuleBasedStateMachine`` drives a real ``BrokerNode`` -- a region with
authentication, permissions and tree confinement, an in-memory store -- with random
frame sequences from client connections (three users) and from child brokers (tree
links ``s1``, ``s2``), including raw CBOR with out-of-range values and garbage bytes.
Every input goes the way the node's reader sends it: bytes through a ``FrameDecoder``,
then ``BrokerNode._handle_batch`` (hello, guard, site, commit, containment), one batch
per step; what the node queues for each connection is read from that connection's
outgoing list, as its writer would.

Invariants, checked after every step:

* no crash: ``_handle_batch`` never raises, and no connection is ever closed with
  ``internal_error`` (containment hides a bug from users, not from this test);
* no confirmed loss: a persistent queue message a client got a Receipt for is in the
  store until a Deliver or Forward of it has been handed to someone;
* no delivery outside permissions: a client only gets Deliver frames of destinations
  its user may read, a child link only Forward frames its user may read.
"""

from __future__ import annotations

import shutil
import struct
import tempfile
from pathlib import Path

import cbor2
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from treefed.config import parse_config
from treefed.errors import FrameError
from treefed.node import BrokerNode
from treefed.node.node import _CLIENT, _EOF, _Conn
from treefed.persistence import SqliteStore
from treefed.security.passwords import hash_password
from treefed.wire.codec import FrameDecoder, encode
from treefed.wire.frames import (PROTOCOL_VERSION, Ack, Advisory, Bye, Deliver, Error,
                                 Forward, ForwardAck, Hello, Nack, Ping, Receipt, Send,
                                 StatRequest, Subscribe, Unsubscribe)
from treefed.wire.ids import original

PW = hash_password("pw", n=2 ** 4)


def region_config(data_dir) -> object:
    return parse_config({
        "broker": {"id": "region", "data_dir": str(data_dir),
                   "listen": ["tcp://127.0.0.1:0"], "heartbeat_interval": 0.0,
                   "max_redeliveries": 2},
        "logging": {"level": "error"},
        "security": {
            "authentication": True,
            "user": [{"name": "s1", "password_hash": PW, "groups": ["stores", "brokers"]},
                     {"name": "s2", "password_hash": PW, "groups": ["stores", "brokers"]},
                     {"name": "hq-app", "password_hash": PW, "groups": ["hq"]}],
            "permission": [
                {"principal": "group:stores",
                 "read": ["queue://Store.{user}.>", "topic://Broadcast.>"],
                 "write": ["queue://HQ.>", "queue://Store.>"]},
                {"principal": "group:hq", "read": ["queue://HQ.>"],
                 "write": ["queue://Store.>", "topic://Broadcast.>"]},
            ],
            "tree": {"confine_children": True,
                     "child_patterns": ["queue://Store.{child}.>"],
                     "broadcast": ["topic://Broadcast.>"],
                     "upward": ["queue://HQ.>", "queue://Store.>"]},
        },
    })


#: who connects: (name, user, role); links are tree leaves named after their user
PEERS = [("c-s1", "s1", "client"), ("c-s2", "s2", "client"), ("c-hq", "hq-app", "client"),
         ("L-s1", "s1", "broker"), ("L-s2", "s2", "broker")]

DESTINATIONS = ["queue://Store.s1.a", "queue://Store.s2.a", "queue://Store.s1.b",
                "queue://HQ.x", "queue://Other", "topic://Broadcast.p", "topic://Other",
                "queue://Store.>", "queue://Store.*.a", ">", "queue://DLQ"]
names = st.sampled_from(["m1", "m2", "m3", "", "x"])          # message ids
subs = st.sampled_from(["s1", "s2", "s3"])                      # subscription ids
#: mostly destinations someone may use, so traffic flows; the rest probes refusals
USED = ["queue://Store.s1.a", "queue://Store.s2.a", "queue://HQ.x", "topic://Broadcast.p"]
dsts = st.one_of(st.sampled_from(USED), st.sampled_from(USED), st.sampled_from(DESTINATIONS))
brokers = st.lists(st.sampled_from(["s1", "s2", "region", "hq", "zz"]), max_size=3)

sends = st.builds(Send, dst=dsts, id=names, body=st.binary(max_size=8),
                  persistent=st.booleans(), priority=st.integers(0, 9),
                  receipt=st.booleans())
subscribes = st.builds(Subscribe, id=subs, dst=dsts,
                       selector=st.sampled_from([None, None, "a IS NULL", "a >"]),
                       prefetch=st.sampled_from([1, 2, 3, 0]), priority=st.integers(-3, 3))
client_frames = st.one_of(
    sends, sends, sends, subscribes, subscribes,
    st.builds(Unsubscribe, id=subs),
    st.builds(Ack, sub=subs, msg=names, upto=st.booleans()),
    st.builds(Nack, sub=subs, msg=names),
    st.builds(StatRequest, what=st.sampled_from(["all", "summary", "links", "bogus"]),
              match=st.sampled_from([None, "queue://Store.>", "queue://a..b"])),
    st.builds(Ping, token=st.integers(0, 5)),
    st.builds(Forward, dst=dsts, id=names, path=brokers, persistent=st.booleans(),
              redelivered=st.one_of(st.integers(0, 3), st.integers(0, 2 ** 64 - 1))),
    st.builds(Advisory, kind=st.sampled_from(["add", "remove"]), consumer=names, dst=dsts,
              origin=st.sampled_from(["s1", "zz"]), path=brokers),
)
link_frames = st.one_of(
    st.builds(Advisory, kind=st.sampled_from(["add", "remove", "bogus"]), consumer=names,
              dst=dsts, origin=st.sampled_from(["s1", "s2", "zz"]),
              selector=st.sampled_from([None, "a = 1", "("]),
              priority=st.integers(-3, 3), path=brokers),
    st.builds(Forward, dst=dsts, id=names, path=brokers, body=st.binary(max_size=8),
              persistent=st.booleans(), priority=st.integers(0, 9),
              redelivered=st.integers(0, 3)),
    st.builds(ForwardAck, ids=st.lists(names, max_size=3)),
    st.builds(Send, dst=dsts, id=names, persistent=st.booleans(), receipt=st.booleans()),
    st.builds(Ping, token=st.integers(0, 5)),
    st.builds(StatRequest),
    st.builds(Error, code=st.sampled_from(["bad_frame", "x"]), message=st.just("m"),
              ref=st.sampled_from([None, "m1"])),
)
#: raw CBOR items: frame-shaped arrays with hostile values, and anything else
hostile_values = st.one_of(st.integers(-(2 ** 64), 2 ** 64 - 1),
                           st.floats(allow_nan=True, allow_infinity=True),
                           st.text(max_size=3), st.none(), st.booleans(),
                           st.lists(st.text(max_size=2), max_size=2))
raw_items = st.one_of(
    st.builds(lambda code, rest: [code, *rest], st.sampled_from([2, 3, 5, 7, 9, 20, 21, 22, 30]),
              st.lists(hostile_values, max_size=12)),
    hostile_values)


def raw(item: object) -> bytes:
    body = cbor2.dumps(item)
    return struct.pack(">I", len(body)) + body


class NodeMachine(RuleBasedStateMachine):
    """One region node and its peers (see the module doc)."""

    @initialize()
    def start(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="treefed-fuzz-")
        self.store = SqliteStore(Path(self.tmp) / "data")
        self.node = BrokerNode(region_config(Path(self.tmp) / "data"), store=self.store)
        self.conns: dict[str, _Conn] = {}
        self.decoders: dict[str, FrameDecoder] = {}
        self.handed: set[str] = set()        # msg ids a Deliver/Forward went out for
        self.confirmed: set[tuple] = set()   # (id, body) of receipted persistent queue sends
        self.sent: dict[str, list] = {}      # conn name -> persistent sends awaiting receipt
        self.delivered: dict[str, list] = {}   # conn name -> (sub, msg) delivered
        self.history: dict[str, list] = {}     # conn name -> its persistent sends
        self.forwarded: dict[str, list] = {}   # link name -> ids forwarded, not acked
        self.serial = 0
        for name, _, _ in PEERS:
            self._open(name)

    # -- plumbing
    def _open(self, name: str) -> None:
        user, role = next((u, r) for n, u, r in PEERS if n == name)
        node = self.node

        async def make() -> _Conn:
            c = _Conn(node._new_id(), None, "127.0.0.1:1", None)
            c.user = user
            node._conns[c.id] = c
            return c

        c = trio.run(make)
        self.conns[name] = c
        self.decoders[name] = FrameDecoder()
        self.sent[name] = []
        hello = (Hello(PROTOCOL_VERSION, "client") if role == "client" else
                 Hello(PROTOCOL_VERSION, "broker", broker_id=user, connector="tree",
                       node_type="leaf", ancestry=[], link_name="tree"))
        self._feed(name, encode(hello))

    def _feed(self, name: str, data: bytes) -> None:
        c = self.conns[name]
        if c.closing or c.dead:      # closed on it: it reconnects, as clients do
            self.delivered.pop(name, None)
            self.forwarded.pop(name, None)
            self._open(name)
            c = self.conns[name]
        decoder = self.decoders[name]
        try:
            decoder.receive_data(data)
            payload: object = list(decoder.frames())
        except FrameError as exc:
            payload = exc
        if payload == []:
            return
        if type(payload) is list and c.kind is _CLIENT:
            for f in payload:
                if type(f) is Send and f.persistent and f.receipt \
                        and f.dst.startswith("queue://"):   # what is stored
                    self.sent[name].append((f.id, f.body))
        trio.run(self.node._handle_batch, [(c, payload)], None)   # must not raise
        self._collect()

    def _collect(self) -> None:
        """Take every conn's queued frames (as its writer would) and check them."""
        authz = self.node._authz
        for name, c in self.conns.items():
            out, c.out = c.out, []
            user = c.user
            for f in out:
                kind = type(f)
                assert not (kind is Error and f.code == "internal_error"), \
                    f"{name}: contained exception: {f.message}"
                if kind is Deliver:
                    self.handed.add((original(f.msg), f.body))
                    self.delivered.setdefault(name, []).append((f.sub, f.msg))
                    assert authz.check(user, "read", f.dst), \
                        f"{name} ({user}) got {f.dst} it may not read"
                elif kind is Forward:
                    self.handed.add((original(f.id), f.body))
                    self.forwarded.setdefault(name, []).append(f.id)
                    assert authz.check(user, "read", f.dst), \
                        f"link {name} ({user}) was forwarded {f.dst} it may not read"
                elif kind is Receipt:
                    # a persistent send's receipt (unscoped for the client): confirmed
                    # the oldest send of that id awaiting its answer (answers come
                    # in order)
                    pending = self.sent[name]
                    hit = next((s for s in pending if s[0] == f.id), None)
                    if hit is not None:
                        self.confirmed.add(hit)
                        pending.remove(hit)
                elif kind is Error and f.ref is not None:
                    pending = self.sent[name]
                    hit = next((s for s in pending if s[0] == f.ref), None)
                    if hit is not None:
                        pending.remove(hit)

    # -- rules
    def _fresh(self, who: str, frame):
        """A producer gives every message its own id (as the client library does);
        reusing one id for another message is the producer's own mistake, not an
        attack (``client_resends`` covers an honest resend)."""
        if type(frame) is Send:
            self.serial += 1
            frame.id = f"m{self.serial}"
            if frame.persistent:
                self.history.setdefault(who, []).append(frame)
        return frame

    @rule(who=st.sampled_from(["c-s1", "c-s2", "c-hq"]), frame=client_frames)
    def client_sends(self, who: str, frame) -> None:
        self._feed(who, encode(self._fresh(who, frame)))

    @rule(who=st.sampled_from(["c-s1", "c-s2", "c-hq"]), frames=st.lists(sends, max_size=4),
          sub=subscribes)
    def client_subscribes_and_sends(self, who: str, frames, sub) -> None:
        """A burst in one read: one batch (and one commit) for several frames."""
        self._feed(who, b"".join(encode(self._fresh(who, f)) for f in [sub, *frames]))

    @rule(who=st.sampled_from(["c-s1", "c-s2", "c-hq"]), pick=st.integers(0, 1000))
    def client_resends(self, who: str, pick: int) -> None:
        """A producer re-sends an earlier persistent message (its receipt was lost)."""
        history = self.history.get(who)
        if history:
            self._feed(who, encode(history[pick % len(history)]))

    @rule(who=st.sampled_from(["L-s1", "L-s2"]), frame=link_frames)
    def link_sends(self, who: str, frame) -> None:
        self._feed(who, encode(frame))

    @rule(who=st.sampled_from(["L-s1", "L-s2"]), kind=st.sampled_from(["add", "remove"]),
          dst=st.sampled_from(["queue://Store.{}.a", "topic://Broadcast.p", "queue://HQ.x"]))
    def child_advertises(self, who: str, kind: str, dst: str) -> None:
        """A child store's consumer appears or goes (within its scope or not)."""
        store = who[2:]
        self._feed(who, encode(Advisory(kind, f"{store}/c1/s1", dst.format(store), store)))

    @rule(who=st.sampled_from(["L-s1", "L-s2"]))
    def child_acks_forwards(self, who: str) -> None:
        """A child took (stored) what it was forwarded."""
        ids = self.forwarded.pop(who, [])
        if ids:
            self._feed(who, encode(ForwardAck(ids)))

    @rule(who=st.sampled_from([p[0] for p in PEERS]),
          data=st.one_of(raw_items.map(raw), st.binary(min_size=1, max_size=12)))
    def hostile_bytes(self, who: str, data: bytes) -> None:
        self._feed(who, data)

    @rule(who=st.sampled_from(["c-s1", "c-s2", "c-hq"]))
    def consumer_acks_what_it_got(self, who: str) -> None:
        """A well-behaved consumer: acks the last message of each subscription."""
        last = dict(self.delivered.pop(who, []))
        for sub, msg in last.items():
            self._feed(who, encode(Ack(sub, msg, True)))

    @rule(who=st.sampled_from([p[0] for p in PEERS]), how=st.booleans())
    def leaves(self, who: str, how: bool) -> None:
        """Says bye, or vanishes (EOF); it comes back with its next frame."""
        if how:
            self._feed(who, encode(Bye("done")))
            return
        c = self.conns[who]
        if not c.dead:
            trio.run(self.node._handle_batch, [(c, _EOF)], None)
        self._collect()

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    @rule(who=st.sampled_from(["c-s1", "c-s2", "c-hq"]), victim=st.sampled_from(
        ["c-s1", "c-s2", "c-hq"]), pick=st.integers(0, 1000))
    def client_squats(self, who: str, victim: str, pick: int) -> None:
        """A producer sends its own message under an id another producer used."""
        history = self.history.get(victim)
        if history and who != victim:   # reusing one's own id is not squatting
            f = history[pick % len(history)]
            if any(h.id == f.id and h.dst == f.dst for h in self.history.get(who, ())):
                return   # it used that id there itself already
            self.serial += 1
            squat = Send(f.dst, f.id, body=f"squat-{self.serial}".encode(),
                         persistent=True, receipt=True)
            self.history.setdefault(who, []).append(squat)
            self._feed(who, encode(squat))

    # -- invariants
    @invariant()
    def no_confirmed_loss(self) -> None:
        if not hasattr(self, "node"):
            return
        stored = {(original(m.id), m.body) for m in self.node.store.load()}
        for msg in self.confirmed:
            assert msg in stored or msg in self.handed, \
                f"confirmed {msg!r} is neither stored nor handed to anyone"


NodeMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestNodeFuzz = NodeMachine.TestCase
