"""Mesh connector behaviour on small estates: acceptance, propagation, forwarding."""

from treefed.federation.settings import LinkSettings
from treefed.federation.testing import Estate
from treefed.wire.frames import Advisory

Q = "queue://Q"


def adv(consumer="B/c/1", dst=Q, origin="B", path=(), kind="add", selector=None):
    return Advisory(kind, consumer, dst, origin, selector, 0, list(path))


def one_way(settings=LinkSettings()):
    """A dials B: A accepts B's advisories (messages flow A -> B)."""
    e = Estate()
    e.add("A")
    e.add("B")
    assert e.link("A", "B", settings)
    return e, e.conn_to("A", "B")


def reasons(e, broker):
    return [ev["reason"] for ev in e.events("advisory.dropped", broker=broker)]


def demand_at(e, consumer):
    """Brokers holding demand for ``consumer`` now (created minus removed)."""
    held: dict[str, int] = {}
    for ev in e.events("demand.created", consumer=consumer):
        held[ev["broker"]] = held.get(ev["broker"], 0) + 1
    for ev in e.events("demand.removed", consumer=consumer):
        held[ev["broker"]] -= 1
    return {b for b, n in held.items() if n > 0}


def chain(names, settings):
    e = Estate()
    for n in names:
        e.add(n)
    for a, b in zip(names, names[1:]):
        assert e.link(a, b, settings)
    e.run_until_quiet()
    return e


class TestMeshAcceptance:
    def test_path_length_against_consumer_ttl(self):
        """Paths shorter than consumer_ttl are accepted, longer ones refused 'ttl'."""
        e, conn = one_way(LinkSettings(consumer_ttl=2))
        e.inject("A", conn, adv(consumer="B/c/1", path=[]))
        e.inject("A", conn, adv(consumer="Z/c/1", origin="Z", path=["Z"]))
        e.inject("A", conn, adv(consumer="Y/c/1", origin="Y", path=["Y", "Z"]))
        assert reasons(e, "A") == ["ttl"]
        assert {ev["consumer"] for ev in e.events("demand.created")} == {"B/c/1", "Z/c/1"}

    def test_unlimited_ttl_accepts_long_paths(self):
        """consumer_ttl -1 accepts any path length up to the structural limit."""
        e, conn = one_way(LinkSettings(network_ttl=-1))
        e.inject("A", conn, adv(origin="Z0", path=[f"Z{i}" for i in range(20)]))
        assert reasons(e, "A") == [] and e.count("demand.created") == 1

    def test_loops_are_refused(self):
        """Our own id on the path, or as origin, is refused 'loop'."""
        e, conn = one_way(LinkSettings(network_ttl=5))
        e.inject("A", conn, adv(origin="Z", path=["Z", "A"]))
        e.inject("A", conn, adv(consumer="A/c/9", origin="A", path=[]))
        assert reasons(e, "A") == ["loop", "loop"] and e.count("demand.created") == 0

    def test_permission_order(self):
        """temp -> excluded -> static -> dynamic -> allow, refusals logged 'filter'."""
        e, conn = one_way(LinkSettings(excluded=["X.>", "S2"], statically_included=["S", "S2"],
                                       dynamically_included=["D.>"],
                                       bridge_temp_destinations=False))
        for i, dst in enumerate(["temp-queue://t", "queue://X.1", "queue://S2", "queue://S",
                                 "queue://D.1", "queue://W"]):
            e.inject("A", conn, adv(consumer=f"B/c/{i}", dst=dst))
        dropped = {ev["dst"]: ev["reason"] for ev in e.events("advisory.dropped")}
        assert dropped == {"temp-queue://t": "filter", "queue://X.1": "filter",
                           "queue://S2": "filter", "queue://W": "filter"}
        # queue://S joins the static include's consumer instead of creating demand
        held = {it.dst for it in e.sites["A"].bridge(conn).remote.values()}
        assert held == {"queue://S", "queue://D.1"}

    def test_temporary_destinations_bridge_by_default(self):
        """With bridge_temp_destinations on, a temp queue consumer is accepted."""
        e, conn = one_way()
        e.inject("A", conn, adv(dst="temp-queue://B.reply.1"))
        assert reasons(e, "A") == [] and e.count("demand.created") == 1

    def test_malformed_advisories_are_refused_and_the_link_stays(self):
        """Garbage is refused 'malformed' one by one; a good advisory still works."""
        e, conn = one_way()
        e.inject("A", conn, adv(path=["x"] * 65))
        e.inject("A", conn, adv(origin=""))
        e.inject("A", conn, adv(dst="queue://no good"))
        e.inject("A", conn, adv(selector="a = = 1"))
        e.inject("A", conn, adv(consumer="B/c/ok"))
        assert reasons(e, "A") == ["malformed"] * 4
        assert [ev["consumer"] for ev in e.events("demand.created")] == ["B/c/ok"]
        assert e.sites["A"].bridge(conn) is not None

    def test_demand_cap_per_link(self):
        """Interest beyond max_demand_per_link is refused 'limit'."""
        e, conn = one_way(LinkSettings(max_demand_per_link=2))
        for i in range(3):
            e.inject("A", conn, adv(consumer=f"B/c/{i}", dst=f"queue://Q{i}"))
        assert reasons(e, "A") == ["limit"] and e.count("demand.created") == 2

    def test_accepting_side_of_one_way_link_takes_no_interest(self):
        """On a one-way link the accepting side refuses advisories: it never forwards."""
        e, _ = one_way()
        e.inject("B", e.conn_to("B", "A"), adv(consumer="A/c/1", origin="A"))
        assert reasons(e, "B") == ["malformed"] and e.count("demand.created") == 0

    def test_one_way_receiver_refuses_what_sender_sent(self):
        """One-way: B's re-advertisement beyond ttl is sent, and A refuses it 'ttl'."""
        e = chain(["A", "B", "C"], LinkSettings())
        e.subscribe("C", "s", Q)
        e.run_until_quiet()
        assert [f.path for f in e.sent_advisories("B", "A")] == [["C"]]
        assert reasons(e, "A") == ["ttl"] and reasons(e, "B") == []

    def test_duplex_sender_applies_ttl(self):
        """Duplex: the sender does not send beyond ttl and logs 'ttl' itself."""
        e = chain(["A", "B", "C"], LinkSettings(duplex=True))
        e.subscribe("C", "s", Q)
        e.run_until_quiet()
        assert e.sent_advisories("B", "A") == []
        assert reasons(e, "B") == ["ttl"] and reasons(e, "A") == []

    def test_duplex_sender_applies_loop_check(self):
        """Duplex ring: the interest is never sent back to its origin; the sender logs it."""
        e = Estate()
        for n in "ABC":
            e.add(n)
        s = LinkSettings(duplex=True, network_ttl=5)
        e.link("A", "B", s)
        e.link("B", "C", s)
        e.link("C", "A", s)
        e.subscribe("A", "s", Q)
        e.run_until_quiet()
        assert all(f.origin != "A" for f in e.sent_advisories(dst="A"))
        assert sorted(reasons(e, "B") + reasons(e, "C")) == ["loop", "loop"]


