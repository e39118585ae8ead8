"""/metrics: a broker's state in the Prometheus text format, through prometheus_client.

Theory of operation
-------------------
The broker already counts everything (core ``Broker`` totals and drop reasons, the
Site's advisory counters and drop reasons, the node's connections, dialers and
heartbeat misses), so nothing is instrumented twice: ``NodeCollector`` is a custom
collector that reads those numbers at scrape time and yields metric families;
``prometheus_client`` renders them (``generate_latest``), so the exposition format is
never written by hand.  One ``CollectorRegistry`` per node (not the global default) keeps
two brokers in one process — tests, the memory engine — apart.

Cardinality is capped: destinations and links are exported one series each up to
``max_series``, the largest first (depth, demand); the rest are summed into one series
labelled ``_other``, so a broker with 100,000 destinations or 4,000 child links still
scrapes in bounded size.  Counters only ever grow (their sources only increment).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.process_collector import ProcessCollector

import treefed

__all__ = ["NodeCollector", "node_registry", "render", "CONTENT_TYPE", "MAX_SERIES",
           "OTHER"]

from prometheus_client.exposition import CONTENT_TYPE_LATEST as CONTENT_TYPE

#: Series per labelled family (destinations, links) before the rest become ``_other``.
MAX_SERIES = 500
OTHER = "_other"
#: Event-loop lag buckets, seconds.
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_LINK_STATES = ("waiting", "connecting", "operational", "failed")


def _capped(rows: list[tuple], key: int, max_series: int) -> tuple[list[tuple], tuple | None]:
    """The ``max_series`` largest rows by column ``key``, and the rest summed column-wise
    (numbers only; None when nothing was left out)."""
    if len(rows) <= max_series:
        return rows, None
    rows = sorted(rows, key=lambda r: r[key], reverse=True)
    kept, rest = rows[:max_series], rows[max_series:]
    summed = tuple(sum(r[i] for r in rest) if isinstance(rest[0][i], (int, float))
                   else OTHER for i in range(len(rest[0])))
    return kept, summed


class NodeCollector:
    """Reads one ``BrokerNode`` at scrape time (see module doc)."""

    def __init__(self, node: Any, *, max_series: int = MAX_SERIES) -> None:
        self.node = node
        self.max_series = max_series

    def describe(self) -> list:
        return []   # unchecked collector: names come from collect()

    def collect(self) -> Any:
        node = self.node
        site = node.site
        broker = site.broker
        info = GaugeMetricFamily("treefed_broker_info", "This broker: id, type, version",
                                 labels=["broker", "node_type", "version"])
        info.add_metric([node.broker_id, site.node_type, treefed.__version__], 1)
        yield info
        yield GaugeMetricFamily("treefed_uptime_seconds", "Seconds since the broker started",
                                value=time.time() - node.started)

        # -- connections and links -----------------------------------------------------
        conns = node.connections()
        kinds = Counter(c["kind"] for c in conns)
        g = GaugeMetricFamily("treefed_connections",
                              "Open connections by kind (client, link, pending hello)",
                              labels=["kind", "protocol"])
        for kind in ("client", "link", "pending"):
            g.add_metric([kind, "treefed"], kinds.get(kind, 0))
        yield g

        states = Counter(d.state for d in node.dialers)
        dialed = {d.conn for d in node.dialers if d.conn is not None}
        accepted = [c for c in conns if c["kind"] == "link" and c["conn"] not in dialed]
        g = GaugeMetricFamily("treefed_links", "Broker links by state (dialed connectors "
                              "in any state; accepted links are operational)",
                              labels=["state", "dialed"])
        for state in _LINK_STATES:
            g.add_metric([state, "true"], states.get(state, 0))
        g.add_metric(["operational", "false"], len(accepted))
        yield g

        rows = []
        for c, b in node.link_bridges(conns):
            rows.append((b.name, b.peer or "?", b.lane, b.demand_count(), len(b.remote),
                         c.get("rtt")))
        kept, other = _capped(rows, 3, self.max_series)
        demand = GaugeMetricFamily("treefed_link_demand",
                                   "Demand entries (network consumers) held for a link",
                                   labels=["link", "peer", "lane"])
        interest = GaugeMetricFamily("treefed_link_remote_interest",
                                     "Consumer interests learned over a link",
                                     labels=["link", "peer", "lane"])
        rtt = GaugeMetricFamily("treefed_link_rtt_seconds",
                                "Round trip of the last heartbeat ping on a link",
                                labels=["link", "peer", "lane"])
        for name, peer, lane, n_demand, n_interest, seconds in kept:
            demand.add_metric([name, peer, lane], n_demand)
            interest.add_metric([name, peer, lane], n_interest)
            if seconds is not None:
                rtt.add_metric([name, peer, lane], seconds)
        if other is not None:
            demand.add_metric([OTHER, OTHER, OTHER], other[3])
            interest.add_metric([OTHER, OTHER, OTHER], other[4])
        yield demand
        yield interest
        yield rtt

        connects = CounterMetricFamily("treefed_link_connects",
                                       "Times a dialed link came up (reconnects = this - 1)",
                                       labels=["link", "uri"])
        attempts = CounterMetricFamily("treefed_link_dial_attempts",
                                       "Connection attempts of a dialed link",
                                       labels=["link", "uri"])
        for d in node.dialers:
            connects.add_metric([d.settings.name, d.uri], d.connects)
            attempts.add_metric([d.settings.name, d.uri], d.attempts)
        yield connects
        yield attempts
        yield CounterMetricFamily("treefed_heartbeat_misses",
                                  "Connections torn down after an unanswered ping",
                                  value=node.heartbeat_misses)

        # -- advisories ----------------------------------------------------------------
        counters = site.counters
        adv = CounterMetricFamily("treefed_advisories", "Interest advisories by direction",
                                  labels=["direction", "kind"])
        adv.add_metric(["sent", "add"], counters.get("advisories_sent", 0))
        adv.add_metric(["sent", "remove"], counters.get("removals_sent", 0))
        adv.add_metric(["received", "any"], counters.get("advisories_received", 0))
        yield adv
        dropped = CounterMetricFamily("treefed_advisories_dropped",
                                      "Advisories refused, by reason", labels=["reason"])
        for reason, n in site.dropped.items():
            dropped.add_metric([reason], n)
        yield dropped
        dem = CounterMetricFamily("treefed_demand_changes", "Demand entries created/removed",
                                  labels=["change"])
        dem.add_metric(["created"], counters.get("demand_created", 0))
        dem.add_metric(["removed"], counters.get("demand_removed", 0))
        yield dem
        yield CounterMetricFamily("treefed_peer_errors",
                                  "Error frames received from peer brokers",
                                  value=counters.get("peer_errors", 0))

        # -- messages ------------------------------------------------------------------
        msgs = CounterMetricFamily("treefed_messages",
                                   "Messages by what happened to them here",
                                   labels=["event"])
        msgs.add_metric(["produced"], broker.produced)
        msgs.add_metric(["received"], broker.received)
        msgs.add_metric(["delivered"], broker.delivered)
        msgs.add_metric(["forwarded"], broker.forwarded)
        msgs.add_metric(["dead_lettered"], broker._dead_lettered)  # noqa: SLF001
        yield msgs
        mdrop = CounterMetricFamily("treefed_messages_dropped",
                                    "Messages dropped, by reason", labels=["reason"])
        for reason, n in sorted(broker._dropped.items()):   # noqa: SLF001
            mdrop.add_metric([reason], n)
        yield mdrop

        # -- destinations and store ----------------------------------------------------
        sizes = broker.destination_sizes()
        stranded = sum(depth for name, depth, _, consumers in sizes if not consumers)
        yield GaugeMetricFamily("treefed_messages_stranded",
                                "Messages waiting on destinations with no consumer at all",
                                value=stranded)
        yield GaugeMetricFamily("treefed_destinations", "Destinations this broker holds",
                                value=len(sizes))
        kept, other = _capped(sizes, 1, self.max_series)
        depth = GaugeMetricFamily("treefed_destination_depth",
                                  "Messages waiting per destination (largest first, the "
                                  f"rest summed as {OTHER})", labels=["dst"])
        size = GaugeMetricFamily("treefed_destination_bytes",
                                 "Bytes pending and in flight per destination",
                                 labels=["dst"])
        cons = GaugeMetricFamily("treefed_destination_consumers",
                                 "Consumers (local and network) per destination",
                                 labels=["dst"])
        for name, n, nbytes, n_cons in kept:
            depth.add_metric([name], n)
            size.add_metric([name], nbytes)
            cons.add_metric([name], n_cons)
        if other is not None:
            depth.add_metric([OTHER], other[1])
            size.add_metric([OTHER], other[2])
            cons.add_metric([OTHER], other[3])
        yield depth
        yield size
        yield cons
        yield GaugeMetricFamily("treefed_store_full",
                                "1 while persistent input is refused (store full)",
                                value=1 if node.store_full else 0)
        poll = node.statistics_idle_poll()
        if poll is not None:   # [broker] idle_poll_us (transport/idlepoll.py)
            yield GaugeMetricFamily("treefed_idle_poll_window_seconds",
                                    "How long the broker polls after a read now "
                                    "(adapts up to idle_poll_us)",
                                    value=poll["window_us"] / 1e6)
            polls = CounterMetricFamily("treefed_idle_polls",
                                        "Polls after a read: caught the next read (hit) "
                                        "or gave up and slept (miss)", labels=["result"])
            polls.add_metric(["hit"], poll["hits"])
            polls.add_metric(["miss"], poll["misses"])
            yield polls
        path = getattr(node.store, "path", None)
        if path is not None:
            disk = 0
            for suffix in ("", "-wal"):
                try:
                    disk += os.stat(f"{path}{suffix}").st_size
                except OSError:
                    pass
            yield GaugeMetricFamily("treefed_store_disk_bytes",
                                    "Size of the message store on disk (with its WAL)",
                                    value=disk)


def node_registry(node: Any, *, max_series: int = MAX_SERIES) -> tuple[CollectorRegistry,
                                                                        Histogram]:
    """A registry holding the node's collector, the process collector (RSS, CPU, open
    files) and the event-loop lag histogram the monitor observes into."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(node, max_series=max_series))
    ProcessCollector(registry=registry)
    lag = Histogram("treefed_event_loop_lag_seconds",
                    "How late a periodic sleep in the broker's trio loop woke up",
                    buckets=LAG_BUCKETS, registry=registry)
    return registry, lag


def render(registry: CollectorRegistry) -> bytes:
    """The Prometheus text exposition of ``registry``."""
    return generate_latest(registry)
