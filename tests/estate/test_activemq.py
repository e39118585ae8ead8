"""treefed import activemq: real activemq.xml files -> mesh configs, topology, what was left."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.estate.amq import hub_and_spoke
from treefed.config import load_config
from treefed.estate.activemq import ImportError_, import_files, parse_activemq, write_import

NS = 'xmlns="http://activemq.apache.org/schema/core"'


def guide_broker(name: str, port: int, connectors: str = "") -> str:
    """The shape of the network-of-brokers guide's Example 2.1 / 2.2."""
    return f"""<beans xmlns="http://www.springframework.org/schema/beans">
<broker {NS}
brokerName="{name}" brokerId="{name[-1]}">
<networkConnectors>
{connectors}
</networkConnectors>
<transportConnectors>
<transportConnector name="openwire" uri="tcp://0.0.0.0:{port}"/>
</transportConnectors>
</broker>
</beans>"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "treefed.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120,
                          env={"PYTHONPATH": str(Path(__file__).resolve().parents[2]),
                               "PATH": "/usr/bin:/bin"})


class TestGuideExamples:
    def test_single_connector_a_to_b(self, tmp_path):
        """Example 2.1: A dials B (networkTTL 3): one link A -> B, TTL 3 on both TTLs."""
        a = write(tmp_path, "a.xml", guide_broker("brokerA", 61001, """
<networkConnector name="linkToBrokerB" uri="static:(tcp://localhost:61002)" networkTTL="3"/>"""))
        b = write(tmp_path, "b.xml", guide_broker("brokerB", 61002))
        r = import_files([a, b])
        assert [(x.dialer, x.acceptor, x.connector) for x in r.links] == \
            [("brokerA", "brokerB", "linkToBrokerB")]
        (nc,) = r.configs["brokerA"].network_connectors
        assert (nc.uri, nc.network_ttl, nc.consumer_ttl, nc.message_ttl, nc.duplex) == \
            ("static:(tcp://localhost:61002)", 3, 3, 3, False)
        assert r.configs["brokerB"].broker.listen == ("tcp://0.0.0.0:61002",)
        assert [u.what for u in r.unmapped] == ["broker/@brokerId", "broker/@brokerId"]

    def test_two_way_duplex_and_three_connectors(self, tmp_path):
        """Examples 2.2-2.4: B -> A back, a duplex A -> B, three named A -> B connectors."""
        conns = "".join(f"""<networkConnector name="link0{i}ToBrokerB"
duplex="{str(i == 1).lower()}" uri="static:(tcp://localhost:61002)" networkTTL="3"/>"""
                        for i in (1, 2, 3))
        a = write(tmp_path, "a.xml", guide_broker("brokerA", 61001, conns))
        b = write(tmp_path, "b.xml", guide_broker("brokerB", 61002, """
<networkConnector name="linkToBrokerA" uri="static:(tcp://localhost:61001)" networkTTL="3"/>"""))
        r = import_files([a, b])
        assert sorted((x.dialer, x.connector) for x in r.links) == [
            ("brokerA", "link01ToBrokerB"), ("brokerA", "link02ToBrokerB"),
            ("brokerA", "link03ToBrokerB"), ("brokerB", "linkToBrokerA")]
        assert [n.duplex for n in r.configs["brokerA"].network_connectors] == \
            [True, False, False]

    def test_filters_and_static_includes(self, tmp_path):
        """Examples 4.1-4.3 and static propagation: the three destination lists."""
        a = write(tmp_path, "a.xml", guide_broker("brokerA", 61001, """
