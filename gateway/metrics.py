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


class _RecordCounters:
    """The counter children one kind of record counts in (same endpoint, upstream, status, error, rules and miss
    reason), looked up once per kind rather than label by label per request."""

    __slots__ = ("requests", "error", "prompt_tokens", "cached_tokens", "cache_hits", "rules", "miss_reason",
                 "recomputed_tokens")

    def __init__(self, metrics: GatewayMetrics, record: RequestRecord) -> None:
        upstream, reason = record.upstream, record.miss_reason
        self.requests = metrics.requests.labels(record.endpoint, upstream, str(record.status_code))
        self.error = None if record.error_type is None else metrics.error_counter(record.error_type)
        self.prompt_tokens = metrics.prompt_tokens.labels(upstream)
        self.cached_tokens = metrics.cached_tokens.labels(upstream)
        self.cache_hits = metrics.cache_hits.labels(upstream)
        self.rules = tuple(metrics.rules.labels(rule) for rule in record.applied_rules)
        self.miss_reason = None if reason is None else metrics.miss_reasons.labels(reason)
        self.recomputed_tokens = None if reason is None else metrics.recomputed_tokens.labels(reason)


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
        # labels() is comparatively slow; children are cached per label set (a few kinds of record in practice).
        self._errors: dict[str, Any] = {}
        self._record_counters: dict[tuple[Any, ...], _RecordCounters] = {}

    def watch_recorder(self, counters: Callable[[], Any]) -> None:
        self.registry.register(_RecorderCollector(counters))

    def error_counter(self, error_type: str) -> Any:
        """The `prefixscope_gateway_errors` child for `error_type` (cached)."""
        child = self._errors.get(error_type)
        if child is None:
            child = self._errors[error_type] = self.errors.labels(error_type)
        return child

    def count_error(self, error_type: str) -> None:
        """An error on an endpoint without request records (`/v1/models`, `/api/stats`, unknown paths)."""
        self.error_counter(error_type).inc()

    def observe(self, record: RequestRecord) -> None:
        key = (record.endpoint, record.upstream, record.status_code, record.error_type, record.applied_rules,
               record.miss_reason)
        counters = self._record_counters.get(key)
        if counters is None:
            counters = self._record_counters[key] = _RecordCounters(self, record)
        counters.requests.inc()
        if counters.error is not None:
            counters.error.inc()
        if record.prompt_tokens:
            counters.prompt_tokens.inc(record.prompt_tokens)
        if record.cached_tokens:
            counters.cached_tokens.inc(record.cached_tokens)
        if record.cache_hit:  # more than the template's fixed opening came from cache
            counters.cache_hits.inc()
        for rule in counters.rules:
            rule.inc()
        if counters.miss_reason is not None:
            counters.miss_reason.inc()
            recomputed = uncached_prompt_tokens(record)
            if recomputed:
                counters.recomputed_tokens.inc(recomputed)
        if record.normalization_gain_tokens:
            self.normalization_gain_tokens.inc(record.normalization_gain_tokens)
        if record.replica is not None:
            self.replicas.observe(record)
        self.tenants.observe(record)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
