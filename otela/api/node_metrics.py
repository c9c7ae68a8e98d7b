"""The node's own metrics, read from where they live when ``/metrics`` is scraped.

Request metrics are counted as requests finish (``observe.RequestMetrics``); everything
here (in-flight requests, retries, upstream connections, event-loop lag, the registry,
gossip, liveness, security refusals) is copied from the component that keeps it, once
per scrape, so nothing on the request path or the control plane pays for it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

from otela.metrics import LAG_BUCKETS, Histogram, Registry
from otela.registry.store import Registry as RegistryReplica


class NodeParts(Protocol):
    """What the node's metrics are read from."""

    registry: RegistryReplica

    def in_flight(self) -> int: ...

    def data_path_totals(self) -> dict[str, int]:
        """``retries``, ``resent``, ``migrated``, ``abandoned``, ``connects``,
        ``connect_failures``, over
        every data-path process."""
        ...

    def worker_metric_states(self) -> list[dict[str, Any]]:
        """Data-path workers' metrics (``Registry.state``), to be added up here."""
        ...

    def replication_stats(self) -> Counter[str]: ...

    def liveness_stats(self) -> dict[str, int]: ...

    def hop_refusals(self) -> dict[str, int]: ...

    def suspected_count(self) -> int: ...

    def routing_stats(self) -> dict[str, int]:
        """``ejections`` so far, ``ejected`` nodes now (every data-path process), and the
        load reports' ``sent``/``received``/``bytes_sent``/``bytes_received``."""
        ...


def install(metrics: Registry, node: NodeParts) -> Histogram:
    """Register the node's gauges and counters; returns the event-loop lag histogram (its
    sampler feeds it)."""
    lag = metrics.histogram("otela_event_loop_lag_seconds", "How late the event loop woke "
                            "from a short sleep (requests wait this long too), by process.",
                            LAG_BUCKETS, labels=("process",))
    in_flight = metrics.gauge("otela_requests_in_flight", "Requests being relayed now.")
    retries = metrics.counter("otela_retries_total", "Requests sent to another node after "
                              "one did not take them (never after delivery).")
    resent = metrics.counter("otela_resent_total", "Requests sent to another node after "
                             "the one they reached broke off, or failed while they waited "
                             "for its answer (--retry-broken: each may have run twice).",
                             ("reason",))
    migrated = metrics.counter("otela_stream_migrations_total", "Chat streams continued on "
                               "another node after theirs broke off mid-answer (request "
                               "migration: --stream-migrations).")
    connects = metrics.counter("otela_upstream_connections_opened_total",
                               "Connections opened to engines and other nodes.")
    failures = metrics.counter("otela_upstream_connect_failures_total",
                               "Connections to engines and other nodes that failed.")
    sessions = metrics.gauge("otela_registry_sessions", "Sessions in this replica, by "
                             "lifecycle state.", ("state",))
    gossip = metrics.counter("otela_gossip_payload_bytes_total", "Registry gossip payload "
                             "bytes published (out) and received (in).", ("direction",))
    antientropy = metrics.counter("otela_anti_entropy_bytes_total", "Anti-entropy bytes "
                                  "sent (out) and received (in).", ("direction",))
    forged = metrics.counter("otela_forged_records_rejected_total", "Records for another "
                             "node's session rejected (docs/security.md).")
    suspected = metrics.gauge("otela_liveness_suspected_peers", "Peers suspected now.")
    suspicions = metrics.counter("otela_liveness_suspicions_total",
                                 "Suspicions this node raised first-hand.")
    evictions = metrics.counter("otela_liveness_evictions_total",
                                "Evictions this node signed.")
    ejections = metrics.counter("otela_routing_ejections_total", "Times a node was "
                                "ejected from this ingress's candidates after repeated "
                                "failures (docs/routing.md).")
    ejected = metrics.gauge("otela_routing_ejected_nodes", "Nodes ejected now.")
    load_reports = metrics.counter("otela_load_reports_total", "Load reports this node sent "
                                   "to ingress nodes (out) and, on an ingress, took from "
                                   "serving nodes (in).", ("direction",))
    load_bytes = metrics.counter("otela_load_report_payload_bytes_total", "Load report "
                                 "payload bytes sent (out) and received (in).",
                                 ("direction",))
    cache_decisions = metrics.counter(
        "otela_routing_cache_decisions_total", "cache_aware's placements on this ingress: "
        "by what the node's engine has cached (cache), passed over for load (load_won), "
        "or without cache information (fallback: prefix affinity).", ("outcome",))
    cache_blocks = metrics.gauge("otela_kv_cache_blocks", "Blocks this node's engine holds "
                                 "as its KV events say (indexed), and of those advertised "
                                 "to the ingresses (anchors).", ("kind",))
    cache_bytes = metrics.counter("otela_kv_cache_report_bytes_total", "Bytes of load "
                                  "reports that carried a cache summary (sent).")
    hop_refused = metrics.counter("otela_engine_hop_refusals_total", "Engine hop requests "
                                  "refused to non-members, by reason.", ("code",))

    def collect() -> None:
        metrics.absorb(node.worker_metric_states())
        in_flight.set(value=node.in_flight())
        totals = node.data_path_totals()
        retries.set(value=totals["retries"])
        resent.set("broke_off", value=totals["resent"] - totals["abandoned"])
        resent.set("node_failed", value=totals["abandoned"])
        migrated.set(value=totals["migrated"])
        connects.set(value=totals["connects"])
        failures.set(value=totals["connect_failures"])
        states = Counter(record.state.name for record in node.registry)
        for state in ("JOIN", "SERVING", "DOWN", "LEFT"):
            sessions.set(state, value=states.get(state, 0))
        stats = node.replication_stats()
        gossip.set("out", value=stats["gossip_bytes_sent"])
        gossip.set("in", value=stats["gossip_bytes_received"])
        antientropy.set("out", value=stats["ae_bytes_sent"])
        antientropy.set("in", value=stats["ae_bytes_received"])
        forged.set(value=stats["forged_rejected"])
        liveness = node.liveness_stats()
        suspected.set(value=node.suspected_count())
        suspicions.set(value=liveness.get("suspected", 0))
        evictions.set(value=liveness.get("evicted", 0))
        routing = node.routing_stats()
        ejections.set(value=routing["ejections"])
        ejected.set(value=routing["ejected"])
        load_reports.set("out", value=routing["sent"])
        load_reports.set("in", value=routing["received"])
        load_bytes.set("out", value=routing["bytes_sent"])
        load_bytes.set("in", value=routing["bytes_received"])
        cache_decisions.set("cache", value=routing["cache_routed"])
        cache_decisions.set("load_won", value=routing["cache_load_won"])
        cache_decisions.set("fallback", value=routing["cache_fallback"])
        cache_blocks.set("indexed", value=routing["cache_blocks"])
        cache_blocks.set("advertised", value=routing["cache_anchors"])
        cache_bytes.set(value=routing["cache_bytes_sent"])
        for code, count in node.hop_refusals().items():
            hop_refused.set(code, value=count)

    metrics.collect(collect)
    return lag
