"""Issue 18 part 2: interest summarisation at tree branches (federation/summary.py).

A retail-shaped estate (HQ, regions, stores; each store consumes its own queue
``queue://Store.<store>.Incoming`` and subscribes to ``topic://Prices``) with
``summary_budget`` on every tree link: HQ's entries stay within regions x budget, every
message reaches exactly one right consumer, nothing is stranded, removal and relinking
work, an old parent gets the plain behaviour, and the default hello / frames are
unchanged."""

from __future__ import annotations

import pytest

from treefed.config import parse_tree_options
from treefed.errors import ConfigError
from treefed.federation.settings import LinkSettings, TreeSettings
from treefed.federation.site import Site
from treefed.federation.summary import OPTION, Pattern
from treefed.federation.testing import Estate
from treefed.wire import codec
from treefed.wire.frames import Advisory, Subtree

OWNED = ("queue://Store.{broker}.>",)


def store_queue(store: str) -> str:
    return f"queue://Store.{store}.Incoming"


def settings(node_type: str, budget: int, **extra) -> LinkSettings:
    return LinkSettings(kind="tree", name="tree", node_type=node_type,
                        summary_budget=budget, summary_owned=OWNED if budget else (),
                        **extra)


def retail(regions: int, stores: int, budget: int, *, consumers: bool = True,
           **extra) -> tuple[Estate, dict[str, list[str]]]:
    est = Estate(log_advisories=False)
    est.add("HQ")
    layout: dict[str, list[str]] = {}
    for r in range(1, regions + 1):
        region = f"R{r}"
        est.add(region, tree=TreeSettings("branch", summarises=bool(budget)))
        assert est.link(region, "HQ", settings("branch", budget, **extra))
        layout[region] = []
        for s in range(1, stores + 1):
            store = f"s{r}-{s}"
            est.add(store, tree=TreeSettings("leaf"))
            assert est.link(store, region, settings("leaf", budget, **extra))
            layout[region].append(store)
            if consumers:
                est.subscribe(store, "q", store_queue(store))
                est.subscribe(store, "t", "topic://Prices")
    est.run_until_quiet()
    return est, layout


def entries_at(site, peer: str) -> int:
    """Interest entries a site holds for one child: learned instances plus covers."""
    bridge = next(b for b in site.links() if b.peer == peer)
    return len(bridge.remote) + len(bridge.covers)


def hq_entries(est: Estate) -> int:
    hq = est.sites["HQ"]
    return sum(len(b.remote) + len(b.covers) for b in hq.links())


class TestBoundedEntries:
    def test_hq_entries_within_regions_times_budget_and_full_delivery(self):
        """4 x 250 stores, budget 20: HQ holds <= 80 entries (plain: 2,000); a message
        from HQ to every store queue, store -> store across regions and a topic
        broadcast each reach exactly the right consumers once; nothing waits anywhere."""
        budget = 20
        est, layout = retail(4, 250, budget)
        assert hq_entries(est) <= 4 * budget
        for region in layout:
            assert entries_at(est.sites["HQ"], region) <= budget
        stores = [s for region in layout.values() for s in region]
        for store in stores:
            est.send("HQ", store_queue(store), f"hq-{store}")
        # store -> store: every store sends to a store of the next region
        for i, store in enumerate(stores):
            target = stores[(i + 250) % len(stores)]
            est.send(store, store_queue(target), f"x-{store}")
        est.send("HQ", "topic://Prices", "price-1")
        est.run_until_quiet()
        for i, store in enumerate(stores):
            source = stores[(i - 250) % len(stores)]
            assert sorted(est.delivered(store, sub="q")) == sorted(
                [f"hq-{store}", f"x-{source}"])
            assert est.delivered(store, sub="t") == ["price-1"]
        for name, site in est.sites.items():
            for dst, pending, *_ in site.broker.destination_sizes():
                assert pending == 0, (name, dst)

    def test_plain_tree_holds_one_entry_per_consumer(self):
        """The figure the budget replaces: without it HQ holds every consumer below."""
        est, _ = retail(2, 30, 0)
        assert hq_entries(est) == 2 * 30 * 2

    def test_under_budget_the_link_stays_precise(self):
        """A subtree whose interest fits the budget advertises exactly as before."""
        est, _ = retail(1, 3, 50)
        hq = est.sites["HQ"]
        assert entries_at(hq, "R1") == 6
        assert not any(b.covers for b in hq.links())
        assert "~summary" not in str([it.consumer for it in hq._active.values()])


