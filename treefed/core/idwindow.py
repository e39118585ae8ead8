"""A compact window of the newest message ids: membership without an object per id.

Theory of operation
-------------------
Duplicate suppression (core/duplicates.py) remembers the newest ``window`` ids (100,000 by
default).  Held as a ``set`` of ``str`` plus a ``deque``, that is ~160 bytes per id --
~16 MiB -- of small objects allocated while messages flow, so every pymalloc arena of a
busy spell keeps a survivor and the heap a 100,000-message run grew to stays resident
after it (issue #14: 94-98 MiB after the runs).

Almost every id is a producer's ``<producer>:<seq>`` (treefed's client numbers its sends;
``seq`` decimal, no leading zero), which the broker holds scoped as
``<producer>:<seq>\x1f<scope>`` (wire/ids.py).  ``IdWindow`` keeps those as one bit per sequence
number in a ``bytearray`` per producer (``_bits[slot]``, bit 0 = ``_base[slot]``), and the
order they came in as two ``array('q')`` (producer slot, seq) -- plain buffers, no object
per id.  Anything else (STOMP ids, ``id#hops`` topic keys, or a producer whose window of
sequence numbers is too sparse to pay for a bitmap: more than ``_SLACK`` bytes beyond
8 bytes per id it holds) is kept as before, in a ``set`` with its own ``deque``; the order
array marks those entries with slot -1.  Membership is exact in both forms.

The oldest entry leaves once more than ``window`` were added (``add`` of an id already
present adds nothing).  ``discard`` removes an id at once; its entry in the order still
counts until it leaves, as with the set + deque it replaces.

Public surface: ``IdWindow`` -- ``add``, ``discard``, ``in``, ``len``, iteration (oldest
first).  Pure: no I/O.
"""

from __future__ import annotations

import re
from array import array
from collections import Counter, deque
from typing import Iterator

from treefed.wire.ids import SCOPE_SEP

__all__ = ["IdWindow"]

#: Bytes a producer's bitmap may hold beyond 8 per remembered id (else: string form).
_SLACK = 512
#: Leading all-zero bytes a bitmap sheds at once (amortises the memmove).
_SHED = 256


#: The last split's ``(head, tail, key)``: ``head`` = ``<producer>:``, ``tail`` =
#: ``\x1f<scope>`` or "" (see ``_split``).  None until the first id of that form.
_last: tuple[str, str, str] | None = None


#: a ``seq`` as ``_split_full`` accepts it: ASCII digits, at most 18, no leading zero
_seq = re.compile(r"0|[1-9][0-9]{0,17}").fullmatch


def _split(msg_id: str) -> tuple[str, int] | None:
    """``(key, seq)`` when ``msg_id`` is ``<producer>:<seq>`` or, as a broker holds a
    client's id, ``<producer>:<seq>\x1f<scope>`` (wire/ids.py ``qualify``), exactly;
    else None.  ``key`` is ``<producer>\0`` + ``\x1f<scope>`` if scoped (``_join``).

    Consecutive ids are mostly one producer's (one scope): an id that is the last split
    id's ``head`` + digits + ``tail`` gets the same key object without a parse (the
    digits hold no ``:`` or ``\x1f``, so both rpartitions would cut where they did for
    the last id; the key's hash is cached in the str).  Equal to ``_split_full``
    (tests/core/test_idwindow_split.py)."""
    last = _last
    if last is not None:
        head, tail, key = last
        if msg_id.startswith(head) and msg_id.endswith(tail):
            s = msg_id[len(head):len(msg_id) - len(tail)]
            if _seq(s):   # the digits test below, as one C call (issue #14)
                return key, int(s)
    return _split_full(msg_id)


def _split_full(msg_id: str) -> tuple[str, int] | None:
    """``_split`` by parsing ``msg_id``; remembers the result's head and tail."""
    global _last
    body, scoped, scope = msg_id.rpartition(SCOPE_SEP)
    if not scoped:
        body = msg_id
    p, sep, s = body.rpartition(":")
    if not sep or not s.isascii() or not s.isdigit() or len(s) > 18 \
            or (s[0] == "0" and len(s) > 1) or "\0" in p:
        return None
    key = f"{p}\0{SCOPE_SEP}{scope}" if scoped else f"{p}\0"
    _last = (f"{p}:", f"{SCOPE_SEP}{scope}" if scoped else "", key)
    return key, int(s)


def _join(key: str, seq: int) -> str:
    """The id ``_split`` took apart."""
    p, _, rest = key.partition("\0")
    return f"{p}:{seq}{rest}"