class TestDemandPropagation:
    def test_readvertised_with_longer_paths(self):
        """Each hop appends the sender: paths [], [D], [D, C] along D -> C -> B -> A."""
        e = chain(list("ABCD"), LinkSettings(duplex=True, network_ttl=-1))
        e.subscribe("D", "s", Q)
        e.run_until_quiet()
        paths = {(s, d): f.path for s, d, f in e.advisories}
        assert paths == {("D", "C"): [], ("C", "B"): ["D"], ("B", "A"): ["D", "C"]}
        hops = [(ev["broker"], ev["hops"]) for ev in e.events("advisory.received")]
        assert hops == [("C", 1), ("B", 2), ("A", 3)]
        assert demand_at(e, "D/c/s") == {"A", "B", "C"}

    def test_removal_follows_the_same_chain(self):
        """Unsubscribing sends removes along exactly the links the add took."""
        e = chain(list("ABCD"), LinkSettings(duplex=True, network_ttl=-1))
        e.subscribe("D", "s", Q)
        e.run_until_quiet()
        adds = [(s, d) for s, d, f in e.advisories if f.kind == "add"]
        e.unsubscribe("D", "s")
        e.run_until_quiet()
        removes = [(s, d) for s, d, f in e.advisories if f.kind == "remove"]
        assert removes == adds and demand_at(e, "D/c/s") == set()
        assert all(not c["peer"] for n in "ABCD"
                   for c in e.sites[n].broker.statistics()["consumers"])

    def test_link_loss_removes_and_cascades(self):
        """Cutting C-D removes the demand at C and, by cascade, at B and A."""
        e = chain(list("ABCD"), LinkSettings(duplex=True, network_ttl=-1))
        e.subscribe("D", "s", Q)
        e.run_until_quiet()
        e.unlink("C", "D")
        e.run_until_quiet()
        assert demand_at(e, "D/c/s") == set()
        assert [(s, d) for s, d, f in e.advisories if f.kind == "remove"] == \
            [("C", "B"), ("B", "A")]

    def test_reconnect_replays_interest(self):
        """Re-linking C-D replays D's consumer and the demand comes back everywhere."""
        e = chain(list("ABCD"), LinkSettings(duplex=True, network_ttl=-1))
        e.subscribe("D", "s", Q)
        e.run_until_quiet()
        e.unlink("C", "D")
        e.run_until_quiet()
        assert e.link("C", "D", LinkSettings(duplex=True, network_ttl=-1))
        e.run_until_quiet()
        assert demand_at(e, "D/c/s") == {"A", "B", "C"}

    def test_conduit_is_reference_counted(self):
        """Two consumers at B share one conduit at A; it goes when the last one leaves."""
        e = chain(["A", "B"], LinkSettings())
        e.subscribe("B", "s1", "topic://T")
        e.subscribe("B", "s2", "topic://T", conn="c2")
        e.run_until_quiet()
        assert e.count("demand.created", broker="A") == 1
        e.unsubscribe("B", "s1")
        e.run_until_quiet()
        assert e.count("demand.removed", broker="A") == 0
        e.close_client("B", "c2")
        e.run_until_quiet()
        assert e.count("demand.removed", broker="A") == 1

    def test_static_bridge_exchanges_no_advisories(self):
        """static_bridge: no advisory frames at all, only static includes forward."""
        e = chain(["A", "B"], LinkSettings(static_bridge=True, statically_included=["S"]))
        e.subscribe("B", "s", Q)
        e.subscribe("B", "t", "queue://S")
        e.run_until_quiet()
        e.send("A", Q)
        e.send("A", "queue://S")
        e.run_until_quiet()
        assert e.advisories == [] and e.held("A", Q) == 1
        assert len(e.delivered("B", sub="t")) == 1

    def test_dynamic_includes_narrow_what_is_sent(self):
        """The advertising side never sends interest outside dynamically_included."""
        e = chain(["A", "B"], LinkSettings(dynamically_included=["IN.>"]))
        e.subscribe("B", "s1", "queue://IN.1")
        e.subscribe("B", "s2", "queue://OUT.1")
        e.run_until_quiet()
        assert [f.dst for f in e.sent_advisories("B", "A")] == ["queue://IN.1"]
        assert reasons(e, "A") == reasons(e, "B") == []


