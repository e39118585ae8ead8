"""treefed import activemq: <destinationPolicy> -- what treefed honours per destination or
per broker is mapped, everything else is listed with the reason."""

from __future__ import annotations

from pathlib import Path

from tests.estate.test_activemq import guide_broker, write
from treefed.config import load_config
from treefed.estate.activemq import import_files, write_import

MIB = 1024 * 1024

# the kind of policy map production activemq.xml files carry (ActiveMQ's own default
# topic entry, a store queue family without flow control, a prices topic family, every
# queue capped and garbage-collected, a default entry)
POLICY = """<destinationPolicy>
  <policyMap>
    <policyEntries>
      <policyEntry queue="Store.*.Incoming" producerFlowControl="false" memoryLimit="8mb"
                   prioritizedMessages="true"/>
      <policyEntry topic="Prices.>" topicPrefetch="32766" advisoryForSlowConsumers="true">
        <dispatchPolicy><strictOrderDispatchPolicy/></dispatchPolicy>
        <subscriptionRecoveryPolicy>
          <lastImageSubscriptionRecoveryPolicy/>
        </subscriptionRecoveryPolicy>
      </policyEntry>
      <policyEntry queue=">" producerFlowControl="true" memoryLimit="64mb" queuePrefetch="500"
                   maxPageSize="1000" gcInactiveDestinations="true"
                   inactiveTimoutBeforeGC="30000">
        <deadLetterStrategy>
          <individualDeadLetterStrategy queuePrefix="DLQ." useQueueForQueueMessages="true"
                                        processExpired="false"/>
        </deadLetterStrategy>
      </policyEntry>
      <policyEntry topic=">">
        <pendingMessageLimitStrategy>
          <constantPendingMessageLimitStrategy limit="1000"/>
        </pendingMessageLimitStrategy>
      </policyEntry>
    </policyEntries>
    <defaultEntry>
      <policyEntry memoryLimit="16mb">
        <deadLetterStrategy><sharedDeadLetterStrategy processExpired="false"/></deadLetterStrategy>
      </policyEntry>
    </defaultEntry>
  </policyMap>
</destinationPolicy>"""


def broker_with(tmp_path: Path, policy: str, name: str = "brokerA") -> Path:
    return write(tmp_path, f"{name}.xml", guide_broker(name, 61001).replace(
        "</networkConnectors>", "</networkConnectors>\n" + policy))


