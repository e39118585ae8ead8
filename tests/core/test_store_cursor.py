"""The store cursor and producer flow control (issue #14: broker RSS after a backlog).

Pure core: ``Broker.page_size`` keeps at most that many waiting persistent messages of a
queue in memory, the rest are in the store only (``PageIn`` -> ``page_in``), in order;
``Broker.queue_memory_bytes`` parks a producer's non-persistent send while the queue
holds more bytes in memory.  The shell's side (real SQLite) is tests/node/test_store_cursor.py.
"""

from treefed.core.actions import DeleteMessage, Out, PageIn, Pause, Resume, StoreMessage
from treefed.core.broker import Broker
from treefed.core.message import Message
from treefed.wire.frames import Ack, Deliver, Send, Subscribe

Q = "queue://Q"


def delivered(actions):
    return [a.frame.msg for a in actions if type(a) is Out and type(a.frame) is Deliver]


def page_ins(actions):
    return [a for a in actions if type(a) is PageIn]


class FakeStore:
    """Rows (seq, Message) as the shell's store holds them: every StoreMessage, minus
    every DeleteMessage; ``answer`` serves a PageIn like SqliteStore.load_page."""

    def __init__(self):
        self.rows: list = []
        self.seq = 0

    def apply(self, actions):
        for a in actions:
            if type(a) is StoreMessage:
                m = a.msg
                if any((r.id, r.dst) == (m.id, m.dst) for _, r in self.rows):
                    continue                  # INSERT OR IGNORE on (id, dst)
                self.seq += 1
                self.rows.append((self.seq, Message(m.id, m.dst, dict(m.headers), m.body,
                                                    m.persistent, m.priority, m.timestamp,
                                                    m.expires, m.reply_to, m.path)))
            elif type(a) is DeleteMessage:
                self.rows = [(s, m) for s, m in self.rows if (m.id, m.dst) != (a.msg_id, a.dst)]

    def answer(self, b, a, now=0.0):
        rows = [(s, m) for s, m in self.rows
                if m.dst == a.dst and s > a.after and m.id not in a.exclude]
        got = rows[:a.n]
        out = b.page_in(a.dst, [m for _, m in got], got[-1][0] if got else 0,
                        len(rows) <= a.n, now)
        self.apply(out)
        return out


def run(b, store, actions):
    """Apply ``actions`` to the store, answer its PageIns (after the commit, as the
    shell does) until none are left; returns every action seen."""
    seen = list(actions)
    store.apply(actions)
    todo = page_ins(actions)
    while todo:
        more = store.answer(b, todo.pop(0))
        seen += more
        todo += page_ins(more)
    return seen


def broker(page=3, **kw):
    b = Broker("b1", **kw)
    b.page_size = page
    return b


def send(b, store, i, persistent=True, conn="p"):
    return run(b, store, b.handle_frame(conn, Send(Q, f"m{i}", body=b"x" * 10,
                                                   persistent=persistent), 0.0))


def test_backlog_past_the_page_lives_in_the_store_only():
    b, store = broker(page=3), FakeStore()
    for i in range(10):
        send(b, store, i)
    assert len(store.rows) == 10                      # every message is stored
    assert b.statistics()["destinations"][Q]["depth"] == 10
    assert b.statistics()["stored_only"] == 7
    d = b._dests[Q]
    assert [m.id for m in d.pending] == ["m0", "m1", "m2"]
    assert b._mem == sum(m.nbytes for m in d.pending)   # the rest is not in memory
    assert not b._dups.held.keys() - {"m0", "m1", "m2"}


def test_paged_in_in_order_across_the_page_boundary_exactly_once():
    b, store = broker(page=3), FakeStore()
    for i in range(10):
        send(b, store, i)
    out = run(b, store, b.handle_frame("c", Subscribe("s", Q, prefetch=2), 0.0))
    got = delivered(out)
    while len(got) < 10:
        out = run(b, store, b.handle_frame("c", Ack("s", got[-1], upto=True), 0.0))
        got += delivered(out)
    assert got == [f"m{i}" for i in range(10)]
    run(b, store, b.handle_frame("c", Ack("s", got[-1], upto=True), 0.0))
    assert store.rows == []
    assert b.statistics()["stored_only"] == 0
    assert b._mem == 0 and b._dests[Q].bytes == 0


def test_first_page_leaves_out_the_messages_held_in_memory():
    b, store = broker(page=4), FakeStore()
    for i in range(6):
        send(b, store, i)
    out = b.handle_frame("c", Subscribe("s", Q, prefetch=3), 0.0)
    (p,) = page_ins(out)
    # 3 in flight + 1 waiting are in memory: their rows must not come back as new
    assert p.after == 0 and p.exclude == {"m0", "m1", "m2", "m3"}
    assert p.first == "m4"            # or, cheaper: from the first stored-only one's row


def test_a_new_message_waits_behind_the_stored_ones_even_with_credit_free():
    b, store = broker(page=2), FakeStore()
    for i in range(5):
        send(b, store, i)
    out = b.handle_frame("c", Subscribe("s", Q, prefetch=10), 0.0)
    assert delivered(out) == ["m0", "m1"] and page_ins(out)   # page-in not answered yet
    late = b.handle_frame("p", Send(Q, "m5", persistent=True), 0.0)
    assert delivered(late) == []      # not ahead of m2..m4, which are in the store
    got = delivered(run(b, store, out + late))
    assert got == ["m0", "m1", "m2", "m3", "m4", "m5"]


