"""Security in running brokers (real TLS sockets on 127.0.0.1): authentication in the
hello, permissions on subscribe / send / stat / advisory / forward, tree confinement —
the attack cases of issue #8, each in both connector modes where the mode matters."""

from __future__ import annotations

import dataclasses
import functools
import runpy
from pathlib import Path

import pytest
import trio
from structlog.testing import capture_logs

from treefed.client import ConnectionClosed, connect
from treefed.config import load_config, parse_config
from treefed.errors import RemoteError
from treefed.federation.settings import LinkSettings
from treefed.node import BrokerNode
from treefed.security.passwords import hash_password
from treefed.transport.framed import FramedStream
from treefed.transport.streams import open_tcp
from treefed.transport.tls import client_context, open_tls
from treefed.transport.uri import Endpoint
from treefed.wire.frames import (PROTOCOL_VERSION, Advisory, Error, Forward, ForwardAck,
                                 Hello)

from tests.node.helpers import REPO_ROOT, wait_for

LOCAL = "127.0.0.1"
MODES = ("tree", "mesh")


@functools.cache
def pw_hash(password: str) -> str:
    return hash_password(password, n=2 ** 6)   # test speed; production: defaults


def tls_of(pki, name: str) -> dict:
    cert, key = pki.leaf("127.0.0.1", common_name=name)
    return {"cert": cert, "key": key, "ca": pki.ca_path}


def region_doc(tmp_path, pki, *, authentication: bool = True, confine: bool = True) -> dict:
    """The region: root of the tree / hub of the mesh; stores authenticate to it."""
    return {
        "broker": {"id": "region", "data_dir": str(tmp_path / "region"),
                   "listen": ["ssl://127.0.0.1:0"], "heartbeat_interval": 0.0},
        "logging": {"level": "warning"},
        "security": {
            "authentication": authentication, "failure_delay": 0.05,
            "max_failure_delay": 0.4,
            "user": [
                {"name": "s1", "password_hash": pw_hash("s1-pw"), "groups": ["stores", "brokers"]},
                {"name": "s2", "password_hash": pw_hash("s2-pw"), "groups": ["stores", "brokers"]},
                {"name": "hq-app", "password_hash": pw_hash("hq-pw"), "groups": ["hq"]},
                {"name": "ops", "password_hash": pw_hash("ops-pw"), "groups": ["admins"]},
            ],
            "permission": [
                {"principal": "group:stores",
                 "read": ["queue://Store.{user}.>", "topic://Broadcast.>"],
                 "write": ["queue://HQ.>", "queue://Store.>"]},
                {"principal": "group:hq", "read": ["queue://HQ.>"],
                 "write": ["queue://Store.>", "topic://Broadcast.>"]},
                {"principal": "group:admins", "read": [">"], "admin": [">"]},
            ],
            "tls": tls_of(pki, "region"),
            "tree": {"confine_children": confine,
                     "child_patterns": ["queue://Store.{child}.>"],
                     "broadcast": ["topic://Broadcast.>"],
                     "upward": ["queue://HQ.>", "queue://Store.>"]},
        },
    }


def store_doc(tmp_path, pki, store: str, region_port: int, mode: str) -> dict:
    """A store dialing the region over mutual TLS (its certificate's CN is its id)."""
    up = f"ssl://127.0.0.1:{region_port}"
    doc: dict = {
        "broker": {"id": store, "data_dir": str(tmp_path / store),
                   "listen": ["ssl://127.0.0.1:0"], "heartbeat_interval": 0.0,
                   "accept_tree_children": False},
        "logging": {"level": "warning"},
        "security": {
            "authentication": True,
            "user": [{"name": f"till-{store}", "password_hash": pw_hash("till-pw"),
                      "groups": ["tills"]}],
            "permission": [{"principal": "group:tills",
                            "read": [f"queue://Store.{store}.>", "topic://Broadcast.>"],
                            "write": ["queue://HQ.>", "queue://Store.>"]}],
            "tls": tls_of(pki, store),
        },
    }
    if mode == "tree":
        doc["tree_connector"] = {"node_type": "leaf", "uri": up}
    else:
        doc["network_connector"] = [{"name": "up", "uri": f"static:({up})",
                                     "duplex": True, "network_ttl": 2}]
    return doc


async def start(nursery, doc: dict, **kw) -> tuple[BrokerNode, int]:
    node = BrokerNode(parse_config(doc), **kw)
    (_, port), *_ = await nursery.start(node.serve)
    return node, port


