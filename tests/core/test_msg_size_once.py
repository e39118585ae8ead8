"""A message's size for the memory and limit books is computed once (issue #14).

``records.msg_size`` is asked for at admission and twice at settle (the destination's
bytes and the broker's memory); it sums the header names' lengths each time it computes.
It now keeps the figure in ``Message.nbytes``: one walk of the headers per message, and
the books subtract exactly what they added.
"""

from treefed.core.actions import Out
from treefed.core.broker import Broker
from treefed.core.message import Message
from treefed.core.records import msg_size
from treefed.wire.frames import Ack, Deliver, Send, Subscribe


class CountingHeaders(dict):
    """A headers dict that counts how often its keys are walked."""

    walks = 0

    def __iter__(self):
        CountingHeaders.walks += 1
        return super().__iter__()


def test_headers_are_walked_once_per_message_from_send_to_ack():
    b = Broker("B1", log_messages=False)
    b.handle_frame("c", Subscribe("s", "queue://Q", prefetch=100), 0.0)
    CountingHeaders.walks = 0
    ids = []
    for i in range(10):
        out = b.handle_frame("p", Send("queue://Q", f"m{i}", CountingHeaders(k=i, kk=1)), 0.0)
        ids += [a.frame.msg for a in out if type(a) is Out and type(a.frame) is Deliver]
    assert len(ids) == 10
    assert b.statistics()["memory"]["held_bytes"] > 0
    b.handle_frame("c", Ack("s", ids[-1], upto=True), 1.0)
    # before: 3 walks per message (admission, then d.bytes and _mem at settle)
    assert CountingHeaders.walks == 10
    assert b.statistics()["memory"]["held_bytes"] == 0
    assert b.statistics()["destinations"]["queue://Q"]["bytes"] == 0


def test_kept_size_equals_the_message_size():
    m = Message("m1", "queue://Q", {"a": 1, "bcd": "x"}, b"12345")
    assert m.nbytes == -1
    assert msg_size(m) == m.size == 5 + 64 + (1 + 16) + (3 + 16)
    assert m.nbytes == m.size
    empty = Message("m2", "queue://Q", {}, b"123")
    assert msg_size(empty) == empty.size == 67
