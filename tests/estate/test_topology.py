"""Who dials whom, and the tree in it."""

from __future__ import annotations

import pytest

from treefed.estate.topology import (
    Address, Dial, Link, NotATree, infer_tree, resolve_links, spanning_tree,
)


def dial(broker: str, host: str, port: int) -> Dial:
    return Dial(broker, "c", "mesh", Address(host, port))


def link(a: str, b: str) -> Link:
    return Link(a, b, "c", "mesh")


class TestResolveLinks:
    def test_exact_address_first(self):
        """Same host and port wins, even when other brokers share the port."""
        links, bad = resolve_links({"a": [Address("h1", 1)], "b": [Address("h2", 1)]},
                                   [dial("a", "H2", 1)])
        assert [(x.dialer, x.acceptor) for x in links] == [("a", "b")] and bad == []

    def test_wildcard_listeners_matched_by_host_label(self):
        """Every broker on 0.0.0.0:61616: the host's first label names the broker."""
        listeners = {n: [Address("0.0.0.0", 61616)] for n in ("hq", "r1", "s1")}
        links, bad = resolve_links(listeners, [dial("s1", "r1.corp.example", 61616),
                                               dial("r1", "hq", 61616)])
        assert [(x.dialer, x.acceptor) for x in links] == [("s1", "r1"), ("r1", "hq")]

    def test_ambiguous_and_self_dials_are_reported(self):
        """Two candidates and no name to tell them apart, or a broker dialing itself,
        are unresolved with the reason."""
        listeners = {n: [Address("0.0.0.0", 61616)] for n in ("x", "y")}
        links, bad = resolve_links(listeners, [dial("x", "10.0.0.9", 61616),
                                               dial("x", "x", 61616)])
        assert links == []
        assert "2 brokers listen on port 61616" in bad[0].reason
        assert bad[1].reason == "the connector dials its own broker"


class TestInferTree:
    def test_root_is_where_every_link_points(self):
        """Stores dial regions, regions dial HQ: HQ is the root, roles by position."""
        t = infer_tree(["hq", "r1", "s1", "s2"], [link("r1", "hq"), link("s1", "r1"),
                                                  link("s2", "r1")])
        assert t.root == "hq" and t.parent == {"hq": None, "r1": "hq", "s1": "r1",
                                               "s2": "r1"}
        assert [t.role(b) for b in ("hq", "r1", "s1")] == ["root", "branch", "leaf"]

    def test_centre_when_directions_are_mixed(self):
        """HQ dials the regions and stores dial them too: no broker every link points
        to, so the graph's centre is the root."""
        t = infer_tree(["hq", "r1", "r2", "s1", "s2"],
                       [link("hq", "r1"), link("hq", "r2"), link("s1", "r1"),
                        link("s2", "r2")])
        assert t.root == "hq"

    def test_explicit_root(self):
        """--root picks any broker."""
        t = infer_tree(["a", "b", "c"], [link("a", "b"), link("b", "c")], root="c")
        assert t.root == "c" and t.depth("a") == 2

    def test_disconnected_and_cycles_refused(self):
        """Two islands, or a triangle, are no tree: one reason each."""
        with pytest.raises(NotATree, match="2 separate networks"):
            infer_tree(["a", "b", "c", "d"], [link("a", "b"), link("c", "d")])
        with pytest.raises(NotATree, match="cycle"):
            infer_tree(["a", "b", "c"], [link("a", "b"), link("b", "c"), link("c", "a")])

    def test_spanning_tree_of_a_triangle(self):
        """Tiers of a graph that is not a tree: a breadth-first spanning tree."""
        t = spanning_tree("abc", [link("a", "b"), link("b", "c"), link("c", "a")])
        assert len(t.order) == 3 and t.parent[t.root] is None