def links_up(node: BrokerNode, count: int) -> bool:
    return len(node.site.statistics()["links"]) == count


def client(pki, port: int, user: str | None = None, password: str | None = None):
    return connect(f"ssl://127.0.0.1:{port}", username=user, password=password,
                   ssl_context=client_context(ca=pki.ca_path))


async def estate(nursery, tmp_path, pki, mode: str, stores=("s1", "s2"), **region_kw):
    region, rport = await start(nursery, region_doc(tmp_path, pki, **region_kw))
    ports = {}
    for store in stores:
        _, ports[store] = await start(nursery, store_doc(tmp_path, pki, store, rport, mode))
    await wait_for(lambda: links_up(region, len(stores)))
    return region, rport, ports


class FakeBroker:
    """A hand-driven broker peer (a compromised store): speaks the link protocol."""

    def __init__(self, framed: FramedStream) -> None:
        self.framed = framed
        self.frames: list = []

    @classmethod
    async def join(cls, pki, port: int, broker_id: str, mode: str, *,
                   cert_name: str | None = None, node_type: str = "leaf",
                   tls: bool = True) -> FakeBroker:
        endpoint = Endpoint("ssl" if tls else "tcp", LOCAL, port)
        if tls:
            cert, key = pki.leaf("127.0.0.1", common_name=cert_name or broker_id)
            stream = await open_tls(endpoint, client_context(ca=pki.ca_path, cert=cert,
                                                             key=key))
        else:
            stream = await open_tcp(endpoint)
        fake = cls(FramedStream(stream))
        if mode == "tree":
            settings = LinkSettings(kind="tree", name="tree", node_type=node_type)
            hello = Hello(PROTOCOL_VERSION, "broker", broker_id=broker_id, name=broker_id,
                          connector="tree", node_type=node_type, link_name="tree",
                          options=settings.to_options())
        else:
            settings = LinkSettings(kind="mesh", name="up", duplex=True, network_ttl=2)
            hello = Hello(PROTOCOL_VERSION, "broker", broker_id=broker_id, name=broker_id,
                          connector="mesh", node_type="mesh", link_name="up", duplex=True,
                          options=settings.to_options())
        await fake.framed.send_frame(hello)
        return fake

    async def send(self, *frames) -> None:
        await self.framed.send_frames(frames)

    async def wait(self, predicate) -> object:
        """Read frames until one satisfies ``predicate``; returns it."""
        while True:
            for frame in self.frames:
                if predicate(frame):
                    return frame
            try:
                self.frames += await self.framed.receive_frames()
            except (trio.EndOfChannel, trio.BrokenResourceError) as exc:
                raise AssertionError(f"link closed; got {self.frames!r}") from exc

    async def error(self, ref: str | None = None) -> Error:
        return await self.wait(lambda f: type(f) is Error and f.ref == ref)

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.framed.stream)


async def receive_bodies(sub, n: int) -> list[bytes]:
    bodies = []
    for _ in range(n):
        msg = await sub.receive()
        bodies.append(msg.body)
        await msg.ack()
    return bodies


