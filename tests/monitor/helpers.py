"""Estates for the monitoring tests: in-process brokers on 127.0.0.1 port 0, each with
its monitor on another port 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from treefed.config import BrokerConfig, parse_config
from treefed.node import BrokerNode


def monitored_config(data_dir: Path, broker_id: str, *, tree: dict | None = None,
                     mesh: list | None = None, monitor: dict | None = None,
                     security: dict | None = None, **broker: Any) -> BrokerConfig:
    doc: dict = {"broker": {"id": broker_id, "data_dir": str(data_dir / broker_id),
                            "listen": ["tcp://127.0.0.1:0"], "heartbeat_interval": 0.0,
                            **broker},
                 "logging": {"level": "warning"},
                 "monitor": {"listen": "127.0.0.1:0", **(monitor or {})}}
    if tree:
        doc["tree_connector"] = tree
    if mesh:
        doc["network_connector"] = mesh
    if security:
        doc["security"] = security
    return parse_config(doc)


async def start(nursery: trio.Nursery, config: BrokerConfig) -> tuple[BrokerNode, str, str]:
    """Start a node; returns it, its tcp:// URI and its monitor's http:// base URL."""
    node = BrokerNode(config)
    addresses = await nursery.start(node.serve)
    host, port = addresses[0]
    return node, f"tcp://{host}:{port}", node.monitor.uri
