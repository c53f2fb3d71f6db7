"""The rule advisor's read side: per tenant, what each candidate rule would gain, from the `hourly_advice` rollup and
the tenant's own `hourly_rollups` (its current token hit rate and prompt tokens per day).

Estimates follow a difference estimator: the sampled requests give the change in token hit rate a candidate would
bring (estimated rate with it minus the actual rate of the same samples), added to the tenant's token hit rate over
all its requests in the range. Tokens saved per day scale the prefilled tokens the samples would have saved, per
sampled prompt token, to the tenant's prompt tokens per day; prefill time uses the samples' own TTFT per prefilled
token. An estimate on fewer than `min_samples` sampled requests is marked not shown, and is never recommended.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import BigInteger, Float, cast, func, select

from db.advice import DEFAULT_MIN_SAMPLES, candidate_info
from db.models import HourlyAdvice, table_of
from db.queries.history import query_range
from db.queries.totals import ROLLUPS, Reader, rollup_filters

ADVICE = table_of(HourlyAdvice)
# A candidate is recommended when it would raise the token hit rate by at least this much (and save tokens).
MIN_GAIN: float = 0.02


@dataclass(frozen=True)
class CandidateAdvice:
    """One candidate rule for one tenant. Rates are fractions in [0, 1]; None when there is nothing to divide by."""

    candidate: str
    title: str
    description: str
    moves_content: bool
    samples: int
    changed_samples: int
    sampled_hit_rate: float | None
    sampled_estimated_hit_rate: float | None
    estimated_hit_rate: float | None
    tokens_saved_per_day: float
    prefill_ms_saved_per_day: float | None
    toml_lines: tuple[str, ...]
    shown: bool
    recommended: bool


@dataclass(frozen=True)
class TenantAdvice:
    """A tenant's current figures over the range and its candidates, best first."""

    tenant: str
    token_hit_rate: float | None
    prompt_tokens_per_day: float
    days: float
    min_samples: int
    candidates: tuple[CandidateAdvice, ...]

    @property
    def recommendations(self) -> tuple[CandidateAdvice, ...]:
        return tuple(c for c in self.candidates if c.recommended)

    @property
    def needs_more_samples(self) -> bool:
        """No candidate has enough sampled requests for an estimate yet: nothing can be said, either way."""
        return bool(self.candidates) and not any(c.shown for c in self.candidates)

    @property
    def most_samples(self) -> int:
        return max((c.samples for c in self.candidates), default=0)


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def advice(
    conn: Reader,
    since: datetime,
    until: datetime | None = None,
    tenant: str | None = None,
    min_samples: int = DEFAULT_MIN_SAMPLES,
) -> list[TenantAdvice]:
    """Per tenant with advice in [since, until) (whole UTC hours), its candidates ordered by estimated gain."""
    start, end = query_range(since, until)
    days = max((end - start) / timedelta(days=1), 1 / 24)
    sums = [
        cast(func.sum(ADVICE.c[name]), BigInteger).label(name)
        for name in (
            "samples",
            "changed_samples",
            "prompt_tokens",
            "cached_tokens",
            "candidate_prompt_tokens",
            "candidate_cached_tokens",
            "ttft_prefilled_tokens",
        )
    ]
    stmt = (
        select(ADVICE.c.tenant, ADVICE.c.candidate, *sums, cast(func.sum(ADVICE.c.ttft_ms_sum), Float).label("ttft"))
        .where(*rollup_filters(ADVICE, start, end, tenant=tenant))
        .group_by(ADVICE.c.tenant, ADVICE.c.candidate)
    )
    by_tenant: dict[str, list[Any]] = {}
    for row in conn.execute(stmt):
        by_tenant.setdefault(row.tenant, []).append(row)
    if not by_tenant:
        return []
    totals_stmt = (
        select(
            ROLLUPS.c.tenant,
            cast(func.sum(ROLLUPS.c.cache_known_prompt_tokens), BigInteger).label("prompt"),
            cast(func.sum(ROLLUPS.c.cache_known_cached_tokens), BigInteger).label("cached"),
        )
        .where(*rollup_filters(ROLLUPS, start, end, tenant=tenant))
        .group_by(ROLLUPS.c.tenant)
    )
    totals = {row.tenant: (int(row.prompt or 0), int(row.cached or 0)) for row in conn.execute(totals_stmt)}
    result = []
    for name in sorted(by_tenant):
        prompt, cached = totals.get(name, (0, 0))
        rate = _ratio(cached, prompt)
        per_day = prompt / days
        candidates = [_candidate(name, row, rate, per_day, min_samples) for row in by_tenant[name]]
        candidates.sort(key=lambda c: (not c.shown, -(c.tokens_saved_per_day), c.candidate))
        result.append(TenantAdvice(name, rate, per_day, days, min_samples, tuple(candidates)))
    return result


def _candidate(tenant: str, row: Any, rate: float | None, prompt_per_day: float, min_samples: int) -> CandidateAdvice:
    info = candidate_info(row.candidate)
    samples = int(row.samples or 0)
    prompt = int(row.prompt_tokens or 0)
    cached = int(row.cached_tokens or 0)
    cand_prompt = int(row.candidate_prompt_tokens or 0)
    cand_cached = int(row.candidate_cached_tokens or 0)
    sampled = _ratio(cached, prompt)
    sampled_estimate = _ratio(cand_cached, cand_prompt)
    estimate = None
    if sampled is not None and sampled_estimate is not None:
        base = rate if rate is not None else sampled
        estimate = min(1.0, max(0.0, base + sampled_estimate - sampled))
    saved_share = _ratio((prompt - cached) - (cand_prompt - cand_cached), prompt) or 0.0
    saved_per_day = prompt_per_day * saved_share
    ms_per_token = _ratio(float(row.ttft or 0.0), int(row.ttft_prefilled_tokens or 0))
    shown = samples >= min_samples
    gain = (sampled_estimate - sampled) if sampled is not None and sampled_estimate is not None else 0.0
    return CandidateAdvice(
        candidate=info.key,
        title=info.title,
        description=info.description,
        moves_content=info.moves_content,
        samples=samples,
        changed_samples=int(row.changed_samples or 0),
        sampled_hit_rate=sampled,
        sampled_estimated_hit_rate=sampled_estimate,
        estimated_hit_rate=estimate,
        tokens_saved_per_day=saved_per_day,
        prefill_ms_saved_per_day=None if ms_per_token is None else saved_per_day * ms_per_token,
        toml_lines=tuple(info.toml_lines(tenant)),
        shown=shown,
        recommended=shown and gain >= MIN_GAIN and saved_per_day > 0,
    )