class TestMessageForwarding:
    def test_forward_path_records_each_hop(self):
        """A message from A reaches D carrying the path [A, B, C]."""
        e = chain(list("ABCD"), LinkSettings(duplex=True, network_ttl=-1))
        e.subscribe("D", "s", Q)
        e.run_until_quiet()
        (mid,) = e.send("A", Q)
        e.run_until_quiet()
        assert e.delivered("D") == [mid]
        assert [f.path for f in e.forwarded(dst="D")] == [["A", "B", "C"]]

    def test_message_ttl_bounds_hops(self):
        """message_ttl 2: the message stops at C although C has demand toward D."""
        e = chain(list("ABCD"), LinkSettings(duplex=True, consumer_ttl=-1, message_ttl=2))
        e.subscribe("D", "s", Q)
        e.run_until_quiet()
        e.send("A", Q)
        e.run_until_quiet()
        assert e.delivered("D") == [] and e.held("C", Q) == 1

    def test_never_back_into_the_path(self):
        """In a duplex triangle no forward revisits a broker; all reach the consumer."""
        e = Estate()
        for n in "ABC":
            e.add(n)
        s = LinkSettings(duplex=True, network_ttl=3)
        e.link("A", "B", s)
        e.link("B", "C", s)
        e.link("C", "A", s)
        e.subscribe("A", "s", Q)
        e.run_until_quiet()
        ids = e.send("B", Q, count=10)
        e.run_until_quiet()
        assert sorted(e.delivered("A")) == sorted(ids)
        assert all(len(set(f.path)) == len(f.path) for f in e.forwarded())
        assert e.forwarded("C", "B") == [] and e.forwarded("B", "C")


class TestSharedLogFields:
    """The receivers of one fan-out log the same advisory.received / demand.created
    fields object (the event writer renders it once), and the same content a site would
    log alone."""

    def estate(self):
        e = Estate()
        for name in ("R", "S1", "S2", "S3"):
            e.add(name)
        for store in ("S1", "S2", "S3"):
            assert e.link(store, "R", LinkSettings(duplex=True, network_ttl=2))
        e.subscribe("S1", "s", Q)
        e.run_until_quiet()
        return e

    def logged(self, e, event):
        return {b: log.fields for b, log in e.logs
                if log.event == event and log.fields.get("consumer") == "S1/c/s"}

    def test_siblings_share_one_fields_object(self):
        e = self.estate()
        for event in ("advisory.received", "demand.created"):
            at = self.logged(e, event)
            assert at["S2"] is at["S3"], event
        received = self.logged(e, "advisory.received")
        assert received["S2"] == {"link": LinkSettings().name, "peer": "R",
                                  "consumer": "S1/c/s", "dst": Q, "origin": "S1",
                                  "kind": "add", "hops": 2}
        assert received["R"]["hops"] == 1 and received["R"] is not received["S2"]

    def test_a_different_peer_or_link_gets_its_own(self):
        from treefed.federation.sharing import Sharing

        shared = Sharing()
        frame = adv(consumer="X/c/1", origin="X", path=["X"])
        first = shared.received_fields(frame, "mesh", "R")
        assert shared.received_fields(frame, "mesh", "R") is first
        other_peer = shared.received_fields(frame, "mesh", "Q")
        other_link = shared.received_fields(frame, "backup", "R")
        assert other_peer["peer"] == "Q" and other_link["link"] == "backup"
        assert first["peer"] == "R" and first["link"] == "mesh"
