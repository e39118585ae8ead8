"""treefed.node: the trio shell — ``BrokerNode`` runs one site's listeners, links and
site task around the pure ``federation.Site``; ``run_broker`` is the broker process."""

from treefed.node.node import BrokerNode, Dialer
from treefed.node.run import run_broker, serve_until_signal

__all__ = ["BrokerNode", "Dialer", "run_broker", "serve_until_signal"]