<networkConnector name="linkToBrokerB" uri="static:(tcp://localhost:61002)" networkTTL="3">
<dynamicallyIncludedDestinations>
<queue physicalName="TRADE.STOCK.>"/><topic physicalName="PRICE.STOCK.>"/>
</dynamicallyIncludedDestinations>
<excludedDestinations>
<queue physicalName="TRADE.STOCK.NYSE.*"/><topic physicalName="PRICE.STOCK.NYSE.*"/>
</excludedDestinations>
<staticallyIncludedDestinations>
<queue physicalName="TEST.FOO"/><queue physicalName="TEST.*"/>
</staticallyIncludedDestinations>
</networkConnector>"""))
        brokers, unmapped = parse_activemq(a.read_bytes(), str(a))
        (nc,) = brokers[0].connectors
        assert nc["dynamically_included"] == ["queue://TRADE.STOCK.>", "topic://PRICE.STOCK.>"]
        assert nc["excluded"] == ["queue://TRADE.STOCK.NYSE.*", "topic://PRICE.STOCK.NYSE.*"]
        assert nc["statically_included"] == ["queue://TEST.FOO"]
        wild = [u for u in unmapped if u.value == "TEST.*"]
        assert len(wild) == 1 and "wildcards" in wild[0].reason and wild[0].line == 14

    def test_every_connector_option_maps(self, tmp_path):
        """All the ActiveMQ networkConnector options treefed has are carried over."""
        a = write(tmp_path, "a.xml", guide_broker("brokerA", 61001, """
<networkConnector name="x" uri="static:(tcp://localhost:61002)?maxReconnectDelay=5000"
 networkTTL="2" consumerTTL="1" messageTTL="4" duplex="true" conduitSubscriptions="false"
 decreaseNetworkConsumerPriority="true" suppressDuplicateQueueSubscriptions="true"
 suppressDuplicateTopicSubscriptions="false" bridgeTempDestinations="false"
 staticBridge="true" prefetchSize="10" dynamicOnly="false" userName="u" password="p"/>"""))
        b = write(tmp_path, "b.xml", guide_broker("brokerB", 61002))
        r = import_files([a, b])
        (nc,) = r.configs["brokerA"].network_connectors
        assert (nc.network_ttl, nc.consumer_ttl, nc.message_ttl, nc.duplex,
                nc.conduit_subscriptions, nc.decrease_network_consumer_priority,
                nc.suppress_duplicate_queue_subscriptions,
                nc.suppress_duplicate_topic_subscriptions, nc.bridge_temp_destinations,
                nc.static_bridge, nc.prefetch, nc.username, nc.password) == \
            (2, 1, 4, True, False, True, True, False, False, True, 10, "u", "p")
        assert nc.uri == "static:(tcp://localhost:61002)?maxReconnectDelay=5000"
        dropped = {u.what.rpartition("@")[2]: u.reason for u in r.unmapped
                   if u.broker == "brokerA"}
        assert set(dropped) == {"brokerId", "dynamicOnly"}
        assert "durable" in dropped["dynamicOnly"]

    def test_discovery_connectors_are_reported_not_importable(self, tmp_path):
        """multicast:// and <multicastNetworkConnector> are listed; masterslave becomes
        a failover to the pair."""
        a = write(tmp_path, "a.xml", guide_broker("brokerA", 61001, """
<networkConnector name="mc" uri="multicast://default"/>
<multicastNetworkConnector uri="multicast://224.1.2.3:6255"/>
<networkConnector name="ms" uri="masterslave:(tcp://localhost:61002,tcp://localhost:61003)"/>"""))
        brokers, unmapped = parse_activemq(a.read_bytes(), str(a))
        assert [c["name"] for c in brokers[0].connectors] == ["ms"]
        assert brokers[0].connectors[0]["uri"] == \
            "failover:(tcp://localhost:61002,tcp://localhost:61003)?randomize=false"
        reasons = {u.what: u.reason for u in unmapped}
        assert "not importable" in reasons["networkConnector[mc]/@uri"]
        assert "not importable" in reasons["multicastNetworkConnector"]


    def test_bad_values_are_listed_not_fatal(self, tmp_path):
        """A port out of range, a destination treefed cannot name and a bad policy
        pattern are listed with the reason; the rest of the broker still imports."""
        a = write(tmp_path, "a.xml", guide_broker("brokerA", 61001, """