class TestExtraHops:
    def test_owned_queue_without_consumer_rests_at_its_region(self):
        """A message for a store queue nobody consumes goes down to the store's region
        (the extra hop) and waits there -- it is not bounced back up after the replay
        delay; when the consumer appears it is delivered once."""
        est, layout = retail(2, 30, 10)
        est.send("HQ", store_queue("s1-7") + ".Late", "late-1")
        est.run_until_quiet()
        assert est.held("R1", store_queue("s1-7") + ".Late") == 1
        assert est.held("HQ", store_queue("s1-7") + ".Late") == 0
        before = len(est.forwarded())
        est.advance(60)   # several replay delays
        est.run_until_quiet()
        assert len(est.forwarded()) == before   # no ping-pong
        est.subscribe("s1-7", "late", store_queue("s1-7") + ".Late")
        est.run_until_quiet()
        assert est.delivered("s1-7", sub="late") == ["late-1"]

    def test_consumer_above_of_an_owned_queue_is_reached(self):
        """HQ consumes a store's queue (no consumer at the store): HQ's interest goes
        down to the owning region, so the store's message climbs to HQ instead of
        resting at the region."""
        est, _ = retail(2, 30, 10)
        est.subscribe("HQ", "audit", store_queue("s2-3") + ".Audit")
        est.run_until_quiet()
        est.send("s2-3", store_queue("s2-3") + ".Audit", "audit-1")
        est.run_until_quiet()
        assert est.delivered("HQ", sub="audit") == ["audit-1"]


class TestRemoval:
    def test_covers_withdrawn_when_interest_fits_then_nothing_left(self):
        """Consumers leave: once the region's interest fits the budget it is sent
        precisely again and the covers and membership are withdrawn; when all are gone
        HQ holds nothing for the region and routes nothing down by ownership."""
        est, layout = retail(1, 20, 10)
        hq = est.sites["HQ"]
        assert next(b for b in hq.links() if b.peer == "R1").covers
        for store in layout["R1"][4:]:
            est.close_client(store)
        est.run_until_quiet()
        bridge = next(b for b in hq.links() if b.peer == "R1")
        assert not bridge.covers and not bridge.members
        assert entries_at(hq, "R1") == 8   # 4 stores x 2 consumers, precise
        assert sorted({it.origin for it in bridge.remote.values()}) == layout["R1"][:4]
        est.send("HQ", store_queue(layout["R1"][0]), "m-0")
        est.run_until_quiet()
        assert est.delivered(layout["R1"][0], sub="q") == ["m-0"]
        for store in layout["R1"][:4]:
            est.close_client(store)
        est.run_until_quiet()
        assert entries_at(hq, "R1") == 0
        assert not hq._active


