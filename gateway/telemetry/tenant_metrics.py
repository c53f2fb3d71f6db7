"""Per-tenant prefix-cache figures as Prometheus counter pairs (hits, queries), counted once per finished record.

A hit rate is `rate(hits) / rate(queries)` over any window and any grouping, which a gauge recomputed per batch
cannot give. Both members of a pair count the same requests: those whose upstream reported prompt and cached
tokens. The *eligible* pair counts only requests that could have hit: those sharing a prefix with an earlier request
of the tenant, i.e. whose miss reason is not `new_prefix` (a prompt nobody sent before cannot come from cache).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter

from db.records import RequestRecord, uncached_prompt_tokens
from gateway.explain.reasons import NEW_PREFIX


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
            "Prompt tokens of the tenant's requests that shared a prefix with an earlier one (miss reason not "
            "new_prefix): eligible hit-rate queries.",
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
        # labels() is comparatively slow; children are cached per label tuple (tenants are few: one per API key's).
        self._children: dict[tuple[Any, ...], Any] = {}

    def _child(self, metric: Counter, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe(self, record: RequestRecord) -> None:
        tenant, reason = record.tenant, record.miss_reason
        if record.prompt_tokens is not None and record.cached_tokens is not None:
            self._child(self.prompt_tokens, tenant).inc(record.prompt_tokens)
            self._child(self.cached_tokens, tenant).inc(record.cached_tokens)
            if reason is not None and reason != NEW_PREFIX:
                self._child(self.eligible_prompt_tokens, tenant).inc(record.prompt_tokens)
                self._child(self.eligible_cached_tokens, tenant).inc(record.cached_tokens)
        if reason is not None:
            self._child(self.miss_reasons, tenant, reason).inc()
            recomputed = uncached_prompt_tokens(record)
            if recomputed:
                self._child(self.recomputed_tokens, tenant, reason).inc(recomputed)