def test_redelivery_of_paged_in_messages_keeps_order():
    b, store = broker(page=2), FakeStore()
    for i in range(6):
        send(b, store, i)
    got = delivered(run(b, store, b.handle_frame("c1", Subscribe("s", Q, prefetch=4), 0.0)))
    assert got == ["m0", "m1", "m2", "m3"]
    # the consumer goes away without acking: its messages come back first, in order
    out = run(b, store, b.disconnect("c1", 0.0))
    got = delivered(run(b, store, out + b.handle_frame("c2", Subscribe("s", Q, prefetch=10),
                                                       0.0)))
    assert got == ["m0", "m1", "m2", "m3", "m4", "m5"]


def test_withdrawn_spilled_message_leaves_the_books():
    b, store = broker(page=1), FakeStore()
    send(b, store, 0)
    out = b.handle_frame("p", Send(Q, "m1", body=b"y" * 10, persistent=True), 0.0)
    (m1,) = [a.msg for a in out if type(a) is StoreMessage]
    assert m1.spilled
    before = b._dests[Q].bytes
    b.withdraw("m1", Q, 0.0, msg=m1)          # its commit failed: it was never stored
    d = b._dests[Q]
    assert d.spilled == 0 and d.spilled_bytes == 0 and d.bytes == before - m1.nbytes
    assert b.statistics()["destinations"][Q]["depth"] == 1


def test_a_count_the_store_does_not_have_is_put_right_at_its_end():
    # a copy re-sent while its original waits in the store only is one row there
    b, store = broker(page=1), FakeStore()
    for i in range(3):
        send(b, store, i)
    send(b, store, 2)                         # the producer re-sends m2 (lost receipt)
    assert len(store.rows) == 3
    got = []
    out = run(b, store, b.handle_frame("c", Subscribe("s", Q, prefetch=10), 0.0))
    got += delivered(out)
    assert got == ["m0", "m1", "m2"]
    d = b._dests[Q]
    assert d.spilled == 0 and Q not in {x.name for x in b._spilling}
    run(b, store, b.handle_frame("c", Ack("s", "m2", upto=True), 0.0))
    assert d.bytes == 0 and store.rows == []


def test_page_size_zero_keeps_everything_in_memory():
    b, store = broker(page=0), FakeStore()
    for i in range(10):
        send(b, store, i)
    assert len(b._dests[Q].pending) == 10


def test_non_persistent_sends_wait_while_the_queue_memory_is_over_its_limit():
    b = broker(page=0)
    b.queue_memory_bytes = 250            # a message here is 74 bytes: 3 may wait
    b.handle_frame("c", Subscribe("s", Q, prefetch=1), 0.0)
    paused = False
    for i in range(6):
        out = b.handle_frame("p", Send(Q, f"n{i}", body=b"x" * 10), 0.0)
        paused = paused or any(type(a) is Pause for a in out)
    assert paused
    assert [m.id for m in b._dests[Q].pending] == ["n1", "n2", "n3"]   # n0 was given
    out = b.handle_frame("c", Ack("s", "n0"), 0.0)
    # room for two (what consumers were given does not count): n4 goes in, n5 waits
    assert delivered(out) == ["n1"]
    assert not any(type(a) is Resume for a in out)
    assert [m.id for m in b._dests[Q].pending] == ["n2", "n3", "n4"]
    out = b.handle_frame("c", Ack("s", "n1"), 0.0)
    assert delivered(out) == ["n2"]
    assert any(type(a) is Resume for a in out)   # all parked sends went in, in order
    assert [m.id for m in b._dests[Q].pending] == ["n3", "n4", "n5"]


def test_without_a_consumer_non_persistent_sends_are_not_held_back():
    # nobody takes them: they wait in memory up to max_memory_bytes, as before
    b = broker(page=0)
    b.queue_memory_bytes = 100
    for i in range(5):
        out = b.handle_frame("p", Send(Q, f"n{i}", body=b"x" * 10), 0.0)
        assert not any(type(a) is Pause for a in out)
    assert len(b._dests[Q].pending) == 5


def test_flow_control_never_pauses_a_connection_that_consumes_the_queue():
    b = broker(page=0)
    b.queue_memory_bytes = 100
    b.handle_frame("pc", Subscribe("s", Q, prefetch=1), 0.0)
    for i in range(5):
        out = b.handle_frame("pc", Send(Q, f"n{i}", body=b"x" * 10), 0.0)
        assert not any(type(a) is Pause for a in out)


def test_persistent_sends_are_not_flow_controlled():
    b, store = broker(page=2), FakeStore()
    b.queue_memory_bytes = 100
    for i in range(8):
        out = b.handle_frame("p", Send(Q, f"m{i}", body=b"x" * 10, persistent=True), 0.0)
        assert not any(type(a) is Pause for a in out)


def test_sends_held_by_flow_control_go_in_when_their_producer_closes():
    # a producer flushed, said goodbye and closed while its sends waited for room:
    # they were read (they are in memory already) and are taken, in order, not lost
    b = broker(page=0)
    b.queue_memory_bytes = 150
    b.handle_frame("c", Subscribe("s", Q, prefetch=1), 0.0)
    for i in range(5):
        b.handle_frame("p", Send(Q, f"n{i}", body=b"x" * 10), 0.0)
    assert [m.id for m in b._dests[Q].pending] == ["n1", "n2"]
    b.disconnect("p", 0.0)
    assert [m.id for m in b._dests[Q].pending] == ["n1", "n2", "n3", "n4"]
    assert b.statistics()["parked"] == 0
