"""The tree connector (AMQ-2875): advisory spread, routing, links, validation, abuse."""

import pytest

from treefed.core.actions import Close, Log, Out
from treefed.federation.settings import LinkSettings, TreeSettings
from treefed.federation.testing import Estate, tree_estate
from treefed.wire.frames import Advisory, Hello


#: the plain AMQ-2875 rule: interest from above goes down for queues and topics (issue 18
#: part 4 made queues opt-in when route_unknown_up is on)
PLAIN = ("queue", "topic")


def ancestors(name):
    """R1.2.1 -> [R1.2, R1, HQ]."""
    out = []
    while "." in name:
        name = name.rpartition(".")[0]
        out.append(name)
    return out + (["HQ"] if name != "HQ" else [])


def subtree(names, top):
    return {n for level in names for n in level if n.startswith(top + ".")}


def live_demand(e, consumer):
    held: dict[str, int] = {}
    for ev in e.events("demand.created", consumer=consumer):
        held[ev["broker"]] = held.get(ev["broker"], 0) + 1
    for ev in e.events("demand.removed", consumer=consumer):
        held[ev["broker"]] -= 1
    return {b for b, n in held.items() if n > 0}


def add_pairs(e):
    return [(s, d) for s, d, f in e.advisories if f.kind == "add"]


class TestTreeAdvisories:
    @pytest.mark.parametrize("depth", [2, 3, 5])
    def test_leaf_consumer_climbs_one_frame_per_level(self, depth):
        """A leaf's advisory reaches exactly its ancestors, one frame per level."""
        e, names = tree_estate([2] * depth)
        leaf = names[-1][-1]
        e.subscribe(leaf, "s", f"queue://{leaf}.Incoming")
        e.run_until_quiet()
        chain = [leaf, *ancestors(leaf)]
        assert add_pairs(e) == list(zip(chain, chain[1:]))
        assert live_demand(e, f"{leaf}/c/s") == set(chain[1:])
        assert e.events("advisory.dropped") == []  # no per-sibling refusal noise

    def test_branch_consumer_goes_up_and_down_its_subtree(self):
        """A branch's advisory goes to the root and to its whole subtree, nowhere else."""
        e, names = tree_estate([2, 2, 2], advertise_down=PLAIN)
        e.subscribe("R1.1", "s", "queue://R1.1.Incoming")
        e.run_until_quiet()
        receivers = [d for _, d in add_pairs(e)]
        assert sorted(receivers) == sorted(["R1", "HQ", "R1.1.1", "R1.1.2"])

    def test_root_consumer_reaches_every_broker_once(self):
        """A root consumer's advisory is received exactly once by every other broker."""
        e, names = tree_estate([3, 2, 2], advertise_down=PLAIN)
        e.subscribe("HQ", "s", "queue://HQ.Incoming")
        e.run_until_quiet()
        receivers = [d for _, d in add_pairs(e)]
        everyone = {n for level in names[1:] for n in level}
        assert len(receivers) == len(everyone) and set(receivers) == everyone

    def test_removal_retraces_the_add_exactly(self):
        """Unsubscribing sends one remove over every link the add used, and no other."""
        e, names = tree_estate([2, 2, 2])
        e.subscribe("R2.1", "s", "queue://X")
        e.run_until_quiet()
        adds = add_pairs(e)
        e.unsubscribe("R2.1", "s")
        e.run_until_quiet()
        assert sorted((s, d) for s, d, f in e.advisories if f.kind == "remove") == sorted(adds)
        assert live_demand(e, "R2.1/c/s") == set()