class TestLinksAndVersions:
    def test_relink_and_region_restart_restore_the_summary(self):
        """The region's uplink flaps (with resync_grace) and the region restarts: HQ
        gets the summary again (a summarising link resyncs in full) and routes."""
        est, layout = retail(2, 30, 10, resync_grace=30.0)
        before = hq_entries(est)
        est.unlink("R1", "HQ")
        est.run_until_quiet()
        assert est.link("R1", "HQ", settings("branch", 10, resync_grace=30.0))
        est.run_until_quiet()
        assert hq_entries(est) == before
        est.send("HQ", store_queue("s1-9"), "after-flap")
        est.run_until_quiet()
        assert est.delivered("s1-9", sub="q") == ["after-flap"]

    def test_old_parent_gets_the_plain_behaviour(self, monkeypatch):
        """A parent that does not answer the summary option (an older broker) gets one
        precise entry per consumer, no cover and no Subtree frame."""
        est = Estate(log_advisories=False)
        est.add("HQ")
        real = Site.hello

        def old_hello(self, *args, **kwargs):
            hello = real(self, *args, **kwargs)
            if self.broker_id == "HQ":
                hello.options.pop(OPTION, None)
            return hello

        monkeypatch.setattr(Site, "hello", old_hello)
        est.add("R1", tree=TreeSettings("branch", summarises=True))
        assert est.link("R1", "HQ", settings("branch", 2))
        for s in range(1, 6):
            est.add(f"s{s}", tree=TreeSettings("leaf"))
            est.link(f"s{s}", "R1", settings("leaf", 2))
            est.subscribe(f"s{s}", "q", store_queue(f"s{s}"))
        est.run_until_quiet()
        assert entries_at(est.sites["HQ"], "R1") == 5
        assert not any(f.cover for f in est.sent_advisories("R1", "HQ"))
        assert est.sites["R1"].counters.get("subtree_frames", 0) == 0
        est.send("HQ", store_queue("s4"), "m")
        est.run_until_quiet()
        assert est.delivered("s4", sub="q") == ["m"]

    def test_cover_from_a_link_that_did_not_agree_is_refused(self):
        est, _ = retail(1, 2, 0)
        r1 = est.sites["R1"]
        hq = est.sites["HQ"]
        conn = est.conn_to("HQ", "R1")
        out = hq.handle_frame(conn, Advisory("add", "R1/~cover/x", "queue://Store.*.>",
                                             "R1", cover=OWNED[0]), est.now)
        assert hq.dropped["malformed"] == 1 and not out
        hq.handle_frame(conn, Subtree(add=["evil"]), est.now)
        assert hq.dropped["malformed"] == 2 and hq.subtree_owner("evil") is None
        assert r1 is not None


class TestDefaultUnchanged:
    def test_default_hello_options_and_frames_are_unchanged(self):
        options = LinkSettings(kind="tree").to_options()
        assert "summary_budget" not in options and "summary_owned" not in options
        adv = Advisory("add", "b1/c1/s1", "queue://A", "b1")
        assert codec.encode(adv).hex() == \
            "0000001c851463616464686231" + "2f63312f7331" + "6971756575653a2f2f41626231"

    def test_budget_option_travels_in_the_hello(self):
        options = settings("leaf", 7).to_options()
        assert options["summary_budget"] == 7 and options["summary_owned"] == list(OWNED)
        assert LinkSettings.from_options(options).summary_owned == OWNED


class TestConfig:
    def test_patterns_are_checked(self):
        assert Pattern.parse("queue://Store.{broker}.>").wild == "queue://Store.*.>"
        assert Pattern.parse(OWNED[0]).broker("queue://Store.s1.Incoming") == "s1"
        assert Pattern.parse(OWNED[0]).broker("queue://Other.s1.Incoming") is None
        for bad in ("topic://T.{broker}", "queue://Store.>", "queue://S{broker}.x",
                    "queue://{broker}.{broker}"):
            with pytest.raises(ConfigError):
                Pattern.parse(bad)

    def test_tree_connector_options(self):
        opts = parse_tree_options({"summary_budget": 50, "summary_owned": list(OWNED)})
        assert opts == {"summary_budget": 50, "summary_owned": OWNED}
        with pytest.raises(ConfigError, match="summary_owned"):
            parse_tree_options({"summary_owned": ["queue://x"]})
        with pytest.raises(ConfigError, match="summary_budget"):
            parse_tree_options({"summary_budget": -1})


