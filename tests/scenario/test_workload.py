"""Tests for treefed.scenario.workload: consumers, messages, steps and expectations."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from treefed.scenario.spec import load_scenario, parse_scenario
from treefed.scenario.workload import SEND_AT, build_plan

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def scenario(timeline: list | None = None, **workload: object):
    doc = {"name": "w", "seed": 3, "topology": {"regions": 2, "stores_per_region": 3},
           "mode": [{"connector": "tree"}],
           "workload": {"hq_consumers": ["queue://HQ.Incoming"],
                        "region_consumers": ["queue://Region.{region}.Incoming"],
                        **workload}}
    if timeline is not None:
        doc["timeline"] = timeline
    return parse_scenario(doc)


class TestConsumers:
    def test_consumers_per_site(self) -> None:
        """Every store gets its queue consumer (and topic subscriber); HQ and regions get
        their templates expanded."""
        plan = build_plan(scenario(store_topic_subscribers=True))
        by_broker = Counter(c.broker for c in plan.consumers)
        assert by_broker["hq"] == 1 and by_broker["region-2"] == 1
        assert by_broker["store-r1-0001"] == 2 and len(plan.consumers) == 1 + 2 + 6 * 2
        region = next(c for c in plan.consumers if c.broker == "region-2")
        assert region.dst == "queue://Region.region-2.Incoming"
        store = {c.sub: c.dst for c in plan.consumers if c.broker == "store-r2-0003"}
        assert store == {"store-queue": "queue://Store.store-r2-0003.Incoming",
                         "store-topic": "topic://Broadcast.Prices"}

    def test_no_store_consumers_when_disabled(self) -> None:
        """store_queue_consumers = false leaves the stores without consumers."""
        plan = build_plan(scenario(store_queue_consumers=False))
        assert all(not c.broker.startswith("store") for c in plan.consumers)


class TestMessages:
    def test_counts_ids_and_send_time(self) -> None:
        """Each workload kind yields its count of messages, unique ids, all at SEND_AT."""
        plan = build_plan(scenario(hq_to_stores=2, stores_to_hq=1, store_to_store=5,
                                   topic_broadcasts=1))
        kinds = Counter(m.kind for m in plan.messages.values())
        assert kinds == {"hq_to_store": 12, "store_to_hq": 6, "store_to_store": 5,
                         "broadcast": 1}
        assert len(set(plan.messages)) == 24
        assert {m.at for m in plan.messages.values()} == {SEND_AT}
        assert [s.action for s in plan.steps] == ["send"]

    def test_store_pairs_depend_on_the_seed_only(self) -> None:
        """The same seed gives the same store-to-store pairs; sender and receiver differ."""
        pairs = [[(m.broker, m.dst) for m in build_plan(scenario(store_to_store=20))
                  .messages.values()] for _ in range(2)]
        assert pairs[0] == pairs[1]
        assert all(f"Store.{src}." not in dst for src, dst in pairs[0])
        other = parse_scenario({**_doc(store_to_store=20), "seed": 4})
        assert [(m.broker, m.dst) for m in build_plan(other).messages.values()] != pairs[0]

    def test_expected_receivers(self) -> None:
        """A store queue message is expected once at that store's consumer; a broadcast at
        every subscriber; a message to a queue nobody consumes is expected nowhere."""
        plan = build_plan(scenario(hq_to_stores=1, topic_broadcasts=1,
                                   store_topic_subscribers=True, stores_to_hq=1))
        to_store = next(m for m in plan.messages.values() if m.kind == "hq_to_store")
        store = to_store.dst.split(".")[1]
        assert to_store.expected == ((store, "store-queue"),) and to_store.units == 1
        broadcast = next(m for m in plan.messages.values() if m.kind == "broadcast")
        assert broadcast.fanout and broadcast.units == 6
        bare = build_plan(parse_scenario({**_doc(stores_to_hq=1),
                                          "workload": {"stores_to_hq": 1}}))
        assert all(m.units == 0 for m in bare.messages.values())
        assert bare.expected == 0


class TestTimeline:
    def test_cut_link_keeps_queue_but_not_topic_expectations(self) -> None:
        """Sent into a partition that heals later, a queue message is still expected; a
        topic message is not expected at the cut-off subscriber."""
        plan = build_plan(scenario(
            store_topic_subscribers=True,
            timeline=[{"at": 2.0, "action": "cut_link", "target": "store-r1-0001"},
                      {"at": 3.0, "action": "send", "target": "hq",
                       "dst": "queue://Store.store-r1-0001.Incoming"},
                      {"at": 3.0, "action": "send", "target": "hq",
                       "dst": "topic://Broadcast.Prices"},
                      {"at": 4.0, "action": "restore_link", "target": "store-r1-0001"}]))
        queue, topic = [m for m in plan.messages.values() if m.kind == "timeline"]
        assert queue.expected == (("store-r1-0001", "store-queue"),)
        assert ("store-r1-0001", "store-topic") not in topic.expected
        assert len(topic.expected) == 5

    def test_killed_producer_sends_nothing_and_restart_reattaches(self) -> None:
        """A send at a killed broker is not planned; restart carries its consumers."""
        plan = build_plan(scenario(timeline=[
            {"at": 2.0, "action": "kill_broker", "target": "region-1"},
            {"at": 3.0, "action": "send", "target": "region-*", "dst": "queue://HQ.Incoming"},
            {"at": 4.0, "action": "restart_broker", "target": "region-1"}]))
        send = next(s for s in plan.steps if s.action == "send")
        assert [m.broker for m in send.messages] == ["region-2"]
        restart = plan.steps[-1]
        assert [c.key for c in restart.consumers] == [("region-1", "region-0")]

    def test_remove_by_destination_and_later_consumer(self) -> None:
        """Removing by dst names the consumers removed; a queue message sent before a
        consumer arrives is expected at that later consumer."""
        plan = build_plan(scenario(timeline=[
            {"at": 2.0, "action": "remove_consumer", "target": "store-r1-0002",
             "dst": "queue://Store.{broker}.Incoming"},
            {"at": 3.0, "action": "send", "target": "hq",
             "dst": "queue://Store.store-r1-0002.Incoming"},
            {"at": 4.0, "action": "add_consumer", "target": "store-r1-0002",
             "dst": "queue://Store.{broker}.Incoming", "consumer": "again"}]))
        removed, send, _ = plan.steps
        assert [c.key for c in removed.consumers] == [("store-r1-0002", "store-queue")]
        msg = send.messages[0]
        assert msg.expected == (("store-r1-0002", "again"),)

    def test_wildcard_and_selector_consumers(self) -> None:
        """A wildcard consumer matches concrete destinations; its selector filters."""
        plan = build_plan(scenario(timeline=[
            {"at": 2.0, "action": "add_consumer", "target": "store-r2-0001",
             "dst": "queue://Orders.>", "consumer": "all"},
            {"at": 2.0, "action": "add_consumer", "target": "store-r2-0002",
             "dst": "queue://Orders.>", "consumer": "picky", "selector": "kind = 'other'"},
            {"at": 3.0, "action": "send", "target": "hq", "dst": "queue://Orders.EU"}]))
        msg = plan.steps[-1].messages[0]
        assert msg.expected == (("store-r2-0001", "all"),)

    def test_insert_layer_step_carries_the_new_estate(self) -> None:
        """insert_layer names the parent and carries the reshaped topology."""
        plan = build_plan(load_scenario(SCENARIOS / "reconfigure.toml"))
        step = next(s for s in plan.steps if s.action == "insert_layer")
        assert step.targets == ("hq",) and step.count == 2
        assert step.topology.depth == 3 and plan.final_topology is step.topology
        assert plan.topology.depth == 2


def _doc(**workload: object) -> dict:
    return {"name": "w", "seed": 3, "topology": {"regions": 2, "stores_per_region": 3},
            "mode": [{"connector": "tree"}], "workload": dict(workload)}
