"""Interest summarisation at tree branches (issue 18 part 2).

Theory of operation
-------------------
In a plain tree the root holds one entry per consumer below it (8,000 at 4 x 1,000
stores).  With ``summary_budget`` B > 0 (the child's tree-connector setting, sent in its
hello options) a child keeps the entries it sends up its parent link to at most about
B: while more than B interests would go up (its own consumers and its children's, temp
destinations excepted) it is *summarising* and sends covering entries instead:

* one *aggregate* entry per (destination, selector, consumer priority) -- an ordinary
  advisory whose consumer is ``<me>/~summary/<n>`` and whose origin is this broker, so
  the parent needs nothing new to route it: exactly the messages some consumer below can
  take go down, as before;
* one *ownership cover* per ``summary_owned`` pattern (``"queue://Store.{broker}.>"``)
  for the interests of queues their own broker consumes (a store consuming
  ``queue://Store.<store>.Incoming``): an advisory whose ``cover`` field holds the
  pattern.  Queue names like these carry no region, so a plain wildcard would misroute
  at the parent; instead the parent installs one *fallback* consumer on the child's link
  for the pattern's wildcard whose selector (``OwnedBy``) matches a message only when
  the broker its destination names lives in that child's subtree -- subtree ownership,
  the table ``Site._owner`` the parent already keeps, fed here by ``Subtree`` frames
  (the child's membership: broker ids added / removed) sent before the first cover.

A fallback is taken only when no regular consumer may take the message, so precise
interest anywhere (a consumer at the parent, another child's entry) still wins.  An
owned message with no consumer below is sent down anyway and rests at the owning branch
(the extra hop this costs); so it never comes straight back up, the child's own fallback
to its parent skips destinations its subtree owns while a cover is up (``NotOwned``),
and the parent sends the child its own interest in destinations the child owns (a
consumer at HQ of a store's queue), whatever ``advertise_down`` says.  Below the budget
again (consumers left) the child re-sends its interest precisely and withdraws the
covers and its membership.  Nested branches work the same way: a cover received from a
child makes this broker cover the pattern towards its own parent.

Versioning: a parent that understands summaries and can pass covers on answers the
child's hello with ``options["summary"] = 1`` (``Site._passes_covers``: the root, or a
branch whose own uplink is configured to summarise and is not up refusing it); an older
parent, or a branch that could not pass covers on, does not, and the child then
advertises plainly.  A branch whose uplink comes up refusing summaries closes its
summarising child links, so they relink plain.  With ``summary_budget`` 0 (the default) nothing here runs and no frame or
hello changes.  A summarising link always resyncs in full after an outage (at most B
entries and one membership frame).  Nothing here does I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from treefed.core.actions import Out
from treefed.core.destinations import matches, name_of, parse_destination
from treefed.errors import ConfigError, DestinationError
from treefed.wire.frames import MAX_MEMBERS, Advisory, Subtree

if TYPE_CHECKING:  # pragma: no cover
    from treefed.federation.bridge import Bridge, Interest
    from treefed.federation.site import Site

__all__ = ["OPTION", "Pattern", "OwnedBy", "NotOwned", "Summary", "COVER_PRIORITY", "owns",
           "receive_cover", "receive_subtree", "offer_owned_down"]

#: the parent's hello option: "I understand covers and Subtree frames"
OPTION = "summary"
#: a cover consumer's priority: above the parent fallback (0) of a nested branch
COVER_PRIORITY = 1
_BROKER = "{broker}"


class Pattern:
    """``"queue://Store.{broker}.>"``: queues owned by the broker one segment names."""

    __slots__ = ("text", "wild", "index")

    def __init__(self, text: str, wild: str, index: int) -> None:
        self.text, self.wild, self.index = text, wild, index

    @classmethod
    def parse(cls, text: Any) -> "Pattern":
        if type(text) is not str or text.count(_BROKER) != 1 \
                or not text.startswith("queue://"):
            raise ConfigError("summary_owned", f"{text!r} must be a queue:// pattern with "
                                               "one {broker} segment")
        segs = text[len("queue://"):].split(".")
        if _BROKER not in segs:
            raise ConfigError("summary_owned", f"{text!r}: {{broker}} must be a whole segment")
        try:
            wild = parse_destination(text.replace(_BROKER, "*"), allow_wildcards=True)
        except DestinationError as exc:
            raise ConfigError("summary_owned", exc.message) from None
        return cls(text, wild, segs.index(_BROKER))

    def broker(self, dst: str) -> str | None:
        """The broker ``dst`` belongs to under this pattern, or None."""
        if not matches(self.wild, dst):
            return None
        return name_of(dst).split(".")[self.index]


class OwnedBy:
    """Selector of a parent's cover consumer: the destination's broker is below ``bridge``."""

    __slots__ = ("site", "bridge", "pattern", "text")

    def __init__(self, site: "Site", bridge: "Bridge", pattern: Pattern) -> None:
        self.site, self.bridge, self.pattern = site, bridge, pattern
        self.text = f"owned by {bridge.peer}: {pattern.text}"   # statistics

    def matches(self, headers: dict, *, message: Any = None) -> bool:
        broker = self.pattern.broker(message.dst) if message is not None else None
        if broker is None:
            return False
        bridge = self.bridge
        return broker == bridge.peer or self.site._owner.get(broker) is bridge


class NotOwned:
    """Selector of a summarising child's queue fallback to its parent: not the queues
    its subtree owns while a cover for them is up (they rest here, see the docstring)."""

    __slots__ = ("site", "summary", "text")

    def __init__(self, site: "Site", summary: "Summary") -> None:
        self.site, self.summary = site, summary
        self.text = "not owned below"

    def matches(self, headers: dict, *, message: Any = None) -> bool:
        s = self.summary
        if not s.sent or message is None:
            return True
        site = self.site
        for p in s.patterns:
            if p.text in s.sent:
                broker = p.broker(message.dst)
                if broker is not None and (broker == site.broker_id or broker in site._owner):
                    return False
        return True


def owned(patterns: tuple[Pattern, ...], it: "Interest") -> Pattern | None:
    """The pattern under which ``it`` is a consumer of its own broker's queue."""
    for p in patterns:
        if p.broker(it.dst) == it.origin:
            return p
    return None


