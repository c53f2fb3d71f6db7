"""Realistic request history for demos, dashboards and load checks: `write_demo_data(url, rows, seed)`.

Several tenants with their own traffic shapes (`db.demo_outcomes`): a support bot whose long system prompt is reused
(high hit rate), an agent whose tool schemas are reordered unless normalized (partial hits), a tenant that puts a
timestamp in its system prompt (cold misses), a batch tenant whose prefixes get evicted or expire, and an upstream
that does not report cached tokens. Every request with known cache figures says why it missed and where it diverged;
a sample has its normalization gain measured, and a share (`chain_share`) carries its block hash chain, whose shared
prefixes let a cache simulator replay them. Rows are generated in time order over the last `days` days with a daily
rhythm, inserted in bulk through the same code as the live writer (so the rollups agree with the rows), and seeded:
the same arguments give the same data.
"""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from db.demo_outcomes import (
    TENANTS,
    ChainBuilder,
    TenantProfile,
    cache_outcome,
    normalization_gain,
    prefix_tokens_of,
)
from db.engine import create_sync_engine_for
from db.migrate import upgrade
from db.records import RequestRecord
from db.store import store_records
from db.tenants import ensure_tenant
from db.timeutil import as_utc, utc_now
from prefixscope.progress import progress

# The gateway's rule names (`gateway.tenant_settings.SEMANTIC_RULES` / `OPT_IN_RULES`; a test keeps them equal).
_RULES = ("newlines", "tool_schema_key_order", "tool_order", "tool_call_arguments_key_order")
_HOIST = "hoist_volatile"
_ERRORS = ((429, "rate_limited"), (500, "upstream_error"), (502, "bad_gateway"), (504, "upstream_timeout"))
# Share of requests whose normalization gain is measured by a dry-run match of the un-normalized request.
_GAIN_SAMPLE_RATE = 0.1
# Default share of requests recorded with their block hash chain.
DEFAULT_CHAIN_SHARE = 0.02
# Upstreams that return real token-block hashes; for the others the gateway hashes text chunks (approximate chains).
_EXACT_CHAIN_UPSTREAMS = {"local-engine"}


# Which server hosts each model; "hosted-openai" does not report cached tokens to prefixscope here.
_UPSTREAMS = {
    "smollm2-135m-instruct": ("local-engine",),
    "llama-3.1-8b-instruct": ("vllm-a", "vllm-b"),
    "qwen2.5-7b-instruct": ("sglang-a",),
    "gpt-4o-mini": ("hosted-openai",),
}
_UNREPORTED_UPSTREAMS = {"hosted-openai"}
# The leading tokens SmolLM2's chat template always produces (`<|im_start|>system` and a newline), as the local engine
# reports them.
TEMPLATE_TOKENS = 3


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


