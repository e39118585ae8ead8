"""Site: the entry point's own duties — logging switch, link errors, stats, clients."""

from treefed.core.actions import Close
from treefed.core.policy import DestinationPolicy, PolicySet
from treefed.events import validate_event
from treefed.federation.settings import LinkSettings, TreeSettings
from treefed.federation.testing import Estate, NotQuiet, tree_estate
from treefed.wire.frames import Advisory, Error, Hello, Send, Subscribe

PER_ADVISORY = ("advisory.sent", "advisory.received", "advisory.dropped",
                "demand.created", "demand.removed")


def pair(settings=LinkSettings(duplex=True), **kw):
    e = Estate(**kw)
    e.add("A")
    e.add("B")
    assert e.link("A", "B", settings)
    return e


class TestSite:
    def test_logging_off_builds_no_advisory_events_but_counts(self):
        """log_advisories=False: no per-advisory Log at all; counters still move."""
        e = pair(log_advisories=False)
        e.subscribe("B", "s", "queue://Q")
        e.inject("A", e.conn_to("A", "B"), Advisory("add", "Z/c/1", "queue://Q", "A", None,
                                                    0, []))
        e.run_until_quiet()
        assert not [log for _, log in e.logs if log.event in PER_ADVISORY]
        stats = e.sites["A"].statistics()
        assert stats["advisories"]["advisories_received"] == 2
        assert stats["advisories"]["demand_created"] == 1
        assert stats["advisories_dropped"] == {"loop": 1}

    def test_every_logged_event_matches_the_schema(self):
        """All Log actions a busy tree run produces validate against events.py."""
        e, _ = tree_estate([2, 2])
        e.subscribe("R1.1", "s", "queue://X", selector="a = 1")
        e.subscribe("HQ", "h", "topic://T")
        e.run_until_quiet()
        e.unlink("R1", "HQ")
        assert not e.tree_link("R1.1", "R2.1")  # refused: leaf parent
        for name, log in e.logs:
            record = {"ts": 0.0, "broker": name, "event": log.event, **log.fields}
            assert validate_event(record) == [], record

    def test_fatal_error_from_peer_closes_only_that_link(self):
        """An Error without ref closes the link; a refusal with ref does not."""
        e = pair()
        site, conn = e.sites["A"], e.conn_to("A", "B")
        assert site.handle_frame(conn, Error("limit", "full", ref="m1"), e.now) == []
        assert site.handle_frame(conn, Error("bye", "going away"), e.now) == [Close(conn)]

    def test_acceptor_keeps_its_own_demand_cap(self):
        """A dialer cannot raise the acceptor's max_demand_per_link through its options."""
        e = Estate()
        e.add("A")
        e.add("B")
        assert e.link("A", "B", LinkSettings(duplex=True, max_demand_per_link=50),
                      accept=LinkSettings(max_demand_per_link=2))
        for i in range(3):
            e.inject("B", e.conn_to("B", "A"),
                     Advisory("add", f"A/c/{i}", f"queue://Q{i}", "A", None, 0, []))
        assert [ev["reason"] for ev in e.events("advisory.dropped")] == ["limit"]
        assert e.sites["A"].bridge(e.conn_to("A", "B")).settings.max_demand_per_link == 50

    def test_request_reply_across_a_link(self):
        """A temp reply queue at A is advertised, so B's reply finds its way back."""
        e = pair()
        e.subscribe("B", "svc", "queue://Service", auto_ack=True)
        e.subscribe("A", "r", "temp-queue://A.reply.1")
        e.run_until_quiet()
        e.send("A", "queue://Service", "req-1", reply_to="temp-queue://A.reply.1")
        e.run_until_quiet()
        (request,) = e.inbox[("B", "c")]
        e.send("B", request.reply_to, "rep-1")
        e.run_until_quiet()
        assert e.delivered("A") == ["rep-1"]

    def test_temp_queue_interest_goes_when_its_owner_closes(self):
        """Closing the owning client removes the temp queue's demand across the link."""
        e = pair()
        e.subscribe("A", "r", "temp-queue://A.reply.1", conn="req")
        e.run_until_quiet()
        e.close_client("A", "req")
        e.run_until_quiet()
        assert e.count("demand.created") == e.count("demand.removed") == 1

    def test_topic_duplicates_suppressed_by_default(self):
        """Duplex triangle, topic subscriber at B: A holds one demand, B gets one copy."""
        e = Estate()
        for n in "ABC":
            e.add(n)
        for a, b in (("A", "B"), ("B", "C"), ("C", "A")):
            e.link(a, b, LinkSettings(duplex=True, network_ttl=2))
        e.subscribe("B", "s", "topic://T")
        e.run_until_quiet()
        assert e.count("demand.created", broker="A") == 1
        e.send("A", "topic://T", count=3)
        e.run_until_quiet()
        assert len(e.delivered("B")) == 3

    def test_failed_subscribe_advertises_nothing(self):
        """A subscription the core refuses (bad selector) creates no interest."""
        e = pair()
        site = e.sites["B"]
        site.client_connected("c", e.now)
        out = site.handle_frame("c", Subscribe("s", "queue://Q", "a = = 1"), e.now)
        assert [a.frame.code for a in out if hasattr(a, "frame")] == ["bad_selector"]
        assert site.statistics()["interest"] == 0

    def test_local_only_consumers_are_not_advertised(self):
        """A consumer on a local_only destination stays unknown to other brokers."""
        e = Estate()
        e.add("A")
        e.add("B", policies=PolicySet([("queue://Local.>", DestinationPolicy(local_only=True))]))
        assert e.link("A", "B", LinkSettings(duplex=True))
        e.subscribe("B", "s1", "queue://Local.X")
        e.subscribe("B", "s2", "queue://Shared.X")
        e.run_until_quiet()
        assert [f.dst for f in e.sent_advisories("B", "A")] == ["queue://Shared.X"]

    def test_client_frames_pass_to_the_broker(self):
        """Sends and other client frames go straight to the core broker."""
        e = pair()
        site = e.sites["A"]
        site.client_connected("p", e.now)
        site.handle_frame("p", Send("queue://Q", "m1"), e.now)
        assert site.statistics()["destinations"]["queue://Q"]["depth"] == 1

    def test_statistics_report_links_and_demand(self):
        """statistics() lists each link with its lane, interest and demand counts."""
        e, _ = tree_estate([1, 1])
        e.subscribe("R1.1", "s", "queue://X")
        e.run_until_quiet()
        stats = e.sites["R1"].statistics()
        lanes = {link["peer"]: (link["lane"], link["remote_interest"], link["demand"])
                 for link in stats["links"]}
        assert lanes == {"HQ": ("parent", 0, 0), "R1.1": ("child", 1, 1)}
        assert stats["tree"] == {"node_type": "branch", "ancestry": ["HQ"]}

    def test_acceptor_without_options_honours_hello(self):
        """No options in the Hello: the acceptor still takes its duplex flag and link name."""
        e = Estate()
        b = e.add("B")
        hello = Hello(1, "broker", broker_id="A", connector="mesh", link_name="up",
                      duplex=True)
        b.link_up("L:up:A", LinkSettings(), hello, e.now, dialed=False)
        bridge = b.bridge("L:up:A")
        assert (bridge.name, bridge.duplex, bridge.accepts, bridge.advertises) == \
            ("up", True, True, True)

    def test_garbage_connector_is_refused(self):
        """An unknown connector kind in the Hello refuses the link, nothing crashes."""
        b = Estate().add("B")
        hello = Hello(1, "broker", broker_id="A", connector="star", options={"prefetch": 1})
        acts = b.link_up("L:x:A", LinkSettings(), hello, 0.0, dialed=False)
        assert acts[0].frame.code == "link_refused" and b.bridge("L:x:A") is None

    def test_flapping_links_leave_no_stale_references(self):
        """After many cut/re-link cycles an interest remembers only live links."""
        e = pair()
        e.subscribe("A", "s", "queue://Q")
        e.run_until_quiet()
        for _ in range(5):
            e.unlink("A", "B")
            assert e.link("A", "B", LinkSettings(duplex=True))
            e.run_until_quiet()
        (it,) = e.sites["A"]._active.values()
        assert [b.up for b in it.sent_to] == [True]

    def test_hello_carries_position_and_options(self):
        """Site.hello: a dialer sends its options; a reply echoes connector and link."""
        site = Estate().add("S", tree=TreeSettings("leaf"))
        dial = site.hello(LinkSettings(kind="tree", name="up", node_type="leaf"))
        assert (dial.connector, dial.node_type, dial.link_name) == ("tree", "leaf", "up")
        assert dial.options["kind"] == "tree"
        reply = site.hello(reply_to=Hello(1, "broker", broker_id="X", connector="mesh",
                                          link_name="l", duplex=True))
        assert (reply.connector, reply.link_name, reply.duplex) == ("mesh", "l", True)


