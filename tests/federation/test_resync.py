"""Issue 18 part 3: delta resync of tree interest after a link flap."""

from treefed.federation.resync import digest
from treefed.federation.settings import LinkSettings, TreeSettings
from treefed.federation.testing import Estate

N = 120
GRACE = 30.0


def tree(lnk, node_type):
    return LinkSettings(kind="tree", name="tree", node_type=node_type, resync_grace=lnk)


def estate(grace: float = GRACE) -> Estate:
    """HQ <- R1 <- N stores, each store with one consumer on its own queue."""
    e = Estate()
    e.add("HQ")
    e.add("R1", tree=TreeSettings("branch"))
    assert e.link("R1", "HQ", tree(grace, "branch"))
    for i in range(N):
        e.add(f"S{i}", tree=TreeSettings("leaf"))
        assert e.link(f"S{i}", "R1", tree(grace, "leaf"))
        e.subscribe(f"S{i}", "in", f"queue://S{i}.In")
    e.run_until_quiet()
    return e


def flap(e: Estate, *, during=None) -> list:
    """Cut R1 <-> HQ, optionally act, relink; the advisories sent after the cut."""
    e.unlink("R1", "HQ")
    e.run_until_quiet()
    before = len(e.advisories)
    if during is not None:
        during(e)
        e.run_until_quiet()
    assert e.link("R1", "HQ", tree(GRACE, "branch"))
    e.run_until_quiet()
    return [f for _, d, f in e.advisories[before:] if d == "HQ"]


def hq_demand(e: Estate) -> int:
    return e.sites["HQ"].statistics()["demand"]


class TestDelta:
    def test_flap_without_change_sends_no_interest(self):
        """A region<->HQ flap with no interest change: no advisory frame at all, HQ
        holds all N again and routes to every store."""
        e = estate()
        assert hq_demand(e) == N
        assert flap(e) == []
        assert hq_demand(e) == N
        ids = e.send("HQ", "queue://S7.In") + e.send("HQ", f"queue://S{N - 1}.In")
        e.run_until_quiet()
        assert e.delivered("S7") == ids[:1] and e.delivered(f"S{N - 1}") == ids[1:]

    def test_without_grace_the_whole_set_is_resent(self):
        """The old behaviour (resync_grace 0): every store's interest crosses again."""
        e = estate(grace=0)
        e.unlink("R1", "HQ")
        e.run_until_quiet()
        before = len(e.advisories)
        assert e.link("R1", "HQ", tree(0, "branch"))
        e.run_until_quiet()
        assert len([f for _, d, f in e.advisories[before:] if d == "HQ"]) == N

    def test_interest_removed_during_the_outage_is_gone(self):
        """A consumer that left while the link was down: one removal, nothing stale."""
        e = estate()
        frames = flap(e, during=lambda e: e.unsubscribe("S3", "in"))
        assert [(f.kind, f.consumer) for f in frames] == [("remove", "S3/c/in")]
        assert hq_demand(e) == N - 1
        assert not any(c["dst"] == "queue://S3.In"
                       for c in e.sites["HQ"].broker.statistics().get("consumers", []))

    def test_interest_added_during_the_outage_is_sent(self):
        """A consumer that appeared while the link was down: one add."""
        e = estate()
        frames = flap(e, during=lambda e: e.subscribe("S4", "more", "queue://S4.More"))
        assert [(f.kind, f.consumer) for f in frames] == [("add", "S4/c/more")]
        assert hq_demand(e) == N + 1

    def test_after_the_grace_everything_is_forgotten_and_resent(self):
        """The parent forgets the link's interest at once (demand removed, routing as
        before) but remembers it for resync_grace; after that a reconnect is a full
        resync."""
        e = estate()
        e.unlink("R1", "HQ")
        e.run_until_quiet()
        hq = e.sites["HQ"].statistics()
        assert hq["interest"] == 0 and hq["resync"]["children"] == ["R1/tree"]
        assert e.sites["R1"].statistics()["resync"]["held_up"] == N
        e.advance(GRACE + 1)
        assert "resync" not in e.sites["HQ"].statistics()
        assert "resync" not in e.sites["R1"].statistics()
        before = len(e.advisories)
        assert e.link("R1", "HQ", tree(GRACE, "branch"))
        e.run_until_quiet()
        assert len([f for _, d, f in e.advisories[before:] if d == "HQ"]) == N
        assert hq_demand(e) == N

    def test_a_child_with_other_interest_gets_a_full_resync(self):
        """A digest that does not match (the child restarted, or changed) -> full."""
        e = estate()
        e.unlink("R1", "HQ")
        e.run_until_quiet()
        e.sites["R1"]._held_up.frames.popitem()      # R1 remembers differently
        before = len(e.advisories)
        assert e.link("R1", "HQ", tree(GRACE, "branch"))
        e.run_until_quiet()
        assert len([f for _, d, f in e.advisories[before:] if d == "HQ"]) == N
        assert hq_demand(e) == N


class TestDigest:
    def test_order_independent_and_stable(self):
        """Same keys in any order: same digest; the value is fixed across processes."""
        keys = [("a/c/1", ("a",)), ("b/c/2", ("b", "r"))]
        assert digest(keys) == digest(reversed(keys))
        assert digest(keys) != digest(keys[:1])
        assert digest([]) == "0:" + "0" * 32
        assert digest([("x", ())]).startswith("1:")


def test_a_delta_resync_restores_the_per_client_interest_counts():
    """Interest re-admitted by a delta resync counts against its client's share of the
    link (issue 12 defect 7) exactly as interest that arrived in advisories does."""
    from collections import Counter

    e = estate()
    assert flap(e) == []
    [bridge] = [b for b in e.sites["HQ"].links() if b.peer == "R1"]
    want = Counter(consumer.rpartition("/")[0] for consumer, _path in bridge.remote)
    assert len(bridge.remote) == N and dict(bridge.clients) == dict(want)
