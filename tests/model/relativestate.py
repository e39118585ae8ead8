"""Random estates whose leaves' connectors name the leaf itself -- the tuned mesh's
"each store limited to its own queue" at small size: hubs in a mesh (cycles, mixed
TTLs and settings), leaves under each hub dialing it with a filter written relative to
the leaf (``{broker}``: its own queue included, excluded or statically included), leaf
consumers of their own queue and shared destinations.  Leaves of a hub share a filter
template and a workload template, so ``cells.fold`` folds them (one leaf may be drawn
apart), and the Spark cells must equal the exact walk."""

from __future__ import annotations

from hypothesis import strategies as st

from treefed.federation.settings import LinkSettings
from treefed.model.exact import Estate, Link

from tests.model.randomestate import Case

OWN = "queue://Store.{broker}.In"
SHARED = ("topic://T", "queue://A", "queue://Hub.h0.In", "topic://U.y")
INCLUDES = ((), ("queue://Store.{broker}.>",), ("queue://Store.{broker}.>", "topic://T"),
            ("queue://Store.{broker}.In", "queue://A", "topic://>"))
EXCLUDES = ((), ("queue://Store.{broker}.>",), ("topic://U.>",))
STATIC = ((), ("queue://Store.{broker}.In",))


def _fill(templates: tuple, leaf: str) -> tuple:
    return tuple(t.replace("{broker}", leaf) for t in templates)


@st.composite
def leaf_settings(draw, name: str):
    return {"name": name, "duplex": draw(st.booleans()),
            "network_ttl": draw(st.sampled_from((1, 2, 3, -1))),
            "conduit_subscriptions": draw(st.booleans()),
            "dynamically_included": draw(st.sampled_from(INCLUDES)),
            "excluded": draw(st.sampled_from(EXCLUDES)),
            "statically_included": draw(st.sampled_from(STATIC)),
            "suppress_duplicate_queue_subscriptions": draw(st.booleans())}


@st.composite
def relative_cases(draw) -> Case:
    hubs = tuple(f"h{i}" for i in range(draw(st.integers(1, 3))))
    decrease = draw(st.booleans())
    links = []
    # hubs: a spanning tree plus maybe one extra edge (a cycle)
    edges = [(draw(st.integers(0, i - 1)), i) for i in range(1, len(hubs))]
    if len(hubs) == 3 and draw(st.booleans()):
        edges.append((0, 2) if (0, 2) not in edges else (1, 2))
    for k, (i, j) in enumerate(edges):
        links.append(Link(hubs[j], hubs[i], LinkSettings(
            kind="mesh", name=f"hub{k}", duplex=draw(st.booleans()),
            network_ttl=draw(st.sampled_from((1, 2, 3, -1))),
            conduit_subscriptions=draw(st.booleans()),
            excluded=draw(st.sampled_from(((), ("topic://U.>",)))),
            decrease_network_consumer_priority=decrease)))
    brokers = list(hubs)
    consumers: list[tuple[str, str]] = []
    for h in hubs:
        consumers += [(h, d) for d in draw(st.lists(st.sampled_from(SHARED), max_size=2))]
        n = draw(st.integers(0, 4))
        shared = draw(leaf_settings(f"up-{h}"))
        work = draw(st.lists(st.sampled_from((OWN, *SHARED)), min_size=1, max_size=3))
        apart = draw(st.integers(-1, n - 1))      # one leaf drawn apart, or none
        for k in range(n):
            leaf = f"s{h}-{k}"
            brokers.append(leaf)
            opts = draw(leaf_settings(f"up-{h}")) if k == apart else shared
            s = LinkSettings(kind="mesh", decrease_network_consumer_priority=decrease,
                             **{**opts, **{key: _fill(opts[key], leaf) for key in
                                           ("dynamically_included", "excluded",
                                            "statically_included")}})
            links.append(Link(leaf, h, s))
            mine = draw(st.lists(st.sampled_from((OWN, *SHARED)), min_size=1, max_size=3)) \
                if k == apart else work
            consumers += [(leaf, d.replace("{broker}", leaf)) for d in mine]
    if not consumers:
        consumers.append((hubs[0], SHARED[0]))
    return Case(Estate(tuple(brokers), tuple(links)), consumers)