<networkConnector name="bad" uri="static:(tcp://localhost:99999)"/>
<networkConnector name="ok" uri="static:(tcp://localhost:61002)">
<excludedDestinations><queue physicalName="A..B"/><queue physicalName="C"/></excludedDestinations>
</networkConnector>""").replace("</networkConnectors>", """</networkConnectors>
<destinationPolicy><policyMap><policyEntries>
<policyEntry queue="X..Y" memoryLimit="1mb"/></policyEntries></policyMap></destinationPolicy>"""))
        b = write(tmp_path, "b.xml", guide_broker("brokerB", 61002))
        r = import_files([a, b])
        (nc,) = r.configs["brokerA"].network_connectors
        assert nc.name == "ok" and nc.excluded == ("queue://C",)
        assert r.configs["brokerA"].policies == ()
        reasons = {(u.what, u.value): u.reason for u in r.unmapped}
        assert "out of range" in reasons[("networkConnector[bad]/@uri",
                                          "static:(tcp://localhost:99999)")]
        assert "not a valid destination" in reasons[
            ("networkConnector[ok]/excludedDestinations/queue", "A..B")]
        assert "not a valid destination pattern" in reasons[
            ("policyEntry[queue://X..Y]", "queue://X..Y")]


class TestHubAndSpoke:
    def test_store_estate_topology_and_configs(self, tmp_path):
        """HQ <- 2 regions <- 3 stores each, all on 0.0.0.0:61616 on their own hosts:
        every store links to its region and every region to HQ, configs validate."""
        files = hub_and_spoke(tmp_path / "xml", regions=2, stores=3, ttl=2)
        r = import_files(files)
        assert r.unresolved == []
        assert sorted((x.dialer, x.acceptor) for x in r.links) == sorted(
            [("region-1", "hq"), ("region-2", "hq")]
            + [(f"store-{g}-{s:04d}", f"region-{g}") for g in (1, 2) for s in (1, 2, 3)])
        written = write_import(r, tmp_path / "out")
        for path in written:
            if path.suffix == ".toml":
                config = load_config(path)
                assert config.broker.listen == ("tcp://0.0.0.0:61616",)
        store = load_config(tmp_path / "out" / "store-1-0001.toml")
        (nc,) = store.network_connectors
        assert (nc.duplex, nc.network_ttl, nc.uri) == \
            (True, 2, "static:(tcp://region-1.shop.example:61616)")
        assert store.policies[0].pattern == "queue://>" and \
            store.policies[0].max_bytes == 64 * 1024 * 1024

    def test_nothing_is_silently_dropped(self, tmp_path):
        """Every element and attribute that is not mapped is listed with a reason."""
        files = hub_and_spoke(tmp_path / "xml", regions=1, stores=1)
        r = import_files(files)
        store = {(u.what, u.value): u.reason for u in r.unmapped if u.broker == "store-1-0001"}
        assert "Spring" in store[("transportConnector[openwire]/@uri",
                                  "maximumConnections=1000&wireFormat.maxFrameSize=104857600")] \
            or "no treefed equivalent" in store[("transportConnector[openwire]/@uri",
                                                 "maximumConnections=1000&wireFormat."
                                                 "maxFrameSize=104857600")]
        assert "not served" in store[("transportConnector[stomp]/@uri", "stomp://0.0.0.0:61613")]
        assert ("persistenceAdapter", "") in store and ("managementContext", "") in store
        assert ("broker/@dataDirectory", "${activemq.data}") in store
        assert ("policyEntry[topic://>]/pendingMessageLimitStrategy", "") in store
        assert all(u.line for u in r.unmapped)
        md = (write_import(r, tmp_path / "o")[-1]).read_text()
        assert "pendingMessageLimitStrategy" in md and "kahaDB" not in md

    def test_unknown_peer_is_reported(self, tmp_path):
        """A connector to a broker that was not imported is an unresolved address."""
        files = hub_and_spoke(tmp_path / "xml", regions=1, stores=1)
        r = import_files(files[1:])      # HQ's file left out
        (u,) = r.unresolved
        assert u.dial.broker == "region-1" and "none is named 'hq'" in u.reason


BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol9 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
]>
<broker xmlns="http://activemq.apache.org/schema/core" brokerName="&lol9;"/>
"""
EXTERNAL = """<?xml version="1.0"?>
<!DOCTYPE broker [ <!ENTITY secret SYSTEM "file:///etc/passwd"> ]>
<broker xmlns="http://activemq.apache.org/schema/core" brokerName="&secret;"/>
"""


