"""HTTP monitoring of one broker: /metrics (Prometheus), /varz /connz /linkz /demandz
/healthz (DESIGN §10).  ``Monitor`` is started by ``BrokerNode.serve`` when ``[monitor]
listen`` is set; the views and the collector only read the node."""

from treefed.monitor.server import ENDPOINTS, Monitor, parse_listen

__all__ = ["Monitor", "ENDPOINTS", "parse_listen"]
