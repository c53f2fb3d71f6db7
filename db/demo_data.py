"""Realistic request history for demos, dashboards and load checks: `write_demo_data(url, rows, seed)`.

Several tenants with their own traffic shapes: a support bot whose long system prompt is reused (high hit rate),
an agent whose tool schemas are reordered unless normalized (partial hits), a tenant that puts a timestamp in its
system prompt (cold misses), a batch tenant whose prefixes get evicted or expire, and an upstream that does not
report cached tokens. Rows are generated in time order over the last `days` days with a daily rhythm, inserted in
bulk through the same code as the live writer (so the rollups agree with the rows), and seeded: the same
arguments give the same data.
"""

from __future__ import annotations

import hashlib
import random
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from db.engine import create_sync_engine_for
from db.migrate import upgrade
from db.records import RequestRecord
from db.store import store_records
from db.tenants import ensure_tenant
from db.timeutil import as_utc, utc_now

_RULES = ("canonical_tool_order", "canonical_json_keys", "newline_normalization", "strip_bom")
_HOIST = "hoist_volatile_values"
_ERRORS = ((429, "rate_limited"), (500, "upstream_error"), (502, "bad_gateway"), (504, "upstream_timeout"))


@dataclass(frozen=True)
class _TenantProfile:
    name: str
    weight: float
    models: tuple[str, ...]
    num_prefixes: int
    prefix_tokens: tuple[int, int]  # range of shared-prefix lengths
    hit_rate: float  # chance a request finds its prefix cached
    partial_rate: float  # among hits, chance the prompt diverged inside the prefix
    lost_kind: str  # why a known prefix missed: cold, evicted or expired
    rules_rate: float
    stores_prompts: bool = False


# fmt: off
_TENANTS = (
    # A support bot: one long system prompt, almost always cached; stores prompts for the explorer.
    _TenantProfile(
        name="acme-support", weight=0.35, models=("smollm2-135m-instruct",), num_prefixes=8,
        prefix_tokens=(1500, 3000), hit_rate=0.92, partial_rate=0.03, lost_kind="evicted", rules_rate=0.3,
        stores_prompts=True,
    ),
    # Agents whose tool schemas arrive reordered: many partial hits.
    _TenantProfile(
        name="globex-agents", weight=0.25, models=("llama-3.1-8b-instruct", "smollm2-135m-instruct"),
        num_prefixes=40, prefix_tokens=(2500, 6000), hit_rate=0.75, partial_rate=0.35, lost_kind="evicted",
        rules_rate=0.8,
    ),
    # RAG over many documents: prefixes expire before they are reused.
    _TenantProfile(
        name="initech-rag", weight=0.2, models=("qwen2.5-7b-instruct",), num_prefixes=200,
        prefix_tokens=(800, 4000), hit_rate=0.45, partial_rate=0.1, lost_kind="expired", rules_rate=0.2,
    ),
    # A timestamp in the system prompt: cold misses unless the hoisting rule is on.
    _TenantProfile(
        name="umbrella-timestamps", weight=0.12, models=("llama-3.1-8b-instruct",), num_prefixes=15,
        prefix_tokens=(1000, 2000), hit_rate=0.08, partial_rate=0.5, lost_kind="cold", rules_rate=0.1,
    ),
    # Batch jobs on a hosted API that does not report cached tokens.
    _TenantProfile(
        name="hooli-batch", weight=0.08, models=("gpt-4o-mini",), num_prefixes=30, prefix_tokens=(500, 1500),
        hit_rate=0.6, partial_rate=0.1, lost_kind="expired", rules_rate=0.0,
    ),
)
# fmt: on
# Which server hosts each model; "hosted-openai" does not report cached tokens to prefixscope here.
_UPSTREAMS = {
    "smollm2-135m-instruct": ("local-engine",),
    "llama-3.1-8b-instruct": ("vllm-a", "vllm-b"),
    "qwen2.5-7b-instruct": ("sglang-a",),
    "gpt-4o-mini": ("hosted-openai",),
}
_UNREPORTED_UPSTREAMS = {"hosted-openai"}


@dataclass(frozen=True)
class DemoDataResult:
    """What `write_demo_data` wrote."""

    rows: int
    tenants: tuple[str, ...]
    since: datetime
    until: datetime
    seconds: float


def _timestamps(rng: random.Random, rows: int, since: datetime, days: int) -> list[datetime]:
    """Sorted times over [since, since + days) with more traffic in (UTC) working hours."""
    span_s = days * 86400.0
    stamps: list[float] = []
    while len(stamps) < rows:
        offset = rng.random() * span_s
        hour = (offset / 3600.0) % 24
        # Acceptance sampling: the night gets about a third of the daytime traffic.
        if rng.random() < (1.0 if 8 <= hour < 20 else 0.35):
            stamps.append(offset)
    stamps.sort()
    return [since + timedelta(seconds=offset) for offset in stamps]


def _prefix_hash(tenant: str, index: int) -> str:
    return hashlib.sha256(f"{tenant}/prefix/{index}".encode()).hexdigest()[:32]