class TestDestinationPolicy:
    def test_production_policy_map(self, tmp_path):
        """memoryLimit under flow control -> max_bytes, processExpired=false -> discard,
        gc on every queue -> idle_destination_seconds, the default entry last on
        queue://> and topic://>; the written config loads and treefed applies it."""
        r = import_files([broker_with(tmp_path, POLICY)])
        config = r.configs["brokerA"]
        assert [(p.pattern, p.max_bytes, p.on_expiry) for p in config.policies] == [
            ("queue://>", 64 * MIB, "discard"),
            ("queue://>", 16 * MIB, "discard"),     # the default entry: shadowed for queues
            ("topic://>", 16 * MIB, "discard"),     # ... but it is the topics' policy
        ]
        assert config.broker.idle_destination_seconds == 30.0
        (path,) = [p for p in write_import(r, tmp_path / "out") if p.name == "brokerA.toml"]
        loaded = load_config(path)
        assert loaded.broker.idle_destination_seconds == 30.0
        policies = loaded.policy_set()
        assert policies.for_destination("queue://HQ.Incoming").max_bytes == 64 * MIB
        assert policies.for_destination("topic://Prices.EU").on_expiry == "discard"

    def test_every_unmapped_setting_is_listed_with_its_reason(self, tmp_path):
        r = import_files([broker_with(tmp_path, POLICY)])
        why = {u.what: u.reason for u in r.unmapped if "policyEntry" in u.what}
        store = "policyEntry[queue://Store.*.Incoming]"
        assert "only pages past memoryLimit" in why[f"{store}/@memoryLimit"]
        assert "does not spool" in why[f"{store}/@producerFlowControl"]
        assert "arrival order" in why[f"{store}/@prioritizedMessages"]
        prices = "policyEntry[topic://Prices.>]"
        assert "prefetch when they subscribe" in why[f"{prices}/@topicPrefetch"]
        assert "advisory" in why[f"{prices}/@advisoryForSlowConsumers"]
        assert "credit and priority" in why[f"{prices}/dispatchPolicy"]
        assert "last-image" in why[f"{prices}/subscriptionRecoveryPolicy"]
        queues = "policyEntry[queue://>]"
        assert "prefetch when they subscribe" in why[f"{queues}/@queuePrefetch"]
        assert "no pages" in why[f"{queues}/@maxPageSize"]
        assert "the default" in why[f"{queues}/@producerFlowControl"]
        strategy = f"{queues}/deadLetterStrategy/individualDeadLetterStrategy"
        assert "one per broker" in why[strategy]
        assert "DLQ naming" in why[f"{strategy}/@queuePrefix"]
        assert "DLQ naming" in why[f"{strategy}/@useQueueForQueueMessages"]
        assert "prefetch x 10" in why["policyEntry[topic://>]/pendingMessageLimitStrategy"]
        mapped = {"memoryLimit", "gcInactiveDestinations", "inactiveTimoutBeforeGC",
                  "processExpired"}
        assert not [w for w in why if w.rsplit("@", 1)[-1] in mapped
                    and not w.startswith(store)]
        md = (write_import(r, tmp_path / "o")[-1]).read_text()
        assert "queuePrefetch" in md and "only pages past memoryLimit" in md

    def test_broker_wide_settings_only_from_entries_on_everything(self, tmp_path):
        """gcInactiveDestinations on a narrower pattern cannot map (treefed's setting is
        per broker); gcInactiveDestinations="false" on > keeps destinations (0 = never);
        a second > entry disagreeing is listed; a discarding DLQ discards expired
        messages and says what still differs."""
        r = import_files([broker_with(tmp_path, """<destinationPolicy><policyMap>
<policyEntries>
  <policyEntry queue="Store.>" gcInactiveDestinations="true"/>
  <policyEntry queue=">" gcInactiveDestinations="false"/>
  <policyEntry topic=">" gcInactiveDestinations="true">
    <deadLetterStrategy><discardingDeadLetterStrategy/></deadLetterStrategy>
  </policyEntry>
</policyEntries></policyMap></destinationPolicy>""")])
        config = r.configs["brokerA"]
        assert config.broker.idle_destination_seconds == 0.0
        assert [(p.pattern, p.on_expiry) for p in config.policies] == [("topic://>",
                                                                         "discard")]
        why = {u.what: u.reason for u in r.unmapped}
        assert "not per pattern" in why["policyEntry[queue://Store.>]/@gcInactiveDestinations"]
        assert "conflicts with an earlier entry's 0 s" in \
            why["policyEntry[topic://>]/@gcInactiveDestinations"]
        assert "max_redeliveries" in \
            why["policyEntry[topic://>]/deadLetterStrategy/discardingDeadLetterStrategy"]

    def test_gc_default_timeout_and_stray_timeout(self, tmp_path):
        """gcInactiveDestinations without a timeout uses ActiveMQ's 60 s; a timeout
        without gc is listed (it does nothing in ActiveMQ either)."""
        r = import_files([broker_with(tmp_path, """<destinationPolicy><policyMap>
<policyEntries>
  <policyEntry queue=">" gcInactiveDestinations="true"/>
  <policyEntry topic="T.>" inactiveTimoutBeforeGC="5000"/>
</policyEntries></policyMap></destinationPolicy>""")])
        assert r.configs["brokerA"].broker.idle_destination_seconds == 60.0
        why = {u.what: u.reason for u in r.unmapped}
        assert "only used with" in why["policyEntry[topic://T.>]/@inactiveTimoutBeforeGC"]
