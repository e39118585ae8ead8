"""Issue 12 defects 11 and 12 (link half), on running brokers over mutual TLS: a second
link claiming a linked child's id is refused, a client user without the broker role
cannot attach as a tree child, and a peer flooding refused advisories cannot flood the
log -- while the real store's traffic keeps flowing."""

from __future__ import annotations

import trio
from structlog.testing import capture_logs

from treefed.federation.drops import DropDigest
from treefed.wire.frames import Advisory, Hello

from tests.node.helpers import wait_for
from tests.security.test_node_security import (FakeBroker, client, estate, links_up,
                                               receive_bodies, region_doc, start,
                                               store_doc)


async def hq_reaches_s1(pki, region, rport, ports, n: int = 3) -> None:
    """The canary: HQ's application sends to store s1's consumer, every message arrives."""
    async with client(pki, ports["s1"], "till-s1", "till-pw") as till, \
            client(pki, rport, "hq-app", "hq-pw") as hq:
        sub = await till.subscribe("queue://Store.s1.Canary")
        await wait_for(lambda: any(link["peer"] == "s1" and link["remote_interest"]
                                   for link in region.site.statistics()["links"]))
        for i in range(n):
            await hq.send("queue://Store.s1.Canary", b"%d" % i)
        assert await receive_bodies(sub, n) == [b"%d" % i for i in range(n)]


class TestDuplicateChild:
    async def test_second_link_claiming_a_linked_child_is_refused(self, nursery, tmp_path,
                                                                  pki):
        """With s1 linked, another connection presenting s1's credentials is refused
        (tree_refused) instead of taking over s1's subtree; s1 keeps its traffic."""
        with trio.fail_after(20):
            region, rport, ports = await estate(nursery, tmp_path, pki, "tree",
                                                stores=("s1",))
            twin = await FakeBroker.join(pki, rport, "s1", "tree")
            error = await twin.wait(lambda f: type(f).__name__ == "Error")
            assert error.code == "tree_refused" and "already linked" in error.message
            await twin.aclose()
            assert links_up(region, 1)
            [link] = region.site.statistics()["links"]
            assert link["peer"] == "s1" and link["conn"] == "L:tree:s1"
            await hq_reaches_s1(pki, region, rport, ports)

    async def test_the_child_may_link_again_once_its_link_is_gone(self, nursery, tmp_path,
                                                                  pki):
        """The refusal lasts only while the first link is up: after it closes, the same
        id links again (a store reconnecting after a flap)."""
        with trio.fail_after(20):
            region, rport, _ = await estate(nursery, tmp_path, pki, "tree", stores=())
            first = await FakeBroker.join(pki, rport, "s1", "tree")
            await first.wait(lambda f: type(f) is Hello)
            await wait_for(lambda: links_up(region, 1))
            await first.aclose()
            await wait_for(lambda: links_up(region, 0))
            again = await FakeBroker.join(pki, rport, "s1", "tree")
            await again.wait(lambda f: type(f) is Hello)
            await wait_for(lambda: links_up(region, 1))
            await again.aclose()


async def only_the_broker_role_attaches(nursery, tmp_path, pki, doc) -> None:
    """An application's user (``hq-app``) is refused as a tree child; the store ``s1``,
    whose user holds the broker role, links and carries the canary."""
    with trio.fail_after(20):
        region, rport = await start(nursery, doc)
        intruder = await FakeBroker.join(pki, rport, "hq-app", "tree")
        error = await intruder.wait(lambda f: type(f).__name__ == "Error")
        assert error.code == "not_authorized" and "broker role" in error.message
        await intruder.aclose()
        assert links_up(region, 0)
        _, s1_port = await start(nursery, store_doc(tmp_path, pki, "s1", rport, "tree"))
        await wait_for(lambda: links_up(region, 1))
        await hq_reaches_s1(pki, region, rport, {"s1": s1_port})


class TestBrokerRole:
    async def test_client_user_cannot_attach_as_tree_child(self, nursery, tmp_path, pki):
        """With ``[security.tree] child_groups``, a user outside them (an application's
        user) is refused as a tree child; a store user in them links."""
        doc = region_doc(tmp_path, pki)
        doc["security"]["tree"]["child_groups"] = ["stores"]
        await only_the_broker_role_attaches(nursery, tmp_path, pki, doc)

    async def test_by_default_only_the_broker_role_attaches(self, nursery, tmp_path, pki):
        """With no ``child_groups`` configured, the broker role is the ``brokers`` group
        (issue #12 defect 12: secure by default; ``child_groups = []`` opts out)."""
        doc = region_doc(tmp_path, pki)
        doc["security"]["tree"].pop("child_groups", None)
        await only_the_broker_role_attaches(nursery, tmp_path, pki, doc)


class TestLogAmplification:
    async def test_refused_advisories_are_aggregated_per_link_and_reason(
            self, nursery, tmp_path, pki):
        """A child sending 2,000 refused advisories writes a handful of info lines: the
        first refusal per (link, reason) and one summary with the count; received
        advisories are logged at debug only.  The canary keeps flowing."""
        n = 2000
        with capture_logs() as logs, trio.fail_after(30):
            region, rport, ports = await estate(nursery, tmp_path, pki, "tree",
                                                stores=("s1",))
            region._drops = DropDigest(0.2)   # a short window, so the summary comes now
            fake = await FakeBroker.join(pki, rport, "s2", "tree")
            await fake.wait(lambda f: type(f) is Hello)
            await wait_for(lambda: links_up(region, 2))
            # the region is the root here: a path naming the region itself is an echo
            # (tree_rule); a wrong origin is malformed
            await fake.send(*[Advisory("add", f"s2/c/{i}", "queue://Store.s2.Q", "s2",
                                       path=["region"]) for i in range(n)])
            await fake.send(*[Advisory("add", f"s2/c/m{i}", "queue://Store.s2.Q", "x9",
                                       path=[]) for i in range(n)])
            await wait_for(lambda: region.site.dropped["tree_rule"] == n
                           and region.site.dropped["malformed"] == n)
            await wait_for(lambda: any(e["event"] == "advisory.dropped.summary"
                                       and e["reason"] == "malformed" for e in logs))
            await hq_reaches_s1(pki, region, rport, ports)
            await fake.aclose()
        info = [e for e in logs if e.get("log_level") in ("info", "warning", "error")]
        for reason in ("tree_rule", "malformed"):
            # one example per window (a loaded machine may need several windows), one
            # summary per window that counted more: together they account for all n
            examples = [e for e in info if e["event"] == "advisory.dropped"
                        and e["reason"] == reason]
            counts = [e["count"] for e in info if e["event"] == "advisory.dropped.summary"
                      and e["reason"] == reason]
            assert 1 <= len(examples) < 20 and counts
            assert sum(counts) <= n <= sum(counts) + len(examples)
            assert all(e["link"] == "tree" and e["peer"] == "s2" for e in examples)
        assert not any(e["event"] == "advisory.received" for e in info)
        assert len(info) < 100
