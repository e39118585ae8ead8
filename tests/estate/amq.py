"""activemq.xml files written the way ActiveMQ operators write a store estate."""

from __future__ import annotations

from pathlib import Path

HEAD = """<?xml version="1.0" encoding="UTF-8"?>
<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans.xsd
  http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <bean class="org.springframework.beans.factory.config.PropertyPlaceholderConfigurer"/>
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="{name}"
          dataDirectory="${{activemq.data}}" useJmx="true" schedulerSupport="false">
    <destinationPolicy>
      <policyMap>
        <policyEntries>
          <policyEntry queue=">" producerFlowControl="true" memoryLimit="64 mb"/>
          <policyEntry topic=">" >
            <pendingMessageLimitStrategy>
              <constantPendingMessageLimitStrategy limit="1000"/>
            </pendingMessageLimitStrategy>
          </policyEntry>
        </policyEntries>
      </policyMap>
    </destinationPolicy>
    <managementContext><managementContext createConnector="false"/></managementContext>
    <persistenceAdapter><kahaDB directory="${{activemq.data}}/kahadb"/></persistenceAdapter>
"""
NETWORK = """    <networkConnectors>
      <networkConnector name="{name}-to-{up}" uri="static:(tcp://{up}.{domain}:61616)"
                        duplex="true" networkTTL="{ttl}" conduitSubscriptions="true"
                        decreaseNetworkConsumerPriority="false" dynamicOnly="false"/>
    </networkConnectors>
"""
TAIL = """    <transportConnectors>
      <transportConnector name="openwire" uri="tcp://0.0.0.0:61616?maximumConnections=1000&amp;wireFormat.maxFrameSize=104857600"/>
      <transportConnector name="stomp" uri="stomp://0.0.0.0:61613"/>
    </transportConnectors>
  </broker>
</beans>
"""


def broker_xml(name: str, up: str | None, ttl: int, domain: str = "shop.example") -> str:
    text = HEAD.format(name=name)
    if up is not None:
        text += NETWORK.format(name=name, up=up, ttl=ttl, domain=domain)
    return text + TAIL


def hub_and_spoke(folder: Path, *, regions: int = 1, stores: int = 3,
                  ttl: int = 1) -> list[Path]:
    """HQ <- region-N <- store-N-MMMM, every store and region dialing up, duplex."""
    folder.mkdir(parents=True, exist_ok=True)
    files = [folder / "hq.xml"]
    files[0].write_text(broker_xml("hq", None, ttl))
    for r in range(1, regions + 1):
        region = f"region-{r}"
        path = folder / f"{region}.xml"
        path.write_text(broker_xml(region, "hq", ttl))
        files.append(path)
        for s in range(1, stores + 1):
            store = f"store-{r}-{s:04d}"
            path = folder / f"{store}.xml"
            path.write_text(broker_xml(store, region, ttl))
            files.append(path)
    return files