@pytest.mark.parametrize("mode", MODES)
class TestSecureEstate:
    async def test_traffic_flows_over_tls_with_authentication(self, nursery, tmp_path,
                                                              pki, mode):
        """Stores link by mutual TLS; HQ->store and store->store messages arrive."""
        with trio.fail_after(15):
            region, rport, ports = await estate(nursery, tmp_path, pki, mode)
            async with client(pki, ports["s1"], "till-s1", "till-pw") as till, \
                    client(pki, ports["s2"], "till-s2", "till-pw") as other, \
                    client(pki, rport, "hq-app", "hq-pw") as hq:
                sub = await till.subscribe("queue://Store.s1.Orders")
                await wait_for(lambda: region.site.statistics()["demand"] >= 1)
                await hq.send("queue://Store.s1.Orders", b"from-hq")
                await other.send("queue://Store.s1.Orders", b"from-s2")
                assert sorted(await receive_bodies(sub, 2)) == [b"from-hq", b"from-s2"]
            stats = region.statistics()
            assert stats["listeners"][0].startswith("ssl://")
            assert stats["security"]["authentication"]

    async def test_spoofed_advisory_for_another_store_is_refused(self, nursery, tmp_path,
                                                                 pki, mode):
        """A compromised store advertising interest in another store's queue gets an
        Error naming it, holds no demand, and receives none of its messages; its own
        interest still works and s1's consumer still gets everything."""
        with trio.fail_after(15):
            region, rport, ports = await estate(nursery, tmp_path, pki, mode, stores=("s1",))
            fake = await FakeBroker.join(pki, rport, "s2", mode)
            await fake.wait(lambda f: type(f) is Hello)
            await wait_for(lambda: links_up(region, 2))
            await fake.send(Advisory("add", "s2/c1/evil", "queue://Store.s1.Orders", "s2"),
                            Advisory("add", "s2/c1/wild", "queue://Store.>", "s2"),
                            Advisory("add", "s2/c1/own", "queue://Store.s2.Orders", "s2"))
            error = await fake.error("s2/c1/evil")
            assert error.code == "not_authorized"
            assert "queue://Store.s1.Orders" in error.message
            assert (await fake.error("s2/c1/wild")).code == "not_authorized"
            async with client(pki, ports["s1"], "till-s1", "till-pw") as till, \
                    client(pki, rport, "hq-app", "hq-pw") as hq:
                sub = await till.subscribe("queue://Store.s1.Orders")
                await wait_for(lambda: any(link["peer"] == "s1" and link["remote_interest"]
                                           for link in region.site.statistics()["links"]))
                for i in range(5):
                    await hq.send("queue://Store.s1.Orders", b"%d" % i)
                assert await receive_bodies(sub, 5) == [b"0", b"1", b"2", b"3", b"4"]
                await hq.send("queue://Store.s2.Orders", b"for-s2")   # its own: allowed
                forward = await fake.wait(lambda f: type(f) is Forward)
                assert forward.dst == "queue://Store.s2.Orders"
            assert not any(type(f) is Forward and "s1" in f.dst for f in fake.frames)
            link = next(x for x in region.site.statistics()["links"] if x["peer"] == "s2")
            assert link["remote_interest"] == 1   # only its own queue
            await fake.aclose()

    async def test_compromised_store_broker_cannot_read_through_the_federation(
            self, nursery, tmp_path, pki, mode):
        """A store broker whose own checks are off lets its till subscribe to another
        store's queue; the region refuses the advisory, the link stays up, the rightful
        store gets every message and the till none."""
        with trio.fail_after(15):
            region, rport, ports = await estate(nursery, tmp_path, pki, mode,
                                                stores=("s2",))
            doc = store_doc(tmp_path, pki, "s1", rport, mode)
            doc["security"] = {"tls": doc["security"]["tls"]}   # authentication off
            s1, s1_port = await start(nursery, doc)
            await wait_for(lambda: links_up(region, 2))
            async with client(pki, s1_port) as thief, \
                    client(pki, ports["s2"], "till-s2", "till-pw") as owner, \
                    client(pki, rport, "hq-app", "hq-pw") as hq:
                stolen = await thief.subscribe("queue://Store.s2.Orders")
                rightful = await owner.subscribe("queue://Store.s2.Orders")
                await wait_for(lambda: region.site.dropped["forbidden"] == 1)
                await wait_for(lambda: region.site.statistics()["demand"] >= 1)
                for i in range(5):
                    await hq.send("queue://Store.s2.Orders", b"%d" % i)
                assert await receive_bodies(rightful, 5) == [b"0", b"1", b"2", b"3", b"4"]
                own = await thief.subscribe("queue://Store.s1.Own")   # link still up
                await wait_for(lambda: region.site.statistics()["demand"] >= 2)
                await hq.send("queue://Store.s1.Own", b"yours")
                assert (await own.receive()).body == b"yours"
                assert stolen.queued == 0
            assert links_up(region, 2)

    async def test_request_reply_across_the_confined_tree(self, nursery, tmp_path, pki,
                                                          mode):
        """An HQ app's request reaches a store's till and the reply comes back on the
        app's temporary queue through the confinement and permissions."""
        with trio.fail_after(15):
            region, rport, ports = await estate(nursery, tmp_path, pki, mode, stores=("s1",))
            async with client(pki, ports["s1"], "till-s1", "till-pw") as till, \
                    client(pki, rport, "hq-app", "hq-pw") as hq:
                sub = await till.subscribe("queue://Store.s1.Prices")
                await wait_for(lambda: region.site.statistics()["demand"] >= 1)

                async def answer():
                    msg = await sub.receive()
                    await msg.reply(b"price:" + msg.body)
                    await msg.ack()

                nursery.start_soon(answer)
                reply = await hq.request("queue://Store.s1.Prices", b"sku-7", timeout=10)
                assert reply.body == b"price:sku-7"

    async def test_forward_outside_permissions_is_refused_and_acked(self, nursery,
                                                                    tmp_path, pki, mode):
        """A store forwarding to a destination it may not write gets Error + ForwardAck;
        an allowed forward on the same link is delivered."""
        with trio.fail_after(15):
            region, rport, _ = await estate(nursery, tmp_path, pki, mode, stores=())
            fake = await FakeBroker.join(pki, rport, "s2", mode)
            await fake.wait(lambda f: type(f) is Hello)
            async with client(pki, rport, "hq-app", "hq-pw") as hq:
                sub = await hq.subscribe("queue://HQ.Sales")
                await fake.send(Forward("topic://Broadcast.Prices", "f1", ["s2"]),
                                Forward("queue://HQ.Sales", "f2", ["s2"], body=b"sale"))
                error = await fake.error("f1")
                assert "topic://Broadcast.Prices" in error.message
                # acked like any forward (one ForwardAck frame may carry f1 and f2)
                await fake.wait(lambda f: type(f) is ForwardAck and "f1" in f.ids)
                msg = await sub.receive()
                assert msg.body == b"sale"
            await fake.aclose()

    async def test_broker_claiming_another_id_is_refused(self, nursery, tmp_path, pki,
                                                         mode):
        """s1's certificate cannot bring up a link as s2: auth_failed, link closed."""
        with capture_logs() as logs, trio.fail_after(15):
            region, rport, _ = await estate(nursery, tmp_path, pki, mode, stores=())
            fake = await FakeBroker.join(pki, rport, "s2", mode, cert_name="s1")
            error = await fake.error(None)
            assert error.code == "auth_failed"
            await fake.aclose()
        failed = [e for e in logs if e["event"] == "auth.failed"]
        assert "may not act as broker s2" in failed[0]["reason"]
        assert links_up(region, 0)

    async def test_store_with_unknown_identity_cannot_join(self, nursery, tmp_path, pki,
                                                           mode):
        """A store whose certificate names no user at the region is refused; the
        dialer shows auth_failed and the other store keeps working."""
        with trio.fail_after(15):
            region, rport, ports = await estate(nursery, tmp_path, pki, mode, stores=("s1",))
            intruder, _ = await start(nursery, store_doc(tmp_path, pki, "s9", rport, mode))
            await wait_for(lambda: "auth_failed" in (intruder.dialers[0].last_error or ""))
            assert links_up(region, 1)
            async with client(pki, ports["s1"], "till-s1", "till-pw") as till, \
                    client(pki, rport, "hq-app", "hq-pw") as hq:
                sub = await till.subscribe("queue://Store.s1.A")
                await wait_for(lambda: region.site.statistics()["demand"] >= 1)
                await hq.send("queue://Store.s1.A", b"ok")
                assert (await sub.receive()).body == b"ok"


