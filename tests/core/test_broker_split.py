"""Issue 18 part 1: core/broker.py split along its seams -- records, dispatch, flow control,
duplicate tracking -- with Broker as the facade.  The split modules are pure (no I/O, no
mutable module state) and their public surfaces answer as documented."""

import ast
import importlib
from pathlib import Path

import pytest

import treefed.core
from tests.federation.test_structure import FORBIDDEN, module_containers, modules
from treefed.core import dispatch, duplicates, flow, records
from treefed.core.broker import Broker
from treefed.core.policy import DestinationPolicy
from treefed.core.records import Conn, Consumer, Dest
from treefed.errors import LimitError
from treefed.wire.frames import Ack, Forward, Send, Subscribe

SPLIT = ("broker", "records", "dispatch", "flow", "duplicates")
CORE = Path(treefed.core.__file__).parent


class TestPurity:
    def test_the_purity_checks_cover_the_split_modules(self):
        """test_structure's purity tests walk every core module, the new ones included."""
        names = {m.__name__ for m in modules("core")}
        assert {f"treefed.core.{n}" for n in SPLIT} <= names
        assert {f"{n}.py" for n in SPLIT} <= {p.name for p in CORE.glob("*.py")}

    @pytest.mark.parametrize("name", SPLIT)
    def test_split_module_imports_no_io(self, name):
        tree = ast.parse((CORE / f"{name}.py").read_text(encoding="utf-8"))
        found = [n for node in ast.walk(tree)
                 for n in ([a.name for a in node.names] if isinstance(node, ast.Import) else
                           [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                 if n.split(".")[0] in FORBIDDEN]
        assert found == []

    @pytest.mark.parametrize("name", SPLIT)
    def test_split_module_holds_no_mutable_state(self, name):
        """No dict/list/set at module level but the documented shared empties, and those
        are empty (records.NO_PENDING is a deque: checked too)."""
        mod = importlib.import_module(f"treefed.core.{name}")
        shared = (records.NO_MESSAGES, records.NO_DESTS)
        found = {k for k, v in module_containers(mod).items()
                 if not any(v is e for e in shared)}
        assert found == set()
        assert records.NO_MESSAGES == {} and records.NO_DESTS == {} and not records.NO_PENDING

    @pytest.mark.parametrize("mod", [records, dispatch, flow, duplicates])
    def test_public_surface_is_declared(self, mod):
        """Each split module names its public surface in __all__ and documents it."""
        assert mod.__all__ and all(hasattr(mod, n) for n in mod.__all__)
        assert "Public surface" in mod.__doc__


def _dest(name="queue://Q", **policy):
    return Dest(name, DestinationPolicy(**policy))


def _consumer(cs, sub, *, peer=None, prefetch=1, priority=0, fallback=False, seq=0):
    return Consumer(cs, sub, "queue://Q", None, prefetch, priority, peer, -1, fallback,
                    False, f"B/{cs.name}/{sub}", seq)


class TestDispatch:
    def test_pick_tells_waiting_from_nobody(self):
        """No eligible regular consumer: NOBODY (the message may rest); one without
        credit: WAIT; one with credit: its index."""
        d = _dest()
        m = records_message("m1")
        assert dispatch.pick(d, m, 0.0) == dispatch.NOBODY
        c = _consumer(Conn("c1"), "s1")
        d.consumers = [c]
        assert dispatch.pick(d, m, 0.0) == 0
        c.inflight = {"other": records_message("other")}
        assert dispatch.pick(d, m, 0.0) == dispatch.WAIT

    def test_fallback_only_when_no_regular_consumer_is_eligible(self):
        d = _dest()
        m = records_message("m1", path=("A",))
        up = _consumer(Conn("L:up"), "f", peer="P", fallback=True, seq=1)
        back = _consumer(Conn("L:A"), "d", peer="A", seq=2)   # the message came from A
        d.consumers, d.fallbacks = [back, up], 1
        assert dispatch.pick(d, m, 0.0) == 1
        assert not dispatch.eligible(back, m, d, 0.0)

    def test_take_rotates_within_the_level(self):
        cs = Conn("c")
        a, b, hi = (_consumer(cs, "a", seq=1), _consumer(cs, "b", seq=2),
                    _consumer(cs, "h", priority=5, seq=0))
        d = _dest()
        d.consumers = [hi, a, b]
        assert dispatch.take(d, 1) is a
        assert d.consumers == [hi, b, a]

    def test_fanout_one_copy_per_link(self):
        d = _dest("topic://T")
        link = Conn("L:X")
        d.consumers = [_consumer(link, "d1", peer="X"), _consumer(link, "d2", peer="X",
                                                                  seq=1)]
        assert [c.sub_id for c in dispatch.fanout(d, records_message("m", "topic://T"),
                                                  0.0)] == ["d1"]


def records_message(msg_id, dst="queue://Q", path=()):
    from treefed.core.message import Message
    return Message(msg_id, dst, {}, b"x", False, 4, 0.0, 0.0, None, path)


class TestFlow:
    def test_verdicts(self):
        d = _dest(max_messages=1)
        assert flow.limit_verdict(d, 10) == flow.ADMIT        # empty: always one
        d.inflight = 1
        assert flow.limit_verdict(d, 10) == flow.BLOCK
        d.policy = DestinationPolicy(max_messages=1, limit_behaviour="drop_oldest")
        assert flow.limit_verdict(d, 10) == flow.DROP_OLDEST
        d.policy = DestinationPolicy(max_messages=1, limit_behaviour="reject_newest")
        with pytest.raises(LimitError):
            flow.limit_verdict(d, 10)
        with pytest.raises(LimitError):
            flow.limit_verdict(_dest(max_message_bytes=5), 10)

    def test_blocked_connection_released_when_room(self):
        blocked, d, cs = flow.Blocked(), _dest(max_messages=1), Conn("p")
        d.inflight = 1
        blocked.block(cs, d)
        blocked.note_room(d)
        assert list(blocked.released()) == []          # still full: stays blocked
        d.inflight = 0
        blocked.note_room(d)
        assert list(blocked.released()) == [cs] and cs.blocked_on is None

    def test_conn_limits(self):
        cs = Conn("c")
        cs.credit = 90
        with pytest.raises(LimitError):
            flow.check_conn_limits(cs, 20, 0, 100)
        flow.check_conn_limits(cs, 10, 0, 100)


class TestDuplicates:
    def test_mesh_link_remembers_ids_tree_link_only_held(self):
        dups = duplicates.Duplicates(10)
        assert dups.check_forward("m", "queue://Q", 1, False) == (False, "m")
        dups.remember("m")
        assert dups.check_forward("m", "queue://Q", 1, False)[0]
        assert dups.check_forward("m", "queue://Q", 1, True) == (False, None)
        dups.hold("m")
        assert dups.check_forward("m", "queue://Q", 3, True)[0]
        assert dups.check_forward("t", "topic://T", 2, True) == (False, "t#2")

    def test_windows_keep_the_newest(self):
        dups = duplicates.Duplicates(2)
        for i in range(3):
            dups.consume(f"m{i}")
        assert not dups.known("m0") and dups.known("m2")
        dups.restore(["a", "b", "c"])
        assert set(dups.consumed) == {"b", "c"}

    def test_hold_counts_copies(self):
        dups = duplicates.Duplicates(0)
        dups.hold("m")
        dups.hold("m")
        dups.release("m")
        assert dups.known("m")
        dups.release("m")
        assert not dups.known("m")


class TestFacade:
    def test_broker_behaves_through_the_facade(self):
        """One trip through every seam via Broker's entry points: a blocked producer is
        resumed by an ack, and a re-forwarded copy is a duplicate."""
        from treefed.core.policy import PolicySet
        b = Broker("B", PolicySet([("queue://Q", DestinationPolicy(max_messages=1))]))
        b.handle_frame("c", Subscribe("s", "queue://Q", prefetch=5), 0.0)
        b.handle_frame("p", Send("queue://Q", "m1"), 0.0)
        out = b.handle_frame("p", Send("queue://Q", "m2"), 0.0)
        assert [type(a).__name__ for a in out] == ["Pause"]
        out = b.handle_frame("c", Ack("s", "m1"), 0.0)
        assert "Resume" in [type(a).__name__ for a in out]
        b.connect("L:X", 0.0)
        b.accept_forward("L:X", Forward("queue://R", "f1", ["X"]), 0.0)
        b.accept_forward("L:X", Forward("queue://R", "f1", ["X"]), 0.0)
        assert b.statistics()["dropped"] == {"duplicate": 1}
        assert b.dedup_window == 100_000