def _record(rng: random.Random, created_at: datetime, profile: _TenantProfile, request_index: int) -> RequestRecord:
    model = rng.choice(profile.models)
    upstream = rng.choice(_UPSTREAMS[model])
    # Zipf-like prefix popularity: a few system prompts carry most of the traffic.
    prefix_index = min(int(rng.paretovariate(1.2)) - 1, profile.num_prefixes - 1)
    prefix_tokens = rng.randint(*profile.prefix_tokens) // 16 * 16
    prompt_tokens = prefix_tokens + rng.randint(20, 600)
    completion_tokens = rng.randint(5, 400)
    rules = tuple(rule for rule in _RULES if rng.random() < profile.rules_rate)
    if profile.name == "umbrella-timestamps" and rng.random() < 0.1:
        rules += (_HOIST,)
    common: dict[str, Any] = {
        "request_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        "created_at": created_at,
        "tenant": profile.name,
        "key_id": f"{hashlib.sha256(profile.name.encode()).hexdigest()[:10]}{request_index % 2:02d}",
        "endpoint": "chat.completions" if rng.random() < 0.93 else "completions",
        "model": model,
        "upstream": upstream,
        "stream": rng.random() < 0.6,
        "applied_rules": rules,
        "prefix_hash": _prefix_hash(profile.name, prefix_index),
    }
    if rng.random() < 0.015:
        status_code, error_type = rng.choice(_ERRORS)
        return RequestRecord(
            **common,
            status_code=status_code,
            error_type=error_type,
            prompt_tokens=None,
            cached_tokens=None,
            completion_tokens=None,
            ttft_ms=None,
            latency_ms=rng.uniform(5, 30_000),
        )
    cached_tokens: int | None
    diverged: int | None = None
    if upstream in _UNREPORTED_UPSTREAMS:
        cached_tokens, miss_kind = None, None
    elif rng.random() < profile.hit_rate or _HOIST in rules:
        if rng.random() < 0.04:
            # An exact repeat (a retry): all but the last token, page-aligned, comes from cache.
            cached_tokens, miss_kind = (prompt_tokens - 1) // 16 * 16, "hit"
        elif rng.random() < profile.partial_rate:
            # Diverged inside the shared prefix (a reordered tool, a changed date): only its start was reused.
            cached_tokens = rng.randint(1, max(1, prefix_tokens // 16 - 1)) * 16
            miss_kind, diverged = "partial", cached_tokens + rng.randint(0, 15)
        else:
            # The usual reuse: the shared prefix from cache, the new turn prefilled.
            cached_tokens, miss_kind, diverged = prefix_tokens, "partial", prefix_tokens
    else:
        miss_kind = profile.lost_kind if rng.random() < 0.7 else "cold"
        # An evicted or expired prefix may still have its first pages in cache.
        keeps_start = miss_kind != "cold" and rng.random() < 0.3
        cached_tokens = rng.randint(1, max(1, prefix_tokens // 32)) * 16 if keeps_start else 0
        diverged = cached_tokens
    uncached = prompt_tokens - (cached_tokens or 0)
    # Prefill dominates TTFT and is roughly linear in uncached tokens; log-normal noise for queueing.
    ttft_ms = (12.0 + 0.09 * uncached) * rng.lognormvariate(0.0, 0.25)
    latency_ms = ttft_ms + completion_tokens * rng.uniform(6.0, 14.0)
    prompt_text = None
    if profile.stores_prompts and rng.random() < 0.05:
        prompt_text = f"[system prompt {prefix_index}] ... user question #{request_index}"
    return RequestRecord(
        **common,
        status_code=200,
        error_type=None,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        completion_tokens=completion_tokens,
        ttft_ms=ttft_ms,
        latency_ms=latency_ms,
        miss_kind=miss_kind,
        prompt_text=prompt_text,
        diverged_at_token=diverged,
    )


def write_demo_data(
    url: str,
    rows: int,
    seed: int = 0,
    days: int = 14,
    now: datetime | None = None,
    batch_size: int = 20_000,
) -> DemoDataResult:
    """Migrate the database at `url` and add `rows` requests over the `days` days before `now`.

    Request ids derive from `seed`; writing the same seed twice into one database adds nothing the second time.
    """
    if rows < 0 or days < 1:
        raise ValueError("rows must be >= 0 and days >= 1")
    started = time.perf_counter()
    upgrade(url)
    rng = random.Random(seed)
    until = as_utc(now) if now is not None else utc_now()
    since = until - timedelta(days=days)
    weights = [profile.weight for profile in _TENANTS]
    engine = create_sync_engine_for(url)
    try:
        with engine.begin() as conn:
            for profile in _TENANTS:
                ensure_tenant(conn, profile.name, {"store_prompts": profile.stores_prompts})
        stamps = _timestamps(rng, rows, since, days)
        for start in range(0, rows, batch_size):
            chunk = stamps[start : start + batch_size]
            profiles = rng.choices(_TENANTS, weights=weights, k=len(chunk))
            records = [
                _record(rng, created_at, profile, start + offset)
                for offset, (created_at, profile) in enumerate(zip(chunk, profiles, strict=True))
            ]
            with engine.begin() as conn:
                store_records(conn, records)
    finally:
        engine.dispose()
    return DemoDataResult(
        rows=rows,
        tenants=tuple(profile.name for profile in _TENANTS),
        since=since,
        until=until,
        seconds=time.perf_counter() - started,
    )
