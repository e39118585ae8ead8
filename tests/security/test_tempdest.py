"""Temporary destinations belong to the connection that created them (issue #12,
defect 3): no wildcard over temp names anywhere, no consumer but the owner, a tree child
advertises only temp destinations created in its own subtree, and the permission and
scope checks no longer wave temp wildcards through.

The attack: a compromised store joins the region of a three-level estate (store ->
region -> HQ) and advertises ``temp-queue://>`` -- and the exact name of HQ's reply
queue, which it learnt from the interest flowing down the tree -- to take the replies of
HQ's request/reply traffic with another store."""

from __future__ import annotations

import pytest
import trio

from treefed.core.broker import Broker
from treefed.errors import DestinationError, RemoteError
from treefed.security.authz import Authorizer, Rule
from treefed.security.tree_scope import TreeScope
from treefed.wire.frames import Advisory, Error, Forward, Hello

from tests.node.helpers import make_config, start_node, wait_for, port_of
from tests.security.test_node_security import FakeBroker

T = 0.0
REPLY_Q = "temp-queue://replies.6f1c0e9b2d8a4c31"


class TestCore:
    def test_peer_demand_over_temp_wildcard_is_refused(self):
        b = Broker("b")
        with pytest.raises(DestinationError):
            b.add_consumer("L:x", "d1", "temp-queue://>", T, peer="evil")
        with pytest.raises(DestinationError):
            b.add_consumer("L:x", "d2", "temp-topic://replies.*", T, peer="evil")

    def test_peer_demand_for_a_local_owners_temp_is_refused(self):
        b = Broker("b")
        b.add_consumer("c1", "r", REPLY_Q, T)
        with pytest.raises(RemoteError) as err:
            b.add_consumer("L:x", "d1", REPLY_Q, T, peer="evil")
        assert err.value.code == "forbidden"

    def test_client_may_not_consume_a_temp_created_elsewhere(self):
        """Demand for the name came over a link: it lives at another broker."""
        b = Broker("b")
        b.add_consumer("L:up", "d1", REPLY_Q, T, peer="hq")
        with pytest.raises(RemoteError) as err:
            b.add_consumer("c7", "steal", REPLY_Q, T)
        assert err.value.code == "forbidden"
        b.add_consumer("c8", "mine", "temp-queue://replies.other", T)   # its own: fine


class TestPermissions:
    def test_authz_grants_named_temps_only(self):
        authz = Authorizer([Rule("*", "read", "queue://Store.{user}.>")])
        assert authz.check("s1", "read", REPLY_Q)
        assert not authz.check("s1", "read", "temp-queue://>")
        assert not authz.check("s1", "read", "temp-topic://replies.*")

    def test_tree_scope_refuses_temp_wildcards(self):
        scope = TreeScope(["queue://Store.{child}.>"]).for_child("s2", leaf=True)
        assert scope.may_advertise(REPLY_Q)
        assert not scope.may_advertise("temp-queue://>")
        assert not scope.may_send("temp-queue://>")


async def three_levels(nursery, tmp_path, mode: str):
    """HQ (root / hub) <- region (branch / middle) <- honest store s1; a compromised
    store s2 (hand-driven) joins the region.  Plain TCP, no authentication: the defence
    under test is the federation's own, which holds on an open estate too."""
    hq_cfg = make_config(tmp_path / "hq", "hq")
    hq, hq_uri = await start_node(nursery, hq_cfg)
    if mode == "tree":
        region_cfg = make_config(tmp_path / "region", "region",
                                 tree={"node_type": "branch", "uri": hq_uri})
    else:
        region_cfg = make_config(tmp_path / "region", "region", mesh=[
            {"name": "up", "uri": f"static:({hq_uri})", "duplex": True, "network_ttl": 3}])
    region, region_uri = await start_node(nursery, region_cfg)
    if mode == "tree":
        s1_cfg = make_config(tmp_path / "s1", "s1", accept_tree_children=False,
                             tree={"node_type": "leaf", "uri": region_uri})
    else:
        s1_cfg = make_config(tmp_path / "s1", "s1", mesh=[
            {"name": "up", "uri": f"static:({region_uri})", "duplex": True,
             "network_ttl": 3}])
    s1, s1_uri = await start_node(nursery, s1_cfg)
    await wait_for(lambda: len(region.site.links()) == 2)
    fake = await FakeBroker.join(None, port_of(region_uri), "s2", mode, tls=False)
    await fake.wait(lambda f: type(f) is Hello)
    await wait_for(lambda: len(region.site.links()) == 3)
    return hq, hq_uri, region, s1, s1_uri, fake


