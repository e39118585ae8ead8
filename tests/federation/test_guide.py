"""The ActiveMQ network-of-brokers guide's worked examples, with the guide's numbers."""

from treefed.federation.settings import LinkSettings
from treefed.federation.testing import Estate

FOO = "queue://TEST.FOO"


def estate(names, links, settings):
    e = Estate()
    for n in names:
        e.add(n)
    for a, b in links:
        assert e.link(a, b, settings)
    e.run_until_quiet()
    return e


def triangle(settings):
    """A, B, C fully linked by duplex connectors; consumer C1 at B."""
    e = estate("ABC", [("A", "B"), ("A", "C"), ("C", "B")], settings)
    e.subscribe("B", "C1", FOO)
    e.run_until_quiet()
    return e


class TestDynamicPropagation:
    def test_messages_wait_at_a_until_the_subscription_arrives(self):
        """A->B->C->E: held at A with no consumer, then delivered to E via A, B, C."""
        e = estate("ABCE", [("A", "B"), ("B", "C"), ("C", "E")], LinkSettings(network_ttl=3))
        ids = e.send("A", FOO, count=4)
        e.run_until_quiet()
        assert e.held("A", FOO) == 4 and e.forwarded() == []
        e.subscribe("E", "C", FOO)
        e.run_until_quiet()
        assert e.delivered("E") == ids and e.held("A", FOO) == 0
        assert {tuple(f.path) for f in e.forwarded(dst="E")} == {("A", "B", "C")}


class TestConduitLoadBalancing:
    def split(self, conduit):
        e = estate("AB", [("A", "B")], LinkSettings(network_ttl=3,
                                                    conduit_subscriptions=conduit))
        e.subscribe("A", "C1", FOO)
        e.subscribe("B", "C2", FOO, conn="c2")
        e.subscribe("B", "C3", FOO, conn="c3")
        e.run_until_quiet()
        e.send("A", FOO, count=12)
        e.run_until_quiet()
        return (len(e.delivered("A")), len(e.delivered("B", "c2")),
                len(e.delivered("B", "c3")))

    def test_conduit_on_splits_6_3_3(self):
        """Conduit: A sees one subscription from B, so C1 gets 6 and C2, C3 get 3 each."""
        assert self.split(True) == (6, 3, 3)

    def test_conduit_off_splits_4_4_4(self):
        """No conduit: A sees C2 and C3 separately: 4, 4, 4."""
        assert self.split(False) == (4, 4, 4)


class TestStaticPropagation:
    def test_static_a_b_c_then_d_and_e_five_each(self):
        """Static TEST.FOO on A->B->C->{D,E}: 10 messages end 5 at D and 5 at E."""
        s = LinkSettings(network_ttl=3, statically_included=["TEST.FOO"])
        e = estate("ABCDE", [("A", "B"), ("B", "C"), ("C", "D"), ("C", "E")], s)
        e.send("A", FOO, count=10)
        e.run_until_quiet()
        assert [e.held(n, FOO) for n in "ABCDE"] == [0, 0, 0, 5, 5]

    def test_static_duplex_from_b_and_from_c(self):
        """Duplex static B,C,D,E: 10 at B end 5/5 at D, E; 9 at C end 3/3/3 at B, D, E."""
        s = LinkSettings(network_ttl=3, duplex=True, statically_included=["TEST.FOO"])
        links = [("B", "C"), ("C", "D"), ("C", "E")]
        e = estate("BCDE", links, s)
        e.send("B", FOO, count=10)
        e.run_until_quiet()
        assert [e.held(n, FOO) for n in "BCDE"] == [0, 0, 5, 5]
        e = estate("BCDE", links, s)
        e.send("C", FOO, count=9)
        e.run_until_quiet()
        assert [e.held(n, FOO) for n in "BCDE"] == [3, 0, 3, 3]

    def test_closed_loop_stops_before_revisiting(self):
        """A,B,C static duplex loop, 100 at A: 50 each way, each stops one hop short of A."""
        s = LinkSettings(network_ttl=3, duplex=True, statically_included=["TEST.FOO"])
        e = estate("ABC", [("A", "B"), ("B", "C"), ("C", "A")], s)
        e.send("A", FOO, count=100)
        e.run_until_quiet()
        assert [e.held(n, FOO) for n in "ABC"] == [0, 50, 50]
        assert all(len(set(f.path)) == len(f.path) for f in e.forwarded())
        assert len(e.forwarded("B", "C")) == len(e.forwarded("C", "B")) == 50


