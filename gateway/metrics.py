"""Prometheus counters of the gateway (one registry per app, so several apps can live in one process)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from db.records import RequestRecord, uncached_prompt_tokens
from gateway.replicas.replica_metrics import ReplicaMetrics
from gateway.telemetry.tenant_metrics import TenantMetrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# The writer's counters exported as `prefixscope_gateway_records_<name>` (and in /health under "records").
RECORD_COUNTERS = (
    "queued",
    "written",
    "spilled",
    "replayed",
    "dropped",
    "rejected",
    "lost",
    "database_recreated",
    "journal_failures",
    "torn_tails_cut",
)


class _RecorderCollector(Collector):
    """Exposes the record writer's counters at scrape time (the writer owns them; nothing is copied per request)."""

    def __init__(self, counters: Callable[[], Any]) -> None:
        self._counters = counters

    def collect(self) -> Iterator[Any]:
        counters = self._counters()
        for name in RECORD_COUNTERS:
            family = CounterMetricFamily(
                f"prefixscope_gateway_records_{name}", f"Request records {name} by the background writer."
            )
            family.add_metric([], float(getattr(counters, name, 0)))
            yield family
        pending = GaugeMetricFamily(
            "prefixscope_gateway_records_pending_spill", "Records in the spill file waiting to be replayed."
        )
        pending.add_metric([], float(getattr(counters, "pending_spill", 0)))
        yield pending
        journaled = GaugeMetricFamily(
            "prefixscope_gateway_records_journaled_pending",
            "Records kept only in the journal (the database and the spill file could not take them).",
        )
        journaled.add_metric([], float(getattr(counters, "journaled_pending", 0)))
        yield journaled
        held = GaugeMetricFamily(
            "prefixscope_gateway_records_held",
            "Records held back by the rule advisor or an uplift check (journaled under spill_first), not yet queued.",
        )
        held.add_metric([], float(getattr(counters, "held", 0)))
        yield held


class GatewayMetrics:
    """Per-request counters, updated once per finished request."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "prefixscope_gateway_requests",
            "Completion requests by endpoint, upstream and status code.",
            ("endpoint", "upstream", "status"),
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "prefixscope_gateway_prompt_tokens",
            "Prompt tokens reported by upstreams.",
            ("upstream",),
            registry=self.registry,
        )
        self.cached_tokens = Counter(
            "prefixscope_gateway_cached_tokens",
            "Prompt tokens served from the upstream's prefix cache.",
            ("upstream",),
            registry=self.registry,
        )
        self.cache_hits = Counter(
            "prefixscope_gateway_cache_hit_requests",
            "Requests with at least one cached prompt token.",
            ("upstream",),
            registry=self.registry,
        )
        self.rules = Counter(
            "prefixscope_gateway_normalization_rules_applied",
            "Requests changed by each normalization rule.",
            ("rule",),
            registry=self.registry,
        )
        self.miss_reasons = Counter(
            "prefixscope_gateway_miss_reasons",
            "Answered requests by the reason they did not come further from cache (`hit` when nothing was lost).",
            ("reason",),
            registry=self.registry,
        )
        self.recomputed_tokens = Counter(
            "prefixscope_gateway_recomputed_tokens",
            "Prompt tokens not served from cache, by miss reason.",
            ("reason",),
            registry=self.registry,
        )
        self.normalization_gain_tokens = Counter(
            "prefixscope_gateway_normalization_gain_tokens",
            "Prompt tokens matched thanks to normalization, over the requests sampled for a dry-run check.",
            registry=self.registry,
        )
        self.errors = Counter(
            "prefixscope_gateway_errors", "Errors by type, on every endpoint.", ("error_type",), registry=self.registry
        )
        self.keys_loaded = Gauge(
            "prefixscope_gateway_api_keys_loaded", "Active API keys held in memory.", registry=self.registry
        )
        self.open_mode = Gauge(
            "prefixscope_gateway_open_mode",
            "1 while the gateway runs open (auth = \"none\"): no API key is checked.",
            registry=self.registry,
        )
        self.replicas = ReplicaMetrics(self.registry)
        self.tenants = TenantMetrics(self.registry)
        # labels() is comparatively slow; children are cached per label tuple.
        self._children: dict[tuple[Any, ...], Any] = {}

    def watch_recorder(self, counters: Callable[[], Any]) -> None:
        self.registry.register(_RecorderCollector(counters))

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def count_error(self, error_type: str) -> None:
        """An error on an endpoint without request records (`/v1/models`, `/api/stats`, unknown paths)."""
        self._child(self.errors, error_type).inc()

    def observe(self, record: RequestRecord) -> None:
        self._child(self.requests, record.endpoint, record.upstream, str(record.status_code)).inc()
        if record.error_type is not None:
            self._child(self.errors, record.error_type).inc()
        if record.prompt_tokens:
            self._child(self.prompt_tokens, record.upstream).inc(record.prompt_tokens)
        if record.cached_tokens:
            self._child(self.cached_tokens, record.upstream).inc(record.cached_tokens)
        if record.cache_hit:  # more than the template's fixed opening came from cache
            self._child(self.cache_hits, record.upstream).inc()
        for rule in record.applied_rules:
            self._child(self.rules, rule).inc()
        if record.miss_reason is not None:
            self._child(self.miss_reasons, record.miss_reason).inc()
            recomputed = uncached_prompt_tokens(record)
            if recomputed:
                self._child(self.recomputed_tokens, record.miss_reason).inc(recomputed)
        if record.normalization_gain_tokens:
            self.normalization_gain_tokens.inc(record.normalization_gain_tokens)
        if record.replica is not None:
            self.replicas.observe(record)
        self.tenants.observe(record)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