class TestEstate:
    def test_run_until_quiet_gives_up_after_max_rounds(self):
        """Frames still moving after max_rounds raise NotQuiet instead of spinning."""
        e = Estate()
        for n in "ABCD":
            e.add(n)
        for a, b in ("AB", "BC", "CD"):
            e.link(a, b, LinkSettings(duplex=True, network_ttl=-1))
        e.run_until_quiet()
        e.subscribe("D", "s", "queue://Q")
        try:
            e.run_until_quiet(max_rounds=2)
        except NotQuiet:
            pass
        else:
            raise AssertionError("three hops cannot settle in two rounds")

    def test_frames_of_a_cut_wire_are_not_delivered_to_its_successor(self):
        """Frames queued before a cut die with the wire, even if the link is re-made."""
        e = pair()
        e.subscribe("B", "s", "queue://Q")  # queues an advisory B -> A
        e.unlink("A", "B")
        assert e.link("A", "B", LinkSettings(duplex=True))
        e.run_until_quiet()
        assert e.count("advisory.received", broker="A") == 1  # only the replayed one


class TestLeanState:
    """Memory at scale: what many sites hold in common is shared, not copied."""

    @staticmethod
    def hub(ttl=2):
        e = Estate()
        for name in ("R", "S", "T1", "T2"):
            e.add(name)
        for store in ("S", "T1", "T2"):
            assert e.link(store, "R", LinkSettings(duplex=True, network_ttl=ttl))
        return e

    def test_sibling_sites_share_interest_keys_and_paths(self):
        """Two siblings learning one consumer over the same route hold one key object."""
        e = self.hub()
        e.subscribe("S", "s", "queue://Store.S.Incoming")
        e.run_until_quiet()
        (k1,) = e.sites["T1"].bridge(e.conn_to("T1", "R")).remote
        (k2,) = e.sites["T2"].bridge(e.conn_to("T2", "R")).remote
        assert k1 == ("S/c/s", ("S", "R"))
        assert k1 is k2 and k1[1] is k2[1]

    def test_single_demand_holds_its_member_in_a_tuple(self):
        """A non-conduit demand keeps its one interest without a dict; removal empties it."""
        e = self.hub()
        e.subscribe("S", "s", "queue://Store.S.Incoming")
        e.run_until_quiet()
        (it,) = e.sites["T1"].bridge(e.conn_to("T1", "R")).remote.values()
        assert it.demand is not None and it.demand.members == (it,)
        assert it.sent_to == ()    # refused onward by ttl: no list was ever built
        e.unsubscribe("S", "s")
        e.run_until_quiet()
        assert e.sites["T1"].bridge(e.conn_to("T1", "R")).remote == {}
        assert e.count("demand.removed") == e.count("demand.created")

    def test_duplicate_routes_keep_bare_then_listed_rivals(self):
        """A consumer known by one route is held bare; a second route makes a list, and
        losing it leaves the survivor active and bare again."""
        e = Estate()
        for name in "ABC":
            e.add(name)
        s = LinkSettings(duplex=True, network_ttl=2)
        assert e.link("A", "B", s) and e.link("B", "C", s)
        e.subscribe("C", "t", "topic://T")
        e.run_until_quiet()
        rivals = e.sites["A"]._rivals
        assert type(rivals["C/c/t"]) is not list
        assert e.link("A", "C", s)                             # a second, shorter route
        e.run_until_quiet()
        assert len(rivals["C/c/t"]) == 2
        assert e.count("advisory.dropped") >= 1
        e.unlink("A", "C")
        e.run_until_quiet()
        kept = rivals["C/c/t"]
        assert type(kept) is not list and kept.active