class TestConduitAndSelectors:
    def run(self, conduit):
        e = estate("ABC", [("A", "B"), ("A", "C")],
                   LinkSettings(conduit_subscriptions=conduit))
        e.subscribe("B", "C1", FOO, selector="region = 'us'")
        e.subscribe("C", "C2", FOO, selector="region = 'emea'")
        e.run_until_quiet()
        for region in ["us", "us", "emea", "emea"] * 3:
            e.send("A", FOO, headers={"region": region})
        e.run_until_quiet()
        return len(e.delivered("B")) + len(e.delivered("C")), e.held("B", FOO) + \
            e.held("C", FOO)

    def test_conduit_with_selectors_strands_queue_messages(self):
        """Conduit drops the selectors: A round-robins blindly and half the messages strand."""
        assert self.run(True) == (6, 6)

    def test_conduit_off_keeps_selectors_and_delivers_all(self):
        """Without conduits A forwards by selector: all 12 delivered, none stranded."""
        assert self.run(False) == (12, 0)


class TestRoutePriority:
    def test_priorities_fall_with_path_length(self):
        """decrease_network_consumer_priority: demand 1..4 hops away gets -5, -8, -9, -10."""
        e = estate("ABCDE", [("A", "B"), ("B", "C"), ("C", "D"), ("D", "E")],
                   LinkSettings(network_ttl=-1, decrease_network_consumer_priority=True))
        e.subscribe("E", "s", FOO)
        e.run_until_quiet()
        got = {ev["broker"]: ev["priority"] for ev in e.events("demand.created")}
        assert got == {"D": -5, "C": -8, "B": -9, "A": -10}

    def test_short_route_first_until_its_prefetch_is_full(self):
        """Triangle: A->B (-5) is used until its prefetch (2) fills, then A->C->B (-8)."""
        e = triangle(LinkSettings(duplex=True, network_ttl=2, prefetch=2,
                                  decrease_network_consumer_priority=True))
        ids = e.send("A", FOO, count=5)
        first = [(s, d) for s, d, _ in e.forwards]
        assert first == [("A", "B"), ("A", "B"), ("A", "C"), ("A", "C")]
        e.run_until_quiet()
        assert sorted(e.delivered("B")) == sorted(ids)

    def test_one_at_a_time_always_takes_the_short_route(self):
        """Under light load every message goes A->B directly."""
        e = triangle(LinkSettings(duplex=True, network_ttl=2,
                                  decrease_network_consumer_priority=True))
        for _ in range(5):
            e.send("A", FOO)
            e.run_until_quiet()
        assert len(e.forwarded("A", "B")) == 5 and e.forwarded("A", "C") == []


class TestSuppressDuplicates:
    SETTINGS = LinkSettings(duplex=True, network_ttl=2, prefetch=2,
                            suppress_duplicate_queue_subscriptions=True)

    def test_duplicate_route_is_suppressed_and_routing_deterministic(self):
        """Triangle: A keeps only the direct subscription; even a burst never goes via C."""
        e = triangle(self.SETTINGS)
        dup = e.events("advisory.dropped", reason="duplicate")
        assert {ev["broker"] for ev in dup} == {"A", "C"}
        assert e.count("demand.created", broker="A") == 1
        ids = e.send("A", FOO, count=5)
        e.run_until_quiet()
        assert sorted(e.delivered("B")) == sorted(ids)
        assert e.forwarded("A", "C") == [] and len(e.forwarded("A", "B")) == 5

    def test_suppressed_route_takes_over_when_the_kept_one_goes(self):
        """Cutting A-B activates the remembered route via C: messages still reach B."""
        e = triangle(self.SETTINGS)
        e.unlink("A", "B")
        e.run_until_quiet()
        assert [ev["peer"] for ev in e.events("demand.created", broker="A")] == ["B", "C"]
        ids = e.send("A", FOO, count=3)
        e.run_until_quiet()
        assert sorted(e.delivered("B")) == sorted(ids)
        assert {tuple(f.path) for f in e.forwarded(dst="B")} == {("A", "C")}

    def test_without_suppression_both_routes_hold_demand(self):
        """The baseline: A holds demand toward B and toward C for the same consumer."""
        e = triangle(LinkSettings(duplex=True, network_ttl=2))
        assert {ev["peer"] for ev in e.events("demand.created", broker="A")} == {"B", "C"}