class Summary:
    """The child's side of one summarising parent link (see the module docstring).

    The summary (aggregate entries, owned patterns) is kept up to date in both modes,
    frames are sent only while ``active``.  The link is plain while the precise entries
    plus the summary's would fit the budget (``count + size() <= budget``), so the
    switch -- new entries first, old ones retracted after -- never puts more than
    ``budget`` entries at the parent, in either direction."""

    __slots__ = ("site", "bridge", "budget", "patterns", "active", "count", "entries",
                 "owned", "child_covers", "sent", "announced", "_n")

    def __init__(self, site: "Site", bridge: "Bridge") -> None:
        self.site = site
        self.bridge = bridge
        self.budget = bridge.settings.summary_budget
        self.patterns = tuple(Pattern.parse(t) for t in bridge.settings.summary_owned)
        self.active = False
        self.count = 0               # interests that go up: local + children's, no temps
        # (dst, selector, priority) -> [members, the add frame while sent, else None]
        self.entries: dict[tuple, list] = {}
        self.owned: dict[str, int] = {}          # pattern -> interests owned under it
        self.child_covers: dict[str, int] = {}   # pattern -> children covering it
        self.sent: dict[str, Advisory] = {}      # covers sent up
        self.announced: set[str] = set()         # brokers told (Subtree frames)
        self._n = 0

    # -- what goes up -----------------------------------------------------------------
    @staticmethod
    def counts(it: "Interest") -> bool:
        src = it.source
        return (src is None or src.lane == "child") and not it.dst.startswith("temp-")

    def size(self) -> int:
        """Entries the summary takes at the parent (the covers children need included)."""
        covers = len(self.owned) + sum(1 for p in self.child_covers if p not in self.owned)
        return len(self.entries) + covers

    def fits(self) -> bool:
        return self.count + self.size() <= self.budget

    def start(self, out: list) -> None:
        """The link came up: everything that goes up, precisely or summarised."""
        site = self.site
        ups = []
        for it in site._active.values():
            if self.counts(it):
                ups.append(it)
            elif it.source is None or it.source.lane == "child":
                self.bridge.offer(it, out)   # a temp destination: always precise
        for bridge in site._lanes["child"]:
            for p in bridge.covers:
                self.child_covers[p] = self.child_covers.get(p, 0) + 1
        for it in ups:
            self._count(it)
        self.active = not self.fits()
        if not self.active:
            for it in ups:
                self.bridge.offer(it, out)
        self._send_summary(out)

    def add(self, it: "Interest", out: list) -> None:
        """``it`` became active and would go up."""
        if not self.counts(it):
            self.bridge.offer(it, out)
            return
        self._count(it)
        if self.active:
            self._send_summary(out)
        elif not self.fits():
            self._enter(out)
        else:
            self.bridge.offer(it, out)

    def remove(self, it: "Interest", out: list, now: float) -> None:
        """``it`` left (already out of ``Site._active``; its precise frame, if any, is
        retracted by the caller)."""
        if not self.counts(it):
            return
        self.count -= 1
        p = owned(self.patterns, it)
        if p is not None:
            left = self.owned[p.text] - 1
            if left:
                self.owned[p.text] = left
            else:
                del self.owned[p.text]
                if p.text in self.sent and not self.child_covers.get(p.text):
                    self._uncover(p.text, out, now)
        else:
            key = (it.dst, it.selector, it.priority)
            entry = self.entries[key]
            entry[0] -= 1
            if not entry[0]:
                del self.entries[key]
                if entry[1] is not None:
                    self.bridge.retract_frame(entry[1], out)
        if self.active and self.fits():
            self._leave(out, now)

    # -- covers from children ---------------------------------------------------------
    def child_cover(self, pattern: str, delta: int, out: list, now: float) -> None:
        n = self.child_covers.get(pattern, 0) + delta
        if n > 0:
            self.child_covers[pattern] = n
            if pattern not in self.sent:
                self._cover(pattern, out)
            return
        self.child_covers.pop(pattern, None)
        if pattern in self.sent and not (self.active and self.owned.get(pattern)):
            self._uncover(pattern, out, now)

    # -- membership ---------------------------------------------------------------------
    def sync_members(self, out: list) -> None:
        """Tell the parent which brokers are below us now (only while a cover is up)."""
        want = set(self.site._owner) if self.sent else set()
        add = sorted(want - self.announced)
        gone = sorted(self.announced - want)
        if not add and not gone:
            return
        self.announced = want
        site = self.site
        while add or gone:
            frame = Subtree(add[:MAX_MEMBERS], gone[:MAX_MEMBERS])
            add, gone = add[MAX_MEMBERS:], gone[MAX_MEMBERS:]
            out.append(_out(self.bridge.conn, frame))
            site.counters["subtree_frames"] = site.counters.get("subtree_frames", 0) + 1

    # -- internals ----------------------------------------------------------------------
    def _count(self, it: "Interest") -> None:
        self.count += 1
        p = owned(self.patterns, it)
        if p is not None:
            self.owned[p.text] = self.owned.get(p.text, 0) + 1
            return
        key = (it.dst, it.selector, it.priority)
        entry = self.entries.get(key)
        if entry is not None:
            entry[0] += 1
        else:
            self.entries[key] = [1, None]

    def _send_summary(self, out: list) -> None:
        """Send what the summary holds and the parent lacks (covers first)."""
        for p in self.patterns:
            text = p.text
            if text not in self.sent and (self.child_covers.get(text)
                                          or self.active and self.owned.get(text)):
                self._cover(text, out)
        if not self.active:
            return
        site = self.site
        for key, entry in self.entries.items():
            if entry[1] is None:
                self._n += 1
                dst, selector, priority = key
                entry[1] = Advisory("add", f"{site.broker_id}/~summary/{self._n}", dst,
                                    site.broker_id, selector, priority, [])
                self._send(entry[1], out)

    def _enter(self, out: list) -> None:
        """Over the budget: covering entries first, then the precise ones retracted."""
        self.active = True
        self._send_summary(out)
        bridge = self.bridge
        for it in list(self.site._active.values()):
            if self.counts(it) and bridge in it.sent_to:
                it.sent_to.remove(bridge)
                bridge.retract(it, out)

    def _leave(self, out: list, now: float) -> None:
        """Back within the budget: precise entries first, then the summary withdrawn."""
        self.active = False
        bridge = self.bridge
        for it in list(self.site._active.values()):
            if self.counts(it) and bridge not in it.sent_to:
                bridge.offer(it, out)
        for entry in self.entries.values():
            if entry[1] is not None:
                bridge.retract_frame(entry[1], out)
                entry[1] = None
        for pattern in list(self.sent):
            if not self.child_covers.get(pattern):
                self._uncover(pattern, out, now)

    def _cover(self, pattern: str, out: list) -> None:
        if not self.sent:   # the parent must know the subtree before the first cover
            self.sent[pattern] = None   # type: ignore[assignment]  (sync_members reads it)
            self.sync_members(out)
        site = self.site
        wild = Pattern.parse(pattern).wild
        frame = Advisory("add", f"{site.broker_id}/~cover/{pattern}", wild, site.broker_id,
                         None, 0, [], pattern)
        self.sent[pattern] = frame
        self._send(frame, out)

    def _uncover(self, pattern: str, out: list, now: float) -> None:
        add = self.sent.pop(pattern)
        frame = Advisory("remove", add.consumer, add.dst, add.origin, None, 0, [], pattern)
        out.append(_out(self.bridge.conn, frame))
        site = self.site
        site.counters["removals_sent"] += 1
        if site.log:
            out.append(self.bridge._log("advisory.sent", frame, hops=1, kind="remove"))
        if not self.sent:
            self.sync_members(out)
            # the fallback up takes this subtree's queues again: offer it what waits
            out += self.site.broker.selector_widened(self.bridge.conn, "f:queue://>", now)

    def _send(self, frame: Advisory, out: list) -> None:
        bridge, site = self.bridge, self.site
        out.append(_out(bridge.conn, frame))
        site.counters["advisories_sent"] += 1
        if site.log:
            out.append(bridge._log("advisory.sent", frame, hops=1))


