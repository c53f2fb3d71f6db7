"""Prometheus exposition of the engine's counters (monotonic) and the pool's state (gauges), with the per-tier
figures (device, host, disk) under the label `tier`, followed by the same figures under vLLM's names
(`local_engine.telemetry.vllm_metrics`) for the boards and alerts written for vLLM."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from local_engine.cache import MissKind
from local_engine.telemetry.vllm_metrics import vllm_families
from prefixscope.tracing import ExportMetrics, Tracing
from local_engine.kv_events.metrics import kv_event_metrics

# (metric name, documentation, key in each tier's stats, scale): gauges then counters, labelled by `tier`.
_TIER_GAUGES = (
    ("prefixscope_engine_tier_cached_tokens", "Tokens whose KV this tier holds.", "cached_tokens", 1),
    ("prefixscope_engine_tier_capacity_tokens", "Capacity of this tier in tokens (0: not configured).",
     "capacity_tokens", 1),
)
_TIER_COUNTERS = (
    ("prefixscope_engine_tier_hit_tokens", "Matched prompt tokens served from this tier.", "hit_tokens_total", 1),
    ("prefixscope_engine_tier_loads", "Loads of KV from this tier back to the device.", "loads_total", 1),
    ("prefixscope_engine_tier_load_seconds", "Time spent loading KV from this tier back to the device.",
     "load_ms_total", 1e-3),
    ("prefixscope_engine_tier_demoted_tokens", "Tokens moved out of this tier to the next one.",
     "demoted_tokens_total", 1),
    ("prefixscope_engine_tier_dropped_tokens", "Tokens removed from this tier for good (evicted from the last "
     "tier, expired or flushed).", "dropped_tokens_total", 1),
)


class _EngineCollector:
    def __init__(self, engine) -> None:
        self.engine = engine

    def collect(self):
        counters = self.engine.counters
        stats = self.engine.cache_stats()
        simple_counters = [
            ("prefixscope_engine_prompt_tokens", "Prompt tokens received.", counters.prompt_tokens),
            ("prefixscope_engine_cached_tokens", "Prompt tokens served from the prefix cache.", counters.cached_tokens),
            ("prefixscope_engine_prefill_tokens", "Prompt tokens computed (not served from cache).", counters.prefill_tokens),
            ("prefixscope_engine_completion_tokens", "Tokens generated.", counters.completion_tokens),
            ("prefixscope_engine_evicted_tokens", "Cached tokens evicted to make room.", stats["evicted_tokens_total"]),
            ("prefixscope_engine_expired_tokens", "Cached tokens dropped by the TTL.", stats["expired_tokens_total"]),
            ("prefixscope_engine_failed_requests", "Requests that ended in an error.", counters.failed_requests),
            ("prefixscope_engine_prefill_seconds", "Time spent computing prompt tokens.", counters.prefill_s),
        ]
        for name, documentation, value in simple_counters:
            yield CounterMetricFamily(name, documentation, value=value)
        by_kind = CounterMetricFamily(
            "prefixscope_engine_requests", "Requests admitted, by prefix-cache outcome.", labels=["miss"]
        )
        for kind in MissKind:
            by_kind.add_metric([kind.value], counters.requests_by_miss_kind.get(kind.value, 0))
        yield by_kind
        gauges = [
            ("prefixscope_engine_pool_capacity_tokens", "KV pool capacity in tokens.", stats["capacity_tokens"]),
            ("prefixscope_engine_pool_used_tokens", "KV pool slots in use.", stats["capacity_tokens"] - stats["free_tokens"]),
            ("prefixscope_engine_cache_evictable_tokens", "Cached tokens no request holds.", stats["evictable_tokens"]),
            ("prefixscope_engine_cache_protected_tokens", "Cached tokens held by running requests.", stats["protected_tokens"]),
            ("prefixscope_engine_tree_nodes", "Radix tree nodes.", stats["num_nodes"]),
            ("prefixscope_engine_active_requests", "Requests being decoded.", stats["active_requests"]),
            ("prefixscope_engine_waiting_requests", "Requests queued for admission.", stats["waiting_requests"]),
        ]
        for name, documentation, value in gauges:
            yield GaugeMetricFamily(name, documentation, value=value)
        yield from _tier_metrics(stats["tiers"])
        yield from vllm_families(self.engine.loaded.model_id, counters, stats)
        yield from kv_event_metrics(stats.get("kv_events"))


def _tier_metrics(tiers: dict[str, dict]):
    for family_type, specs in ((GaugeMetricFamily, _TIER_GAUGES), (CounterMetricFamily, _TIER_COUNTERS)):
        for name, documentation, key, scale in specs:
            family = family_type(name, documentation, labels=["tier"])
            for tier, figures in tiers.items():
                family.add_metric([tier], figures[key] * scale)
            yield family
    yield CounterMetricFamily(
        "prefixscope_engine_disk_corrupt_files", "Disk-tier files found damaged and skipped.",
        value=tiers["disk"]["corrupt_files_total"],
    )


def render_metrics(engine, tracing: Tracing | None = None) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_EngineCollector(engine))
    if tracing is not None:
        registry.register(ExportMetrics("prefixscope_engine", tracing))
    return generate_latest(registry)