class TestClientAuthentication:
    @pytest.mark.parametrize("user,password,reason", [
        ("hq-app", "hunter2-secret", "wrong password"),
        ("nobody", "x", "unknown user"),
        (None, None, "no credentials"),
        ("hq-app", None, "no password given"),
    ])
    async def test_each_failure_is_refused_logged_and_delayed(self, nursery, tmp_path,
                                                              pki, user, password, reason):
        """Wrong credentials: auth_failed error, connection closed, one log line with the
        reason and the delay, never the password."""
        with capture_logs() as logs, trio.fail_after(15):
            region, rport = await start(nursery, region_doc(tmp_path, pki))
            started = trio.current_time()
            with pytest.raises(RemoteError) as info:
                async with client(pki, rport, user, password):
                    pass
            assert trio.current_time() - started >= 0.05   # the failure delay
        assert info.value.code == "auth_failed"
        [line] = [e for e in logs if e["event"] == "auth.failed"]
        assert reason in line["reason"] and line["delay"] == 0.05
        assert "hunter2" not in repr(logs) and all("password" not in e for e in logs)

    async def test_delay_grows_with_repeated_failures(self, nursery, tmp_path, pki):
        """Each further failure from one address waits twice as long (capped)."""
        with capture_logs() as logs, trio.fail_after(15):
            region, rport = await start(nursery, region_doc(tmp_path, pki))
            for _ in range(3):
                with pytest.raises(RemoteError):
                    async with client(pki, rport, "hq-app", "guess"):
                        pass
            async with client(pki, rport, "hq-app", "hq-pw") as ok:   # still possible
                assert ok.connected
        assert [e["delay"] for e in logs if e["event"] == "auth.failed"] == [0.05, 0.1, 0.2]

    async def test_plain_tcp_to_tls_port_is_dropped(self, nursery, tmp_path, pki):
        """A plain-TCP client on the ssl:// listener is dropped and logged; the broker
        serves TLS clients afterwards."""
        with capture_logs() as logs, trio.fail_after(15):
            region, rport = await start(nursery, region_doc(tmp_path, pki))
            with pytest.raises(ConnectionClosed):
                async with connect(f"tcp://127.0.0.1:{rport}", username="hq-app",
                                   password="hq-pw"):
                    pass
            async with client(pki, rport, "hq-app", "hq-pw") as ok:
                assert ok.connected
        assert any(e["event"] == "tls.handshake_failed" for e in logs)

    async def test_wrong_ca_client_cannot_connect(self, nursery, tmp_path, pki):
        """A client that does not trust the broker's CA fails with tls_failed."""
        with trio.fail_after(15):
            region, rport = await start(nursery, region_doc(tmp_path, pki))
            other_ca = tmp_path / "other-ca.pem"
            pki.other_ca.cert_pem.write_to_path(str(other_ca))
            with pytest.raises(ConnectionClosed) as info:
                async with connect(f"ssl://127.0.0.1:{rport}", username="hq-app",
                                   password="hq-pw",
                                   ssl_context=client_context(ca=str(other_ca))):
                    pass
            assert "TLS handshake" in str(info.value) and "certificate" in str(info.value)