def _out(conn: str, frame: Any) -> Out:
    return Out(conn, frame)


# -- the parent's side ----------------------------------------------------------------------
def owns(bridge: "Bridge", dst: str) -> bool:
    """Is ``dst`` a queue owned by ``bridge``'s subtree under one of its covers?"""
    owner = bridge.site._owner
    for pattern in bridge.covers.values():
        broker = pattern.pattern.broker(dst)
        if broker is not None and (broker == bridge.peer or owner.get(broker) is bridge):
            return True
    return False


def receive_cover(bridge: "Bridge", adv: Advisory, out: list, now: float) -> None:
    """A child's cover (add or remove): install or remove the parent's fallback consumer."""
    site = bridge.site
    site.counters["advisories_received"] += 1
    if site.log:
        out.append(bridge._log("advisory.received", adv, hops=1))
    try:
        pattern = Pattern.parse(adv.cover)
    except ConfigError:
        pattern = None
    if not bridge.summarised or bridge.lane != "child" or pattern is None \
            or adv.kind not in ("add", "remove") or adv.origin != bridge.peer \
            or adv.path or adv.dst != pattern.wild:
        bridge.drop(adv, "malformed", out)
        return
    text = pattern.text
    sub = "c:" + text
    if adv.kind == "remove":
        if bridge.covers.pop(text, None) is not None:
            out += site.broker.remove_consumer(bridge.conn, sub, now)
            if site._summary is not None:
                site._summary.child_cover(text, -1, out, now)
        return
    if text in bridge.covers:
        return
    selector = OwnedBy(site, bridge, pattern)
    out += site.broker.add_consumer(
        bridge.conn, sub, pattern.wild, now, selector=selector,
        prefetch=bridge.settings.prefetch, priority=COVER_PRIORITY, peer=bridge.peer,
        message_ttl=bridge.policy.message_ttl, fallback=True, replay=True)
    bridge.covers[text] = selector
    offer_owned_down(site, bridge, out)
    if site._summary is not None:
        site._summary.child_cover(text, 1, out, now)