class TestTreeMessages:
    def test_hq_to_store_goes_down_the_right_region_only(self):
        """HQ -> R2.2: forwarded HQ->R2->R2.2 and nowhere else."""
        e, _ = tree_estate([3, 3])
        e.subscribe("R2.2", "s", "queue://R2.2.Incoming")
        e.run_until_quiet()
        ids = e.send("HQ", "queue://R2.2.Incoming")
        e.run_until_quiet()
        assert e.delivered("R2.2") == ids
        assert [(s, d) for s, d, _ in e.forwards] == [("HQ", "R2"), ("R2", "R2.2")]

    def test_store_to_hq(self):
        """A store's message to an HQ queue climbs store -> region -> HQ."""
        e, _ = tree_estate([3, 3])
        e.subscribe("HQ", "s", "queue://HQ.Incoming")
        e.run_until_quiet()
        ids = e.send("R3.1", "queue://HQ.Incoming")
        e.run_until_quiet()
        assert e.delivered("HQ") == ids
        assert [(s, d) for s, d, _ in e.forwards] == [("R3.1", "R3"), ("R3", "HQ")]

    def test_store_to_store_via_lowest_common_ancestor(self):
        """Siblings meet at their region, cousins at HQ; no sibling ever holds demand."""
        e, _ = tree_estate([2, 3])
        e.subscribe("R1.1", "s", "queue://R1.1.Incoming")
        e.run_until_quiet()
        assert live_demand(e, "R1.1/c/s") == {"R1", "HQ"}
        sibling = e.send("R1.3", "queue://R1.1.Incoming")
        e.run_until_quiet()
        assert [(s, d) for s, d, _ in e.forwards] == [("R1.3", "R1"), ("R1", "R1.1")]
        cousin = e.send("R2.2", "queue://R1.1.Incoming")
        e.run_until_quiet()
        assert e.delivered("R1.1") == sibling + cousin
        assert [tuple(f.path) for f in e.forwarded("R1", "R1.1")][-1] == \
            ("R2.2", "R2", "HQ", "R1")
        assert not any(e.forwarded("R2.2", d) for d in ("R1.1", "R1.2", "R1.3", "R2.1"))

    def test_queue_without_consumer_waits_at_root(self):
        """No consumer anywhere: the message climbs to HQ, waits, and goes when one appears."""
        e, _ = tree_estate([2, 2])
        ids = e.send("R1.1", "queue://Lost")
        e.run_until_quiet()
        assert [e.held(n, "queue://Lost") for n in ("R1.1", "R1", "HQ")] == [0, 0, 1]
        e.subscribe("R2.2", "s", "queue://Lost")
        e.run_until_quiet()
        assert e.delivered("R2.2") == ids

    @pytest.mark.parametrize("where", ["R1.2", "R1.1", "R1"])
    def test_waiting_message_goes_back_down_its_own_subtree(self, where):
        """A message that rested at HQ reaches a consumer that appears where it came from."""
        e, _ = tree_estate([2, 2])
        ids = e.send("R1.1", "queue://Later")
        e.run_until_quiet()
        assert e.held("HQ", "queue://Later") == 1
        e.subscribe(where, "s", "queue://Later")
        e.run_until_quiet()
        assert e.delivered(where) == ids
        assert e.held("HQ", "queue://Later") == 0

    def test_topic_without_interest_is_dropped_at_root(self):
        """A topic message nobody wants climbs to HQ, goes no further and is counted."""
        e, _ = tree_estate([2, 2])
        e.send("R1.1", "topic://Nobody")
        e.run_until_quiet()
        assert [(s, d) for s, d, _ in e.forwards] == [("R1.1", "R1"), ("R1", "HQ")]
        hq = e.sites["HQ"].broker.statistics()
        stats = hq["destinations"]["topic://Nobody"]
        assert stats["enqueued"] == 1 and stats["inflight"] == 0
        assert hq["dropped"].get("no_route") == 1
        assert "no_route" not in e.sites["R1"].broker.statistics()["dropped"]

    def test_route_unknown_up_off_confines_messages(self):
        """With route_unknown_up off a leaf keeps what it has no interest for."""
        for on in (True, False):
            e, _ = tree_estate([1, 2], route_unknown_up=on)
            e.subscribe("R1.2", "s", "queue://R1.2.Incoming")
            e.run_until_quiet()
            e.send("R1.1", "queue://R1.2.Incoming")
            e.run_until_quiet()
            assert len(e.delivered("R1.2")) == (1 if on else 0)
            assert e.held("R1.1", "queue://R1.2.Incoming") == (0 if on else 1)

    def test_conduit_keeps_the_or_of_selectors(self):
        """HQ's one demand toward R1 carries the OR of the selectors below, and narrows."""
        e, _ = tree_estate([1, 2])
        e.subscribe("R1.1", "a", "queue://Orders", selector="region = 'a'")
        e.subscribe("R1.2", "b", "queue://Orders", selector="region = 'b'")
        e.run_until_quiet()
        assert e.count("demand.created", broker="HQ") == 1
        for region in "abc":
            e.send("HQ", "queue://Orders", headers={"region": region})
        e.run_until_quiet()
        assert len(e.delivered("R1.1")) == len(e.delivered("R1.2")) == 1
        assert e.held("HQ", "queue://Orders") == 1
        e.unsubscribe("R1.2", "b")  # the merged selector narrows to region = 'a'
        e.run_until_quiet()
        e.send("HQ", "queue://Orders", headers={"region": "b"})
        e.run_until_quiet()
        assert e.held("HQ", "queue://Orders") == 2
        assert e.count("demand.removed", broker="HQ") == 0

    def test_local_then_nearer_demand_wins(self):
        """At R1: a local consumer wins; without it, HQ (1 hop) beats R1.1.1 (2 hops)."""
        e, _ = tree_estate([1, 1, 1], advertise_down=PLAIN)
        for site in ("HQ", "R1.1.1"):
            e.subscribe(site, "s", "queue://Work")
        e.run_until_quiet()
        got = {ev["consumer"]: ev["priority"] for ev in e.events("demand.created", broker="R1")}
        assert got == {"HQ/c/s": -1, "R1.1.1/c/s": -2}
        e.send("R1", "queue://Work", count=3)
        e.run_until_quiet()
        assert len(e.delivered("HQ")) == 3 and e.delivered("R1.1.1") == []
        e.subscribe("R1", "s", "queue://Work")
        e.send("R1", "queue://Work", count=3)
        e.run_until_quiet()
        assert len(e.delivered("R1")) == 3 and len(e.delivered("HQ")) == 3