class TestClientAuthorization:
    async def test_reading_another_stores_queue_directly_is_refused(self, nursery,
                                                                    tmp_path, pki):
        """A store user subscribing to another store's queue gets not_authorized naming
        it; its own queue keeps working on the same connection."""
        with trio.fail_after(15):
            region, rport = await start(nursery, region_doc(tmp_path, pki))
            async with client(pki, rport, "s1", "s1-pw") as conn, \
                    client(pki, rport, "hq-app", "hq-pw") as hq:
                with pytest.raises(RemoteError) as info:
                    await conn.subscribe("queue://Store.s2.Orders")
                assert info.value.code == "not_authorized"
                assert "queue://Store.s2.Orders" in info.value.message
                with pytest.raises(RemoteError):
                    await conn.subscribe("queue://Store.*.Orders")
                sub = await conn.subscribe("queue://Store.s1.Orders")
                await hq.send("queue://Store.s2.Orders", b"secret")
                await hq.send("queue://Store.s1.Orders", b"mine")
                assert (await sub.receive()).body == b"mine"
            depth = region.statistics()["destinations"]["queue://Store.s2.Orders"]["depth"]
            assert depth == 1   # the secret is still waiting for its rightful reader

    async def test_send_without_write_is_refused(self, nursery, tmp_path, pki):
        """A persistent send to a destination without write permission is refused."""
        with trio.fail_after(15):
            region, rport = await start(nursery, region_doc(tmp_path, pki))
            async with client(pki, rport, "s1", "s1-pw") as conn:
                with pytest.raises(RemoteError) as info:
                    await conn.send("topic://Broadcast.Prices", b"x", persistent=True)
                assert info.value.code == "not_authorized"
                await conn.send("queue://HQ.Sales", b"fine", persistent=True)

    async def test_stat_needs_admin(self, nursery, tmp_path, pki):
        """stat is refused to a non-admin user and works for an admin."""
        with trio.fail_after(15):
            region, rport = await start(nursery, region_doc(tmp_path, pki))
            async with client(pki, rport, "hq-app", "hq-pw") as conn:
                with pytest.raises(RemoteError) as info:
                    await conn.stat()
                assert info.value.code == "not_authorized"
                await conn.send("queue://Store.s1.A", b"still connected")
            async with client(pki, rport, "ops", "ops-pw") as admin:
                assert (await admin.stat())["broker"] == "region"