class IdWindow:
    """The newest ``window`` ids, oldest leaving first (see the module docstring)."""

    __slots__ = ("window", "_slots", "_names", "_bits", "_base", "_count", "_refs", "_free",
                 "_ring_p", "_ring_s", "_head", "_other", "_other_order", "_live")

    def __init__(self, window: int) -> None:
        self.window = window
        self._slots: dict[str, int] = {}     # producer -> slot
        self._names: list[str | None] = []   # slot -> producer
        self._bits: list[bytearray | None] = []
        self._base: list[int] = []           # seq of bit 0 (a multiple of 8)
        self._count: list[int] = []          # ids set in the bitmap
        self._refs: list[int] = []           # entries of the order naming the slot
        self._free: list[int] = []
        self._ring_p = array("q")            # order: slot, -1 = string form
        self._ring_s = array("q")            # order: seq
        self._head = 0
        self._other: set[str] = set()
        self._other_order: deque[str] = deque()
        self._live = 0                        # ids present (len)

    # ------------------------------------------------------------------ queries

    def __contains__(self, msg_id: str) -> bool:
        if not self._live:
            return False      # e.g. a relay broker's consumed window: no local consumer
        if msg_id in self._other:
            return True
        ps = _split(msg_id)
        if ps is None:
            return False
        slot = self._slots.get(ps[0])
        if slot is None:
            return False
        off = ps[1] - self._base[slot]
        bits = self._bits[slot]
        return 0 <= off < 8 * len(bits) and bool(bits[off >> 3] & (1 << (off & 7)))

    def __len__(self) -> int:
        return self._live

    def __iter__(self) -> Iterator[str]:
        others = iter(self._other_order)
        rp, rs = self._ring_p, self._ring_s
        done: set[str] = set()   # an id discarded and added again has two entries
        for i in range(self._head, len(rp)):
            slot = rp[i]
            msg_id = next(others) if slot < 0 else _join(self._names[slot], rs[i])
            if msg_id not in done and msg_id in self:
                done.add(msg_id)
                yield msg_id

    # ------------------------------------------------------------------ changes

    def add(self, msg_id: str) -> None:
        if self.window <= 0 or msg_id in self._other:
            return
        ps = _split(msg_id)   # once: ``in self`` would split it again
        if ps is not None:
            done = self._set_bit(ps[0], ps[1])
            if done is None:
                return        # present already
        if ps is None or not done:
            self._other.add(msg_id)
            self._other_order.append(msg_id)
            self._ring_p.append(-1)
            self._ring_s.append(0)
        self._live += 1
        if len(self._ring_p) - self._head > self.window:
            self._evict()

    def add_many(self, ids: list[str]) -> None:
        """``add`` of each id in turn, with the same result (order, evictions).  A
        store's consumer acks a run of messages per Ack frame; per id, ``add`` +
        ``_split`` + ``_set_bit`` cost ~220 bytecodes of calls and re-reads (issue #14).
        Here, while no eviction can fall inside the run, the usual id -- the last split
        producer's (``_split``'s fast path, inline), inside its bitmap -- sets its bit
        inline and its order entries and counts are added once per stretch; anything
        else goes through ``add``, after the stretch before it."""
        window = self.window
        if window <= 0:
            return
        if len(self._ring_p) - self._head + len(ids) > window or _last is None:
            for msg_id in ids:   # evictions inside the run: strictly one by one
                self.add(msg_id)
            return
        other, slots, bases, maps = self._other, self._slots, self._base, self._bits
        count = self._count
        new_p: list[int] = []
        new_s: list[int] = []
        head, tail, key = _last
        cut = len(tail)
        start = len(head)
        for msg_id in ids:
            if other and msg_id in other:
                continue   # held in string form: present (``add`` does nothing)
            if msg_id.startswith(head) and msg_id.endswith(tail):
                digits = msg_id[start:len(msg_id) - cut]
                slot = slots.get(key)
                if slot is not None and _seq(digits):
                    seq = int(digits)
                    off = seq - bases[slot]
                    bits = maps[slot]
                    i = off >> 3
                    n = len(bits)
                    if 0 <= i < n:
                        mask = 1 << (off & 7)
                        if not bits[i] & mask:
                            bits[i] |= mask
                            new_p.append(slot)
                            new_s.append(seq)
                        continue
                    if i == n and n < 8 * count[slot] + 8 + _SLACK:
                        # the next byte, as ``_set_bit`` grows it (its room test holds
                        # already with the count before this stretch)
                        bits.append(1 << (off & 7))
                        new_p.append(slot)
                        new_s.append(seq)
                        continue
            if new_p:
                self._took(new_p, new_s)
                new_p, new_s = [], []
            self.add(msg_id)   # the general path (it may make a new ``_last``)
            if _last is not None:
                head, tail, key = _last
                cut = len(tail)
                start = len(head)
        if new_p:
            self._took(new_p, new_s)

    def _took(self, slots: list[int], seqs: list[int]) -> None:
        """``add_many``'s stretch: bits already set; order entries and counts."""
        self._ring_p.extend(slots)
        self._ring_s.extend(seqs)
        self._live += len(slots)
        count, refs = self._count, self._refs
        for slot, n in Counter(slots).items():
            count[slot] += n
            refs[slot] += n

    def discard(self, msg_id: str) -> None:
        if msg_id in self._other:
            self._other.discard(msg_id)
            self._live -= 1
            return
        ps = _split(msg_id)
        if ps is not None:
            slot = self._slots.get(ps[0])
            if slot is not None and self._clear_bit(slot, ps[1]):
                self._live -= 1

    def _set_bit(self, producer: str, seq: int) -> bool | None:
        """Set ``seq``'s bit in ``producer``'s bitmap (False: too sparse, use a str;
        None: it is set already)."""
        slot = self._slots.get(producer)
        if slot is not None:
            off = seq - self._base[slot]
            bits = self._bits[slot]
            if 0 <= off < 8 * len(bits):
                # in the bitmap already (most ids: a producer's next): no growth to
                # consider, the bit is set at once (issue #14)
                i, mask = off >> 3, 1 << (off & 7)
                if bits[i] & mask:
                    return None
                bits[i] |= mask
                self._count[slot] += 1
                self._refs[slot] += 1
                self._ring_p.append(slot)
                self._ring_s.append(seq)
                return True
        else:
            if self._free:
                slot = self._free.pop()
                self._names[slot] = producer
                self._bits[slot] = bytearray(1)
                self._base[slot] = seq & ~7
                self._count[slot] = 0
                self._refs[slot] = 0
            else:
                slot = len(self._names)
                self._names.append(producer)
                self._bits.append(bytearray(1))
                self._base.append(seq & ~7)
                self._count.append(0)
                self._refs.append(0)
            self._slots[producer] = slot
        bits = self._bits[slot]
        off = seq - self._base[slot]
        room = 8 * (self._count[slot] + 1) + _SLACK
        if off < 0:
            grow = (-off + 7) >> 3
            if len(bits) + grow > room:
                return False
            bits[0:0] = bytes(grow)
            self._base[slot] -= 8 * grow
            off += 8 * grow
        elif off >= 8 * len(bits):
            need = (off >> 3) + 1
            if need > room:
                return False
            bits.extend(bytes(need - len(bits)))
        bits[off >> 3] |= 1 << (off & 7)
        self._count[slot] += 1
        self._refs[slot] += 1
        self._ring_p.append(slot)
        self._ring_s.append(seq)
        return True

    def _clear_bit(self, slot: int, seq: int) -> bool:
        """Clear ``seq``'s bit (True if it was set); sheds leading zero bytes."""
        bits = self._bits[slot]
        off = seq - self._base[slot]
        if not 0 <= off < 8 * len(bits):
            return False
        mask = 1 << (off & 7)
        if not bits[off >> 3] & mask:
            return False
        bits[off >> 3] &= ~mask & 0xFF
        self._count[slot] -= 1
        if len(bits) > _SHED and not any(bits[:_SHED]):
            lead = len(bits) - len(bits.lstrip(b"\0"))
            del bits[:lead]
            self._base[slot] += 8 * lead
        return True

    def _evict(self) -> None:
        i = self._head
        slot, seq = self._ring_p[i], self._ring_s[i]
        self._head = i + 1
        # An entry leaving takes its id along in whichever form it is held now (it may
        # have been discarded and added again, in the other form), as the set did.
        if slot < 0:
            self.discard(self._other_order.popleft())
        else:
            if self._clear_bit(slot, seq):
                self._live -= 1
            else:
                msg_id = _join(self._names[slot], seq)
                if msg_id in self._other:
                    self._other.discard(msg_id)
                    self._live -= 1
            self._refs[slot] -= 1
            if self._refs[slot] == 0:   # no entry names it: the slot may be reused
                del self._slots[self._names[slot]]
                self._names[slot] = None
                self._bits[slot] = None
                self._free.append(slot)
        if self._head > 4096 and 2 * self._head > len(self._ring_p):
            del self._ring_p[:self._head]
            del self._ring_s[:self._head]
            self._head = 0