class TestTreeLinks:
    def setup_estate(self):
        e, names = tree_estate([2, 2], advertise_down=PLAIN)
        e.subscribe("R1.1", "s", "queue://R1.1.Incoming")
        e.subscribe("HQ", "h", "queue://HQ.Incoming")
        e.run_until_quiet()
        return e

    def test_link_drop_discards_subtree_interest_both_ways(self):
        """Cutting R1-HQ: HQ forgets R1's subtree, R1's subtree forgets HQ's consumer."""
        e = self.setup_estate()
        e.unlink("R1", "HQ")
        e.run_until_quiet()
        assert live_demand(e, "R1.1/c/s") == {"R1"}
        assert live_demand(e, "HQ/c/h") == {"R2", "R2.1", "R2.2"}

    def test_reconnect_resends_subtree_and_relearns_from_above(self):
        """Re-linking R1 re-sends R1.1's interest up and relearns HQ's consumer below."""
        e = self.setup_estate()
        e.unlink("R1", "HQ")
        e.run_until_quiet()
        assert e.tree_link("R1", "HQ")
        e.run_until_quiet()
        assert live_demand(e, "R1.1/c/s") == {"R1", "HQ"}
        assert live_demand(e, "HQ/c/h") == {"R1", "R2", "R1.1", "R1.2", "R2.1", "R2.2"}
        down = e.send("HQ", "queue://R1.1.Incoming")
        up = e.send("R1.2", "queue://HQ.Incoming")
        e.run_until_quiet()
        assert e.delivered("R1.1") == down and e.delivered("HQ") == up

    def test_store_moved_to_another_region(self):
        """A store re-parented from R1 to R2 (config change + restart): demand follows it."""
        e = self.setup_estate()
        e.unlink("R1.1", "R1")                      # the store stops...
        e.close_client("R1.1")
        e.run_until_quiet()
        assert live_demand(e, "R1.1/c/s") == set()
        assert e.tree_link("R1.1", "R2")            # ...and comes back under R2
        e.subscribe("R1.1", "s", "queue://R1.1.Incoming")
        e.run_until_quiet()
        assert live_demand(e, "R1.1/c/s") == {"R2", "HQ"}
        assert live_demand(e, "HQ/c/h") >= {"R1.1"}   # it relearned interest from above
        down = e.send("HQ", "queue://R1.1.Incoming")
        sibling = e.send("R1.2", "queue://R1.1.Incoming")   # its old sibling: via HQ now
        up = e.send("R1.1", "queue://HQ.Incoming")
        e.run_until_quiet()
        assert e.delivered("R1.1") == down + sibling and e.delivered("HQ") == up
        assert not any(f for f in e.forwarded("R1", "R1.1"))

    @pytest.mark.parametrize("mode, reaches", [("tree", True), ("mesh", False)])
    def test_inserting_a_layer(self, mode, reaches):
        """Depth 2 -> 3: the tree still reaches every store; mesh TTL 2 strands HQ->store."""
        mesh = LinkSettings(duplex=True, network_ttl=2)
        e, names = tree_estate([2, 2], mode=mode, mesh=mesh)
        stores = names[2]
        for store in stores:
            e.subscribe(store, "s", f"queue://{store}.Incoming")
        e.run_until_quiet()
        e.add("X", tree=TreeSettings("branch") if mode == "tree" else None)
        for region in ("R1", "R2"):
            e.unlink(region, "HQ")
        if mode == "tree":
            assert e.tree_link("X", "HQ")
            assert e.tree_link("R1", "X") and e.tree_link("R2", "X")
        else:
            assert e.link("X", "HQ", mesh)
            assert e.link("R1", "X", mesh) and e.link("R2", "X", mesh)
        e.run_until_quiet()
        for store in stores:
            e.send("HQ", f"queue://{store}.Incoming")
        e.run_until_quiet()
        assert all(bool(e.delivered(store)) is reaches for store in stores)


