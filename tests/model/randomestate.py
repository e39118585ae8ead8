"""Random small estates for the model's property tests: trees and meshes with cycles,
mixed TTLs, duplex and one-way connectors, include / exclude filters, several consumers
per broker -- built both as a model ``Estate`` and as a live ``federation.testing.Estate``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hypothesis import strategies as st

from treefed.federation.settings import LinkSettings, TreeSettings
from treefed.federation.testing import Estate as LiveEstate
from treefed.model.exact import Estate, Group, Link

DSTS = ("queue://A", "queue://B.x", "topic://T", "topic://U.y", "queue://C")
FILTERS = ((), ("queue://B.>",), ("topic://>",), ("queue://A", "topic://T"))


@dataclass
class Case:
    estate: Estate
    consumers: list[tuple[str, str]]   # (broker, dst), one per consumer

    def groups(self) -> list[Group]:
        counted = Counter(self.consumers)
        return [Group(b, d, n, name=f"{b}|{d}") for (b, d), n in counted.items()]

    def live(self) -> LiveEstate:
        """The same estate as real Sites; links brought up in link order, then the
        consumers subscribed, then run to quiet."""
        live = LiveEstate()
        for b in self.estate.brokers:
            live.add(b, tree=self.estate.tree.get(b),
                     accept_tree_children=b in self.estate.accepts_children)
        for link in self.estate.links:
            assert live.link(link.dialer, link.acceptor, link.settings), link
        live.run_until_quiet()
        for i, (b, d) in enumerate(self.consumers):
            live.subscribe(b, f"s{i}", d)
        live.run_until_quiet()
        return live


@st.composite
def mesh_cases(draw) -> Case:
    n = draw(st.integers(2, 7))
    brokers = tuple(f"b{i}" for i in range(n))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    # a spanning tree first (connected), then extra edges: cycles
    edges = [(draw(st.integers(0, i - 1)), i) for i in range(1, n)]
    extra = draw(st.lists(st.sampled_from(pairs), max_size=4, unique=True)) if pairs else []
    edges += [e for e in extra if e not in edges]
    links = []
    # one priority rule for the estate: with it mixed per link a later, longer route can
    # outrank a kept one (the model refuses that case as NotModelled)
    decrease = draw(st.booleans())
    for k, (i, j) in enumerate(edges):
        dialer, acceptor = (brokers[i], brokers[j]) if draw(st.booleans()) \
            else (brokers[j], brokers[i])
        settings = LinkSettings(
            kind="mesh", name=f"l{k}", duplex=draw(st.booleans()),
            network_ttl=draw(st.sampled_from((1, 2, 3, -1))),
            # message hops apart from consumer hops (None: the network ttl) -- only
            # messages.py reads it
            message_ttl=draw(st.sampled_from((None, None, 1, 2))),
            conduit_subscriptions=draw(st.booleans()),
            dynamically_included=draw(st.sampled_from(FILTERS)),
            excluded=draw(st.sampled_from(((), ("queue://C",), ("topic://U.>",)))),
            decrease_network_consumer_priority=decrease,
            suppress_duplicate_queue_subscriptions=draw(st.booleans()),
            suppress_duplicate_topic_subscriptions=draw(st.booleans()))
        links.append(Link(dialer, acceptor, settings))
    consumers = draw(st.lists(st.tuples(st.sampled_from(brokers), st.sampled_from(DSTS)),
                              min_size=1, max_size=8))
    return Case(Estate(brokers, tuple(links)), consumers)


@st.composite
def tree_cases(draw) -> Case:
    n = draw(st.integers(2, 9))
    brokers = tuple(f"t{i}" for i in range(n))
    parent = {i: draw(st.integers(0, i - 1)) for i in range(1, n)}
    has_children = set(parent.values())
    tree, accepting, links = {}, set(), []
    for i, b in enumerate(brokers):
        if i == 0:
            tree[b] = None
            accepting.add(b)
        else:
            role = "branch" if i in has_children else "leaf"
            tree[b] = TreeSettings(role)
            if role == "branch":
                accepting.add(b)
    for i in range(1, n):
        role = tree[brokers[i]].node_type
        links.append(Link(brokers[i], brokers[parent[i]],
                          LinkSettings(kind="tree", name="tree", node_type=role)))
    consumers = draw(st.lists(st.tuples(st.sampled_from(brokers), st.sampled_from(DSTS)),
                              min_size=1, max_size=8))
    return Case(Estate(brokers, tuple(links), tree, frozenset(accepting)), consumers)


def live_counts(live: LiveEstate):
    """Per-broker counts from the live estate's event log, as ``Counts``."""
    from treefed.model.exact import Counts

    c = Counts()
    for broker, log in live.logs:
        f = log.fields
        if log.event == "advisory.sent" and f["kind"] == "add":
            c.adds_sent[broker] += 1
        elif log.event == "advisory.received" and f["kind"] == "add":
            c.adds_received[broker] += 1
        elif log.event == "advisory.dropped":
            c.dropped[broker, f["reason"]] += 1
        elif log.event == "demand.created":
            c.demand[broker] += 1
    for name, site in live.sites.items():
        if site._active:
            c.interest[name] = len(site._active)
    return c


def union_case(cases: list[Case]) -> tuple[Case, list[tuple[str, ...]]]:
    """Several cases side by side as one estate with no link between them: case ``k``'s
    broker ``b`` becomes ``c{k}{b}``.  Nothing can cross from one part to another, so
    each part's figures are its own case's; one Spark run then checks several cases
    (a run costs a few Spark jobs per hop, whatever the estate's size).  Returns the
    union and each part's broker ids.  A destination or filter naming a broker's own
    queue (``Store.{broker}.``, ``relativestate``) is renamed with the broker."""
    brokers: list[str] = []
    links: list[Link] = []
    tree: dict = {}
    accepting: set[str] = set()
    consumers: list[tuple[str, str]] = []
    parts = []
    for k, case in enumerate(cases):
        name = {b: f"c{k}{b}" for b in case.estate.brokers}
        parts.append(tuple(name.values()))
        brokers += name.values()
        links += [Link(name[l.dialer], name[l.acceptor], _renamed(l.settings, name))
                  for l in case.estate.links]
        tree.update({name[b]: t for b, t in case.estate.tree.items()})
        accepting |= {name[b] for b in case.estate.accepts_children}
        consumers += [(name[b], _own(d, name)) for b, d in case.consumers]
    return Case(Estate(tuple(brokers), tuple(links), tree, frozenset(accepting)),
                consumers), parts


def _own(text: str, name: dict) -> str:
    for old, new in name.items():
        text = text.replace(f"Store.{old}.", f"Store.{new}.")
    return text


def _renamed(settings, name: dict):
    from dataclasses import replace

    return replace(settings, **{key: tuple(_own(t, name) for t in getattr(settings, key))
                                for key in ("dynamically_included", "excluded",
                                            "statically_included")})