class TestBadXml:
    def test_malformed_names_file_and_line(self, tmp_path):
        """A tag left open is an error naming the file and the line."""
        bad = write(tmp_path, "bad.xml", guide_broker("A", 1, "").replace("</broker>", "", 1))
        with pytest.raises(ImportError_) as info:
            import_files([bad])
        assert info.value.source == str(bad) and info.value.line == 11
        assert "not well-formed" in info.value.message

    def test_billion_laughs_is_refused_quickly(self, tmp_path):
        """Entity expansion is refused before anything expands."""
        path = write(tmp_path, "lol.xml", BILLION_LAUGHS)
        started = time.perf_counter()
        with pytest.raises(ImportError_) as info:
            import_files([path])
        assert time.perf_counter() - started < 2
        assert info.value.line == 3 and "'lol'" in info.value.message

    def test_external_entity_is_refused(self, tmp_path):
        """An external entity (a local file) is refused, nothing is read."""
        path = write(tmp_path, "xxe.xml", EXTERNAL)
        with pytest.raises(ImportError_) as info:
            import_files([path])
        assert "secret" in info.value.message and "root:" not in info.value.message

    def test_no_broker_element(self, tmp_path):
        """A Spring file with no ActiveMQ broker says so."""
        path = write(tmp_path, "beans.xml", "<beans xmlns='urn:x'><bean/></beans>")
        with pytest.raises(ImportError_, match="no <broker> element"):
            import_files([path])

    def test_cli_exit_status_and_message(self, tmp_path):
        """treefed import activemq: 2 and file:line on stderr for bad XML; 0 and configs
        for good files."""
        lol = write(tmp_path, "lol.xml", BILLION_LAUGHS)
        done = cli("import", "activemq", str(lol), "--out", str(tmp_path / "o"))
        assert done.returncode == 2 and f"{lol}:3: refused" in done.stderr
        files = hub_and_spoke(tmp_path / "xml", regions=1, stores=2)
        done = cli("import", "activemq", *map(str, files), "--out", str(tmp_path / "o"))
        assert done.returncode == 0, done.stderr
        assert "4 brokers, 3 links, 0 unresolved" in done.stderr
        assert sorted(p.name for p in (tmp_path / "o").glob("*.toml")) == \
            ["hq.toml", "region-1.toml", "store-1-0001.toml", "store-1-0002.toml"]


class TestNeverCrashes:
    """Whatever the bytes, the import answers with brokers or an ImportError_ naming the
    file -- never another exception."""

    from hypothesis import given, settings
    from hypothesis import strategies as st

    DOC = guide_broker("brokerA", 61001, """
<networkConnector name="l" uri="static:(tcp://localhost:61002)" networkTTL="3" duplex="true">
<excludedDestinations><queue physicalName="A.>"/></excludedDestinations>
</networkConnector>""").encode()

    @given(st.binary(max_size=300))
    @settings(max_examples=150, deadline=None)
    def test_arbitrary_bytes(self, data):
        """Random bytes."""
        try:
            parse_activemq(data, "x.xml")
        except ImportError_ as exc:
            assert exc.message.startswith("x.xml")

    @given(st.integers(0, 10_000), st.integers(0, 10_000), st.binary(max_size=8))
    @settings(max_examples=150, deadline=None)
    def test_damaged_documents(self, cut, at, junk):
        """A real activemq.xml truncated, or with a few bytes spliced in."""
        doc = self.DOC
        for data in (doc[:cut % (len(doc) + 1)],
                     doc[:at % len(doc)] + junk + doc[at % len(doc):]):
            try:
                parse_activemq(data, "x.xml")
            except ImportError_ as exc:
                assert exc.message.startswith("x.xml")