class TestTreeValidation:
    def refused_at(self, e):
        return {ev["broker"]: ev["reason"] for ev in e.events("link.refused")}

    def test_second_root_is_refused(self):
        """A child declaring itself root gets Error(tree_refused) and Close."""
        e, _ = tree_estate([1])
        hello = Hello(1, "broker", broker_id="HQ2", connector="tree", node_type="root")
        acts = e.sites["HQ"].link_up("L:tree:HQ2", LinkSettings(kind="tree"), hello, e.now,
                                     dialed=False)
        assert [type(a) for a in acts] == [Out, Close, Log]
        assert acts[0].frame.code == "tree_refused" and "second root" in acts[0].frame.message
        assert e.sites["HQ"].bridge("L:tree:HQ2") is None

    def test_leaf_offered_a_child_is_refused_on_both_sides(self):
        """A leaf cannot parent anyone: both ends refuse, no link comes up."""
        e = Estate()
        e.add("L1", tree=TreeSettings("leaf"))
        e.add("L2", tree=TreeSettings("leaf"))
        assert not e.tree_link("L2", "L1")
        assert set(self.refused_at(e)) == {"L1", "L2"}
        assert [f.code for _, _, f in e.errors] == ["tree_refused"]

    def test_cycle_is_refused_on_both_sides(self):
        """R1 dialing its own descendant: refused by the dialer and by the acceptor."""
        e, _ = tree_estate([1, 1, 1, 1])  # HQ - R1 - R1.1 - R1.1.1 (branch) - R1.1.1.1
        e.unlink("R1", "HQ")
        assert not e.tree_link("R1", "R1.1.1")
        refused = self.refused_at(e)
        assert "cycle" in refused["R1"] and "cycle" in refused["R1.1.1"]

    def test_site_not_accepting_children_refuses(self):
        """A site with accept_tree_children off refuses tree hellos."""
        e = Estate()
        e.add("M", accept_tree_children=False)
        e.add("L", tree=TreeSettings("leaf"))
        assert not e.tree_link("L", "M")
        assert "does not accept" in self.refused_at(e)["M"]

    def test_mesh_peer_on_tree_link_is_refused(self):
        """A mesh connector dialing a tree listener is refused."""
        e = Estate()
        e.add("T")
        e.add("X")
        assert not e.link("X", "T", LinkSettings(), accept=LinkSettings(kind="tree"))
        assert "mesh" in self.refused_at(e)["T"]


class TestTreeBadInput:
    def inject(self, e, frame, site="R1", child="R1.1"):
        e.inject(site, e.conn_to(site, child), frame)
        e.run_until_quiet()
        return [ev["reason"] for ev in e.events("advisory.dropped", broker=site)]

    def adv(self, origin, path, consumer="x/c/1", dst="queue://Spoof"):
        return Advisory("add", consumer, dst, origin, None, 0, list(path))

    def test_spoofed_origins_are_malformed(self):
        """A child claiming a sibling's, its parent's or an ancestor's consumer is refused."""
        e, _ = tree_estate([2, 2])
        e.subscribe("R2.1", "s", "queue://R2.1.Incoming")  # HQ learns R2.1 is under R2
        e.run_until_quiet()
        for origin, path in [("R1.2", []), ("R1.2", ["R1.2"]), ("R1", []), ("HQ", []),
                             ("R2.1", ["R2.1"])]:
            self.inject(e, self.adv(origin, path))
        reasons = [ev["reason"] for ev in e.events("advisory.dropped")]
        # R2.1 is unknown at R1, so R1 accepts it; HQ knows it lives under R2 and refuses
        assert reasons == ["malformed"] * 5
        assert [ev["broker"] for ev in e.events("advisory.dropped")][-1] == "HQ"
        assert live_demand(e, "x/c/1") == {"R1"}  # only R1's mistaken, contained entry

    def test_downward_frames_sent_upward_are_tree_rule(self):
        """Echoing HQ's or R1's own interest back up is refused 'tree_rule'."""
        e, _ = tree_estate([2, 2], advertise_down=PLAIN)
        e.subscribe("HQ", "h", "queue://HQ.Incoming")
        e.run_until_quiet()
        (down,) = [f for s, d, f in e.advisories if d == "R1.1"]
        echo = Advisory("add", down.consumer, down.dst, down.origin, None, 0,
                        [*down.path, "R1"])
        assert self.inject(e, echo) == ["tree_rule"]
        assert self.inject(e, self.adv("R1.1.9", ["R1.1.9", "HQ"])) == ["tree_rule"] * 2

    def test_flood_over_the_cap_is_limited(self):
        """A child announcing more than max_demand_per_link entries is refused 'limit'."""
        e, _ = tree_estate([1, 1], max_demand_per_link=3)
        for i in range(5):
            self.inject(e, self.adv("R1.1", [], consumer=f"R1.1/c/{i}", dst=f"queue://F{i}"))
        reasons = [ev["reason"] for ev in e.events("advisory.dropped")]
        assert reasons == ["limit", "limit"]
        assert len(e.sites["R1"].bridge(e.conn_to("R1", "R1.1")).remote) == 3
        assert e.count("demand.created", broker="HQ") == 3
