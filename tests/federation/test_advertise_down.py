"""Issue 18 part 4: downward advertisement per kind.  With route_unknown_up a queue
message climbs to its consumer anyway, so queue interest is not sent down by default
(no spill); topic interest still is; the plain AMQ-2875 rule stays one option away."""

import pytest

from treefed.config import parse_config
from treefed.errors import ConfigError
from treefed.federation.settings import LinkSettings
from treefed.federation.testing import tree_estate

PLAIN = ("queue", "topic")


def receivers(e, consumer):
    return sorted(d for s, d, f in e.advisories if f.kind == "add" and f.consumer == consumer)


class TestDefault:
    def test_queue_interest_from_above_stays_up(self):
        """HQ's and a region's queue consumers are advertised to nobody below; their
        messages from every store still arrive (they climb)."""
        e, names = tree_estate([2, 3])
        e.subscribe("HQ", "h", "queue://HQ.In")
        e.subscribe("R1", "r", "queue://R1.In")
        e.run_until_quiet()
        assert receivers(e, "HQ/c/h") == [] and receivers(e, "R1/c/r") == ["HQ"]
        sent = [mid for store in names[2] for mid in e.send(store, "queue://HQ.In")]
        sent_r = [mid for store in names[2] for mid in e.send(store, "queue://R1.In")]
        e.run_until_quiet()
        assert sorted(e.delivered("HQ")) == sorted(sent)
        assert sorted(e.delivered("R1")) == sorted(sent_r)

    def test_topic_interest_still_goes_down(self):
        """A topic subscriber at HQ is known at every broker (a topic copy must leave a
        store that also has local subscribers)."""
        e, names = tree_estate([2, 2])
        e.subscribe("HQ", "t", "topic://News")
        e.subscribe("R1.1", "t", "topic://News")
        e.run_until_quiet()
        assert receivers(e, "HQ/c/t") == ["R1", "R1.1", "R1.2", "R2", "R2.1", "R2.2"]
        e.send("R1.1", "topic://News")
        e.run_until_quiet()
        assert len(e.delivered("HQ")) == 1 and len(e.delivered("R1.1")) == 1

    def test_without_route_unknown_up_queues_go_down(self):
        """route_unknown_up off: queue interest must go down, or messages strand."""
        e, names = tree_estate([1, 2], route_unknown_up=False)
        e.subscribe("HQ", "h", "queue://HQ.In")
        e.run_until_quiet()
        assert receivers(e, "HQ/c/h") == ["R1", "R1.1", "R1.2"]
        e.send("R1.2", "queue://HQ.In")
        e.run_until_quiet()
        assert len(e.delivered("HQ")) == 1

    def test_temporary_destinations_always_go_down(self):
        """A requester's temp queue at HQ is known below, so a store's reply reaches it
        (the fallback route up covers queue:// and topic:// only)."""
        e, names = tree_estate([1, 1])
        e.subscribe("HQ", "r", "temp-queue://HQ.c.1")
        e.run_until_quiet()
        assert receivers(e, "HQ/c/r") == ["R1", "R1.1"]
        e.send("R1.1", "temp-queue://HQ.c.1")
        e.run_until_quiet()
        assert len(e.delivered("HQ", sub="r")) == 1

    def test_plain_rule_is_an_option(self):
        """advertise_down = ["queue", "topic"] restores AMQ-2875 rule 4."""
        e, names = tree_estate([2, 2], advertise_down=PLAIN)
        e.subscribe("HQ", "h", "queue://HQ.In")
        e.run_until_quiet()
        assert len(receivers(e, "HQ/c/h")) == 6

    def test_a_child_that_joins_later_hears_only_its_kinds(self):
        """The replay on link-up follows the child's advertise_down too."""
        e, names = tree_estate([1, 1])
        e.subscribe("HQ", "h", "queue://HQ.In")
        e.subscribe("HQ", "t", "topic://T")
        e.run_until_quiet()
        e.add("R1.9", tree=e.sites["R1.1"].tree)
        e.advisories.clear()
        assert e.tree_link("R1.9", "R1")
        e.run_until_quiet()
        assert [(d, f.dst) for s, d, f in e.advisories if d == "R1.9"] == [("R1.9", "topic://T")]


class TestSettings:
    def test_default_follows_route_unknown_up(self):
        """None resolves to topics only with route_unknown_up, both kinds without."""
        assert LinkSettings(kind="tree").advertise_down == ("topic",)
        assert LinkSettings(kind="tree", route_unknown_up=False).advertise_down == PLAIN
        assert LinkSettings(advertise_down=["queue"]).advertise_down == ("queue",)

    def test_bad_kind_is_refused(self):
        """Only queue and topic may be named."""
        with pytest.raises(ConfigError):
            LinkSettings(advertise_down=("temp",))

    def test_travels_in_the_hello_options(self):
        """The child's choice reaches the parent (from_options round trip)."""
        s = LinkSettings(kind="tree", node_type="leaf", advertise_down=PLAIN)
        assert LinkSettings.from_options(s.to_options()).advertise_down == PLAIN

    def test_tree_connector_config(self):
        """[tree_connector] advertise_down is validated and reaches the link settings."""
        doc = {"broker": {"id": "s"}, "tree_connector": {
            "uri": "tcp://127.0.0.1:1", "advertise_down": ["queue", "topic"]}}
        assert parse_config(doc).tree_connector.link_settings().advertise_down == PLAIN
        doc["tree_connector"]["advertise_down"] = ["queues"]
        with pytest.raises(ConfigError, match="advertise_down"):
            parse_config(doc)
