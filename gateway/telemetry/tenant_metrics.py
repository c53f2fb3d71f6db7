"""Per-tenant prefix-cache figures as Prometheus counter pairs (hits, queries), counted once per finished record.

A hit rate is `rate(hits) / rate(queries)` over any window and any grouping, which a gauge recomputed per batch
cannot give. Both members of a pair count the same requests: those whose upstream reported prompt and cached
tokens. The *eligible* pair is the token ledger's eligible hit rate (`db.ledger.eligible_hit_rate`): its queries are
the prompt tokens an earlier request had sent, `prompt - new` (a conversation's new turn cannot come from cache), its
hits the cached tokens, over the requests that have a ledger.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter

from db.records import RequestRecord, uncached_prompt_tokens


class TenantMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.prompt_tokens = Counter(
            "prefixscope_gateway_tenant_prompt_tokens",
            "Prompt tokens of the tenant's requests whose upstream reported cached tokens (hit-rate queries).",
            ("tenant",),
            registry=registry,
        )
        self.cached_tokens = Counter(
            "prefixscope_gateway_tenant_cached_tokens",
            "Prompt tokens of the tenant's requests served from the upstream's prefix cache (hit-rate hits).",
            ("tenant",),
            registry=registry,
        )
        self.eligible_prompt_tokens = Counter(
            "prefixscope_gateway_tenant_eligible_prompt_tokens",
            "Prompt tokens an earlier request had sent (the ledger's prompt - new) of the tenant's requests with a "
            "token ledger: eligible hit-rate queries.",
            ("tenant",),
            registry=registry,
        )
        self.eligible_cached_tokens = Counter(
            "prefixscope_gateway_tenant_eligible_cached_tokens",
            "Cached prompt tokens of the same requests: eligible hit-rate hits.",
            ("tenant",),
            registry=registry,
        )
        self.miss_reasons = Counter(
            "prefixscope_gateway_tenant_miss_reasons",
            "The tenant's answered requests by miss reason (`hit` when nothing was lost).",
            ("tenant", "reason"),
            registry=registry,
        )
        self.recomputed_tokens = Counter(
            "prefixscope_gateway_tenant_recomputed_tokens",
            "The tenant's prompt tokens not served from cache, by miss reason.",
            ("tenant", "reason"),
            registry=registry,
        )
        # labels() is comparatively slow; children are looked up once per (tenant, miss reason), not per request.
        self._children: dict[tuple[str, str | None], _TenantCounters] = {}

    def observe(self, record: RequestRecord) -> None:
        key = (record.tenant, record.miss_reason)
        counters = self._children.get(key)
        if counters is None:
            counters = self._children[key] = _TenantCounters(self, *key)
        if record.prompt_tokens is not None and record.cached_tokens is not None:
            counters.prompt_tokens.inc(record.prompt_tokens)
            counters.cached_tokens.inc(record.cached_tokens)
            if record.new_tokens is not None:
                counters.eligible_prompt_tokens.inc(max(0, record.prompt_tokens - record.new_tokens))
                counters.eligible_cached_tokens.inc(record.cached_tokens)
        if counters.miss_reasons is not None:
            counters.miss_reasons.inc()
            recomputed = uncached_prompt_tokens(record)
            if recomputed:
                counters.recomputed_tokens.inc(recomputed)


class _TenantCounters:
    """The children one tenant's records with one miss reason count in."""

    __slots__ = ("prompt_tokens", "cached_tokens", "eligible_prompt_tokens", "eligible_cached_tokens", "miss_reasons",
                 "recomputed_tokens")

    def __init__(self, metrics: TenantMetrics, tenant: str, reason: str | None) -> None:
        self.prompt_tokens = metrics.prompt_tokens.labels(tenant)
        self.cached_tokens = metrics.cached_tokens.labels(tenant)
        self.eligible_prompt_tokens = metrics.eligible_prompt_tokens.labels(tenant)
        self.eligible_cached_tokens = metrics.eligible_cached_tokens.labels(tenant)
        self.miss_reasons: Any = None if reason is None else metrics.miss_reasons.labels(tenant, reason)
        self.recomputed_tokens: Any = None if reason is None else metrics.recomputed_tokens.labels(tenant, reason)