class TestTreeScope:
    async def test_child_advertising_outside_its_subtree(self, nursery, tmp_path, pki):
        """Without authentication, tree confinement alone keeps a branch to the stores
        it announced, and away from a store another branch owns."""
        events: list = []
        doc = region_doc(tmp_path, pki, authentication=False)
        doc["security"]["tree"]["child_patterns"] = ["queue://Store.{subtree}.>"]
        doc["broker"]["listen"] = ["tcp://127.0.0.1:0"]
        with trio.fail_after(15):
            hq, port = await start(nursery, doc,
                                   event_sink=lambda e, f: events.append((e, f)))
            uk = await FakeBroker.join(pki, port, "region-uk", "tree", node_type="branch",
                                       tls=False)
            fr = await FakeBroker.join(pki, port, "region-fr", "tree", node_type="branch",
                                       tls=False)
            await wait_for(lambda: links_up(hq, 2))
            await uk.send(Advisory("add", "uk-1/c/a", "queue://Store.uk-1.X", "uk-1",
                                   path=["uk-1"]))
            await wait_for(lambda: hq.site.statistics()["demand"] == 1)
            await uk.send(Advisory("add", "region-uk/c/b", "queue://Store.fr-1.X",
                                   "region-uk"))
            assert "queue://Store.fr-1.X" in (await uk.error("region-uk/c/b")).message
            await fr.send(Advisory("add", "uk-1/c/c", "queue://Store.uk-1.Y", "uk-1",
                                   path=["uk-1"]))
            assert (await fr.error("uk-1/c/c")).code == "not_authorized"
            await fr.send(Advisory("add", "fr-1/c/d", "queue://Store.fr-1.Z", "fr-1",
                                   path=["fr-1"]))
            await wait_for(lambda: hq.site.statistics()["demand"] == 2)
            await uk.aclose()
            await fr.aclose()
        dropped = [f for e, f in events if e == "advisory.dropped"]
        assert {d["dst"] for d in dropped if d["reason"] == "forbidden"} == {
            "queue://Store.fr-1.X", "queue://Store.uk-1.Y"}


class TestShippedSecureEstate:
    async def test_configs_secure_runs(self, nursery, tmp_path):
        """configs/secure (HQ, region, two stores) with make-certs.py's certificates:
        an HQ app reaches a store's till over three TLS hops; a till cannot read the
        other store's queue; ops may stat HQ, the HQ app may not."""
        secure = REPO_ROOT / "configs" / "secure"
        runpy.run_path(str(secure / "make-certs.py"))["make_certs"](tmp_path / "certs")
        ca = client_context(ca=str(tmp_path / "certs" / "ca.pem"))

        def site(name: str, parent_port: int | None):
            config = load_config(secure / f"{name}.toml")
            sec, tls = config.security, config.security.tls
            tls = dataclasses.replace(tls, **{k: str(tmp_path / "certs" / Path(
                getattr(tls, k)).name) for k in ("cert", "key", "ca")})
            broker = dataclasses.replace(config.broker, listen=("ssl://127.0.0.1:0",),
                                         data_dir=str(tmp_path / name))
            tree = config.tree_connector and dataclasses.replace(
                config.tree_connector, uri=f"ssl://127.0.0.1:{parent_port}")
            return dataclasses.replace(config, broker=broker, tree_connector=tree,
                                       security=dataclasses.replace(sec, tls=tls))

        async def run(config):
            node = BrokerNode(config)
            (_, port), *_ = await nursery.start(node.serve)
            return node, port

        with trio.fail_after(20):
            hq, hq_port = await run(site("hq", None))
            region, region_port = await run(site("region-uk", hq_port))
            _, s1_port = await run(site("store-uk-0001", region_port))
            await run(site("store-uk-0002", region_port))
            await wait_for(lambda: links_up(region, 3))
            url = "ssl://127.0.0.1:{}".format
            async with connect(url(s1_port), username="till-0001",
                               password="till-0001-demo", ssl_context=ca) as till, \
                    connect(url(hq_port), username="hq-app", password="hq-app-demo",
                            ssl_context=ca) as app, \
                    connect(url(hq_port), username="ops", password="ops-demo",
                            ssl_context=ca) as ops:
                sub = await till.subscribe("queue://Store.store-uk-0001.Orders")
                with pytest.raises(RemoteError):
                    await till.subscribe("queue://Store.store-uk-0002.Orders")
                await wait_for(lambda: hq.site.statistics()["demand"] >= 1)
                await app.send("queue://Store.store-uk-0001.Orders", b"restock")
                assert (await sub.receive()).body == b"restock"
                with pytest.raises(RemoteError):
                    await app.stat()
                stats = await ops.stat()
                assert stats["broker"] == "hq" and stats["security"]["tree_scope"]