@pytest.mark.parametrize("mode", ("tree", "mesh"))
async def test_compromised_store_cannot_take_hq_replies(nursery, tmp_path, mode):
    from treefed.client import connect
    with trio.fail_after(20):
        hq, hq_uri, region, s1, s1_uri, fake = await three_levels(nursery, tmp_path, mode)
        async with connect(hq_uri) as app, connect(s1_uri) as till:
            requests = await till.subscribe("queue://Store.s1.Prices")
            replies = await app.subscribe(REPLY_Q)
            # HQ's interest in its reply queue reaches the compromised store: its name
            # is no secret there (tree: root interest flows down; mesh: it floods)
            await fake.wait(lambda f: type(f) is Advisory and f.dst == REPLY_Q)
            attack = [Advisory("add", "s2/c1/wild", "temp-queue://>", "s2"),
                      Advisory("add", "s2/c1/named", REPLY_Q, "s2")]
            await fake.send(*attack)
            for adv in attack:
                assert (await fake.error(adv.consumer)).code == "not_authorized"
            await wait_for(lambda: region.site.dropped["forbidden"] >= len(attack))
            await wait_for(lambda: hq.site.statistics()["demand"] >= 1)

            async def answer(n):
                for _ in range(n):
                    msg = await requests.receive()
                    await msg.reply(b"re:" + msg.body)
                    await msg.ack()

            n = 20
            nursery.start_soon(answer, n)
            for i in range(n):
                await app.send("queue://Store.s1.Prices", b"%d" % i, reply_to=REPLY_Q)
            got = []
            for _ in range(n):
                msg = await replies.receive()
                got.append(msg.body)
                await msg.ack()
            assert sorted(got) == sorted(b"re:%d" % i for i in range(n))
        assert not any(type(f) is Forward and f.dst.startswith("temp-")
                       for f in fake.frames)
        link = next(x for x in region.site.statistics()["links"] if x["peer"] == "s2")
        assert link["remote_interest"] == 0
        await fake.aclose()


async def test_client_at_another_store_cannot_consume_hq_reply_queue(nursery, tmp_path):
    """A till at s1 that learnt HQ's reply queue name (e.g. from a reply_to header)
    cannot subscribe to it: the name was created at HQ, demand for it came from above."""
    from treefed.client import connect
    with trio.fail_after(20):
        hq, hq_uri, region, s1, s1_uri, fake = await three_levels(nursery, tmp_path,
                                                                  "tree")
        async with connect(hq_uri) as app, connect(s1_uri) as thief:
            await app.subscribe(REPLY_Q)
            await wait_for(lambda: s1.site.statistics()["demand"] >= 1)
            with pytest.raises(RemoteError) as err:
                await thief.subscribe(REPLY_Q)
            assert err.value.code == "forbidden"
            with pytest.raises(RemoteError):
                await thief.subscribe("temp-queue://>")
        await fake.aclose()


class TestMeshTriangle:
    def test_owner_interest_by_two_routes_is_kept_another_claim_refused(self):
        """Mesh: A's reply queue reaches C directly and through B (both kept: one
        owner); a claim by another connection on the same name is refused."""
        from treefed.federation import LinkSettings
        from treefed.federation.testing import Estate
        e = Estate()
        for name in "ABC":
            e.add(name)
        s = LinkSettings(duplex=True, network_ttl=2)
        assert e.link("A", "B", s) and e.link("B", "C", s) and e.link("A", "C", s)
        e.subscribe("A", "r", REPLY_Q)
        e.run_until_quiet()
        c = e.sites["C"]
        assert sum(len([i for i in b.remote.values() if i.dst == REPLY_Q])
                   for b in c.links()) == 2
        assert not e.events("advisory.dropped", reason="forbidden")
        e.inject("C", e.conn_to("C", "B"),
                 Advisory("add", "B/evil/x", REPLY_Q, "B", None, 0, []))
        e.run_until_quiet()
        assert len(e.events("advisory.dropped", reason="forbidden")) == 1