class TestTempDestinations:
    def test_temp_queue_interest_stays_precise_across_a_relink(self):
        """A temp queue is owned by one connection: never summarised, and re-sent
        precisely when the summarising link comes back."""
        est, _ = retail(1, 10, 5)
        est.subscribe("R1", "reply", "temp-queue://R1.c.replies", conn="req")
        est.run_until_quiet()

        def temp_at_hq():
            return [it for it in est.sites["HQ"]._active.values()
                    if it.dst.startswith("temp-")]

        assert len(temp_at_hq()) == 1
        est.unlink("R1", "HQ")
        est.run_until_quiet()
        assert est.link("R1", "HQ", settings("branch", 5))
        est.run_until_quiet()
        assert len(temp_at_hq()) == 1


class TestSharedOwnedQueue:
    def test_owned_queue_consumed_in_two_regions_is_delivered_once(self):
        """A store's queue with its own consumer and one at a store of another region:
        every message reaches exactly one of them, from HQ and from both regions, and
        nothing waits anywhere."""
        est, _ = retail(2, 20, 5)
        dst = store_queue("s1-1")
        est.subscribe("s2-1", "cross", dst, conn="x")
        est.run_until_quiet()
        sent = []
        for i in range(10):
            for origin in ("HQ", "s1-5", "s2-5"):
                sent.append(f"{origin}-{i}")
                est.send(origin, dst, sent[-1])
        est.run_until_quiet()
        got = est.delivered("s1-1", sub="q") + est.delivered("s2-1", conn="x", sub="cross")
        assert sorted(got) == sorted(sent)
        for name, site in est.sites.items():
            assert est.held(name, dst) == 0, name


class TestMixedEstates:
    def test_branch_that_cannot_pass_covers_on_keeps_its_children_plain(self):
        """R1's own uplink does not summarise (no budget there): R1 must not accept
        covers from its stores (HQ would have no route for their queues), so the stores
        advertise plainly and HQ's message reaches a store."""
        est = Estate(log_advisories=False)
        est.add("HQ")
        est.add("R1", tree=TreeSettings("branch"))
        assert est.link("R1", "HQ", settings("branch", 0))
        est.add("s1", tree=TreeSettings("branch", summarises=True))
        assert est.link("s1", "R1", settings("branch", 1))
        for i in range(3):
            est.add(f"s1-{i}", tree=TreeSettings("leaf"))
            est.link(f"s1-{i}", "s1", settings("leaf", 1))
            est.subscribe(f"s1-{i}", "q", store_queue(f"s1-{i}"))
        est.run_until_quiet()
        assert not any(b.covers for b in est.sites["R1"].links())
        assert est.sites["s1"]._summary is None
        est.send("HQ", store_queue("s1-2"), "m")
        est.run_until_quiet()
        assert est.delivered("s1-2", sub="q") == ["m"]

    def test_children_summarising_before_a_refused_uplink_are_closed(self):
        """The stores link (and summarise) before the branch's own uplink comes up and
        the parent refuses summaries: the branch closes their links; relinked, they are
        answered plain and HQ's message arrives."""
        est = Estate(log_advisories=False)
        est.add("HQ")
        est.add("R1", tree=TreeSettings("branch"))
        est.add("s1", tree=TreeSettings("branch", summarises=True))
        for i in range(3):
            est.add(f"s1-{i}", tree=TreeSettings("leaf"))
            assert est.link(f"s1-{i}", "s1", settings("leaf", 1))
            est.subscribe(f"s1-{i}", "q", store_queue(f"s1-{i}"))
        est.run_until_quiet()
        assert any(b.covers for b in est.sites["s1"].links())
        assert est.link("R1", "HQ", settings("branch", 0))
        assert est.link("s1", "R1", settings("branch", 1))   # R1 refuses summaries
        est.run_until_quiet()
        assert not est.sites["s1"].links()[1:]   # only the uplink is left
        for i in range(3):
            assert est.link(f"s1-{i}", "s1", settings("leaf", 1))
        est.run_until_quiet()
        assert not any(b.covers for b in est.sites["s1"].links())
        est.send("HQ", store_queue("s1-2"), "m")
        est.run_until_quiet()
        assert est.delivered("s1-2", sub="q") == ["m"]