def receive_subtree(bridge: "Bridge", frame: Subtree, out: list, now: float) -> None:
    """A summarising child's membership: claim (or release) those brokers for it."""
    site = bridge.site
    if not bridge.summarised or bridge.lane != "child" or not isinstance(frame.add, list) \
            or not isinstance(frame.remove, list):
        site.dropped["malformed"] += 1
        return
    above = site.ancestry_set
    for broker in frame.add:
        if type(broker) is not str or not broker or broker == site.broker_id \
                or broker in above:
            site.dropped["malformed"] += 1
            continue
        owner = site.subtree_owner(broker, bridge)
        if owner is None:
            site.claim_subtree(bridge, (broker,))
        elif owner is not bridge:
            site.dropped["malformed"] += 1   # claimed by another child (a spoof or a move)
            continue
        bridge.members.add(broker)
    for broker in frame.remove:
        bridge.members.discard(broker)
        if broker != bridge.peer and site._owner.get(broker) is bridge \
                and not any(broker in it.path for it in bridge.remote.values()):
            del site._owner[broker]
            bridge.owned.discard(broker)
            site._members_dirty = True
    if frame.add:
        offer_owned_down(site, bridge, out)
        for text in bridge.covers:   # messages waiting here may now go down
            out += site.broker.selector_widened(bridge.conn, "c:" + text, now)


def offer_owned_down(site: "Site", bridge: "Bridge", out: list) -> None:
    """Our interest (local or from above) in queues ``bridge``'s subtree owns goes down
    to it whatever ``advertise_down`` says: the child keeps those queues' messages."""
    if not bridge.covers:
        return
    for it in list(site._active.values()):
        src = it.source
        if src is bridge or (src is not None and src.lane == "child") \
                or bridge in it.sent_to or it.dst.startswith(bridge.down):
            continue
        if owns(bridge, it.dst):
            bridge.offer(it, out)