class _Generator:
    """Builds demo records from one seeded random stream (chains from another, so that the share of requests with
    a chain changes nothing else)."""

    def __init__(self, seed: int, chain_share: float) -> None:
        self.rng = random.Random(seed)
        self.chain_share = chain_share
        self.chain_rng = random.Random(f"chain-sample/{seed}")
        self.chains = ChainBuilder(seed)

    def record(self, created_at: datetime, profile: TenantProfile, request_index: int) -> RequestRecord:
        rng = self.rng
        model = rng.choice(profile.models)
        upstream = rng.choice(_UPSTREAMS[model])
        # Zipf-like prefix popularity: a few system prompts carry most of the traffic.
        prefix_index = min(int(rng.paretovariate(1.2)) - 1, profile.num_prefixes - 1)
        prefix_tokens = prefix_tokens_of(profile, prefix_index)
        prompt_tokens = prefix_tokens + rng.randint(20, 600)
        completion_tokens = rng.randint(5, 400)
        rules = tuple(rule for rule in _RULES if rng.random() < profile.rules_rate)
        if profile.name == "umbrella-timestamps" and rng.random() < 0.1:
            rules += (_HOIST,)
        common: dict[str, Any] = {
            "request_id": f"req_{rng.getrandbits(96):024x}",  # the gateway's request-id format
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
        prefix_key = f"{profile.name}/{model}/{prefix_index}"
        outcome = cache_outcome(rng, profile, prefix_key, prefix_tokens, prompt_tokens, _HOIST in rules)
        explained: dict[str, Any] = {}
        if upstream not in _UNREPORTED_UPSTREAMS:
            explained = outcome.record_fields()
            if outcome.reason != "hit":
                # As the gateway counts it: every prompt token the engine did not serve from cache.
                explained["recomputed_tokens"] = prompt_tokens - outcome.cached_tokens
            if upstream in _EXACT_CHAIN_UPSTREAMS:
                explained["template_tokens"] = TEMPLATE_TOKENS
            if rng.random() < _GAIN_SAMPLE_RATE:
                explained["normalization_gain_tokens"] = normalization_gain(rng, profile, outcome, rules)
        # Prefill dominates TTFT and is roughly linear in uncached tokens; log-normal noise for queueing.
        uncached = prompt_tokens - outcome.cached_tokens
        ttft_ms = (12.0 + 0.09 * uncached) * rng.lognormvariate(0.0, 0.25)
        latency_ms = ttft_ms + completion_tokens * rng.uniform(6.0, 14.0)
        prompt_text = None
        if profile.stores_prompts and rng.random() < 0.05:
            prompt_text = f"[system prompt {prefix_index}] ... user question #{request_index}"
        if self.chain_rng.random() < self.chain_share:
            approximate = upstream not in _EXACT_CHAIN_UPSTREAMS
            explained["chain"] = self.chains.chain(prefix_key, prefix_tokens, prompt_tokens, outcome, approximate)
        reported: dict[str, Any] = {
            "status_code": 200,
            "error_type": None,
            "prompt_tokens": prompt_tokens,
            "cached_tokens": None,  # unless the upstream reports it (then `explained` holds the figure)
            "completion_tokens": completion_tokens,
            "ttft_ms": ttft_ms,
            "latency_ms": latency_ms,
            "prompt_text": prompt_text,
        }
        return RequestRecord(**common, **(reported | explained))


def write_demo_data(
    url: str,
    rows: int,
    seed: int = 0,
    days: int = 14,
    now: datetime | None = None,
    batch_size: int = 20_000,
    chain_share: float = DEFAULT_CHAIN_SHARE,
) -> DemoDataResult:
    """Migrate the database at `url` and add `rows` requests over the `days` days before `now`, a `chain_share` of
    them with their block hash chain.

    Request ids derive from `seed`; writing the same seed twice into one database adds nothing the second time.
    """
    if rows < 0 or days < 1:
        raise ValueError("rows must be >= 0 and days >= 1")
    if not 0.0 <= chain_share <= 1.0:
        raise ValueError("chain_share must be between 0 and 1")
    started = time.perf_counter()
    upgrade(url)
    generator = _Generator(seed, chain_share)
    until = as_utc(now) if now is not None else utc_now()
    since = until - timedelta(days=days)
    engine = create_sync_engine_for(url)
    try:
        with engine.begin() as conn:
            for profile in TENANTS:
                ensure_tenant(conn, profile.name, {"store_prompts": profile.stores_prompts})
        stamps = _timestamps(generator.rng, rows, since, days)
        with progress("demo-data", total=rows, unit="requests") as bar:
            _write_batches(engine, generator, stamps, batch_size, bar)
    finally:
        engine.dispose()
    return DemoDataResult(
        rows=rows,
        tenants=tuple(profile.name for profile in TENANTS),
        since=since,
        until=until,
        seconds=time.perf_counter() - started,
    )


def _write_batches(engine: Any, generator: _Generator, stamps: list[datetime], batch_size: int, bar: Any) -> None:
    """Generate and store the requests at `stamps`, `batch_size` per transaction, advancing `bar` per batch."""
    weights = [profile.weight for profile in TENANTS]
    for start in range(0, len(stamps), batch_size):
        chunk = stamps[start : start + batch_size]
        profiles = generator.rng.choices(TENANTS, weights=weights, k=len(chunk))
        records = [
            generator.record(created_at, profile, start + offset)
            for offset, (created_at, profile) in enumerate(zip(chunk, profiles, strict=True))
        ]
        with engine.begin() as conn:
            store_records(conn, records)
        bar.advance(len(records))
