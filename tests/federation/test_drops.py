"""Issue 12 defects 11 / 12 at the pure layer: the refused-advisory digest, and a second
tree link for an already-linked child id."""

from treefed.core.actions import Drop
from treefed.federation.drops import DropDigest
from treefed.federation.settings import LinkSettings, TreeSettings
from treefed.federation.testing import Estate


def drop(i: int = 0, reason: str = "malformed", link: str = "tree", peer: str = "S") -> Drop:
    return Drop(reason, link, peer, f"S/c/{i}", "queue://Q", "S")


class TestDropDigest:
    def test_first_per_link_and_reason_opens_a_window(self):
        """Only the first refusal of a (link, peer, reason) in a window is to be logged."""
        d = DropDigest(10.0)
        assert d.add(drop(0), 0.0) is True
        assert [d.add(drop(i), 1.0) for i in range(1, 100)] == [False] * 99
        assert d.add(drop(0, reason="loop"), 1.0) is True
        assert d.add(drop(0, peer="T"), 1.0) is True
        assert d.pending() == 3

    def test_due_summarises_windows_that_counted_more(self):
        """After the interval, one summary per window with count > 1, with its example."""
        d = DropDigest(10.0)
        for i in range(5):
            d.add(drop(i), float(i))
        d.add(drop(0, reason="loop"), 0.0)
        assert d.due(9.0) == []
        [summary] = d.due(10.0)
        assert summary == {"link": "tree", "peer": "S", "reason": "malformed", "count": 5,
                           "interval": 10.0, "consumer": "S/c/0", "dst": "queue://Q",
                           "origin": "S"}
        assert d.pending() == 0 and d.next_deadline() is None
        assert d.add(drop(9), 11.0) is True   # a new window

    def test_windows_are_bounded(self):
        """Past max_windows, refusals on new links share one overflow window."""
        d = DropDigest(10.0, max_windows=2)
        assert d.add(drop(link="a"), 0) and d.add(drop(link="b"), 0)
        assert d.add(drop(link="c"), 0) is True      # opens the overflow window
        assert d.add(drop(link="d"), 0) is False
        assert d.pending() == 3
        assert {s["link"] for s in d.due(10.0)} == {"*"}


class TestDuplicateChildLink:
    def test_second_link_for_a_linked_child_is_refused(self):
        """A second tree link from an id already linked is refused; the first keeps its
        subtree and its interest."""
        e = Estate()
        e.add("HQ")
        e.add("S", tree=TreeSettings("leaf"))
        assert e.tree_link("S", "HQ")
        e.subscribe("S", "s", "queue://S.In")
        e.run_until_quiet()
        assert not e.tree_link("S", "HQ", name="again")
        assert e.count("link.refused", broker="HQ") == 1
        [refused] = e.events("link.refused", broker="HQ")
        assert "already linked" in refused["reason"]
        [link] = e.sites["HQ"].statistics()["links"]
        assert link["peer"] == "S" and link["remote_interest"] == 1
        ids = e.send("HQ", "queue://S.In")
        e.run_until_quiet()
        assert e.delivered("S") == ids

    def test_an_id_linked_below_a_child_is_refused_as_a_child(self):
        """A broker already inside one child's subtree cannot link directly as another."""
        e = Estate()
        e.add("HQ")
        e.add("R", tree=TreeSettings("branch"))
        e.add("S", tree=TreeSettings("leaf"))
        e.add("S-twin", tree=TreeSettings("leaf"))
        assert e.tree_link("R", "HQ") and e.tree_link("S", "R")
        e.subscribe("S", "s", "queue://S.In")
        e.run_until_quiet()
        hello = e.sites["S-twin"].hello(LinkSettings(kind="tree", name="t2",
                                                     node_type="leaf"))
        hello.broker_id = "S"
        out = e.sites["HQ"].link_up("L:t2:S", LinkSettings(kind="tree", name="t2"), hello,
                                    e.now, dialed=False)
        assert any(type(a).__name__ == "Close" for a in out)
        assert e.sites["HQ"].bridge("L:t2:S") is None
