"""The rule advisor's read side: per tenant, what each candidate rule would gain, from the `hourly_advice` rollup and
the tenant's own `hourly_rollups` (its prompt tokens per day).

Only samples taken under the tenant's current settings count: `hourly_advice` is keyed by a fingerprint of the settings
each sample was served under, and the fingerprint of the latest sample in the range is the current one. Both "today"
(the samples' actual token hit rate) and "with the rule" (their estimated rate with the candidate on) come from those
same samples, so a rule the tenant has since turned on is no longer a candidate and an old, low hit rate never
inflates a gain. Tokens saved per day scale the prefilled tokens the samples would have saved, per sampled prompt
token, to the tenant's prompt tokens per day (never below 0); prefill time uses the samples' own TTFT per prefilled
token (gateway-measured for streamed requests, engine-reported for the others) or, when no sample has a TTFT, the
prefill speed recorded from the engine (`db.engine_context`). An estimate on fewer than `min_samples` sampled requests
is marked not shown, and is never recommended; of mutually exclusive candidates (the hoist placements) only the one
with the highest estimate is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Float, cast, func, select

from db.advice import DEFAULT_MIN_SAMPLES, candidate_info, exclusive_group
from db.engine_context import latest_engine_context
from db.models import HourlyAdvice, table_of
from db.queries.history import query_range
from db.queries.totals import ROLLUPS, Reader, rollup_filters
from db.timeutil import observed_days

ADVICE = table_of(HourlyAdvice)
# A candidate is recommended when it would raise the token hit rate by at least this much (and save tokens).
MIN_GAIN: float = 0.02
_SUMMED = (
    "samples",
    "changed_samples",
    "prompt_tokens",
    "cached_tokens",
    "candidate_prompt_tokens",
    "candidate_cached_tokens",
    "ttft_prefilled_tokens",
)


@dataclass(frozen=True)
class CandidateAdvice:
    """One candidate rule for one tenant. Rates are fractions in [0, 1]; None when there is nothing to divide by.

    `sampled_hit_rate` is the samples' actual token hit rate, `estimated_hit_rate` (same as
    `sampled_estimated_hit_rate`) their estimated rate with the candidate on. `outranked_by` names the better candidate
    of the same mutually exclusive group, when that one is recommended instead.
    """

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
    outranked_by: str | None = None


@dataclass(frozen=True)
class TenantAdvice:
    """A tenant's current figures and its candidates, best first.

    `token_hit_rate` is the actual token hit rate of the `samples` requests sampled under the tenant's current
    settings (`settings_fingerprint`) in the range; `prompt_tokens_per_day` covers all its requests in the range.
    """

    tenant: str
    token_hit_rate: float | None
    prompt_tokens_per_day: float
    days: float
    min_samples: int
    candidates: tuple[CandidateAdvice, ...]
    samples: int = 0
    settings_fingerprint: str = ""

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

    @property
    def samples_needed(self) -> int:
        """How many more sampled requests the best-sampled candidate needs before its estimate is shown."""
        return max(0, self.min_samples - self.most_samples)


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def _current_rows(conn: Reader, start: datetime, end: datetime, tenant: str | None) -> dict[str, tuple[str, list[Any]]]:
    """Per tenant: its current settings fingerprint (that of its latest sample) and the summed rows under it."""
    sums = [cast(func.sum(ADVICE.c[name]), BigInteger).label(name) for name in _SUMMED]
    stmt = (
        select(
            ADVICE.c.tenant,
            ADVICE.c.settings_fingerprint,
            ADVICE.c.candidate,
            *sums,
            cast(func.sum(ADVICE.c.ttft_ms_sum), Float).label("ttft"),
            func.max(ADVICE.c.last_sample_at).label("last_sample_at"),
        )
        .where(*rollup_filters(ADVICE, start, end, tenant=tenant))
        .group_by(ADVICE.c.tenant, ADVICE.c.settings_fingerprint, ADVICE.c.candidate)
    )
    rows: dict[str, dict[str, list[Any]]] = {}
    latest: dict[str, tuple[Any, str]] = {}
    for row in conn.execute(stmt):
        rows.setdefault(row.tenant, {}).setdefault(row.settings_fingerprint, []).append(row)
        mark = (row.last_sample_at, row.settings_fingerprint)
        if row.tenant not in latest or mark > latest[row.tenant]:
            latest[row.tenant] = mark
    return {name: (latest[name][1], rows[name][latest[name][1]]) for name in rows}


def _engine_ms_per_token(conn: Reader) -> float | None:
    context = latest_engine_context(conn)  # type: ignore[arg-type]
    speed = None if context is None else context.prefill_tokens_per_s
    return 1000.0 / speed if speed else None


def advice(
    conn: Reader,
    since: datetime,
    until: datetime | None = None,
    tenant: str | None = None,
    min_samples: int = DEFAULT_MIN_SAMPLES,
) -> list[TenantAdvice]:
    """Per tenant with advice in [since, until) (whole UTC hours), its candidates under its current settings, ordered
    by estimated gain."""
    start, end = query_range(since, until)
    days = observed_days(end - start)
    current = _current_rows(conn, start, end, tenant)
    if not current:
        return []
    totals_stmt = (
        select(ROLLUPS.c.tenant, cast(func.sum(ROLLUPS.c.cache_known_prompt_tokens), BigInteger).label("prompt"))
        .where(*rollup_filters(ROLLUPS, start, end, tenant=tenant))
        .group_by(ROLLUPS.c.tenant)
    )
    totals = {row.tenant: int(row.prompt or 0) for row in conn.execute(totals_stmt)}
    engine_ms: list[float | None] = []  # looked up once, when a tenant's samples have no TTFT
    result = []
    for name in sorted(current):
        fingerprint, rows = current[name]
        widest = max(rows, key=lambda row: (int(row.samples or 0), row.candidate))
        samples = int(widest.samples or 0)
        rate = _ratio(int(widest.cached_tokens or 0), int(widest.prompt_tokens or 0))
        per_day = totals.get(name, 0) / days
        ms_per_token = _ratio(
            sum(float(row.ttft or 0.0) for row in rows), sum(int(row.ttft_prefilled_tokens or 0) for row in rows)
        )
        if ms_per_token is None:
            if not engine_ms:
                engine_ms.append(_engine_ms_per_token(conn))
            ms_per_token = engine_ms[0]
        candidates = _exclusive([_candidate(name, row, per_day, ms_per_token, min_samples) for row in rows])
        candidates.sort(key=lambda c: (not c.shown, -(c.tokens_saved_per_day), c.candidate))
        result.append(TenantAdvice(name, rate, per_day, days, min_samples, tuple(candidates), samples, fingerprint))
    return result


def _exclusive(candidates: list[CandidateAdvice]) -> list[CandidateAdvice]:
    """Only the best recommended candidate of each mutually exclusive group stays recommended."""
    best: dict[str, CandidateAdvice] = {}
    for c in candidates:
        group = exclusive_group(c.candidate)
        if group is None or not c.recommended:
            continue
        mark = (c.estimated_hit_rate or 0.0, c.tokens_saved_per_day, c.candidate)
        held = best.get(group)
        if held is None or mark > (held.estimated_hit_rate or 0.0, held.tokens_saved_per_day, held.candidate):
            best[group] = c
    return [
        c
        if not c.recommended or best.get(exclusive_group(c.candidate) or "", c) is c
        else replace(c, recommended=False, outranked_by=best[exclusive_group(c.candidate) or ""].title)
        for c in candidates
    ]


def _candidate(
    tenant: str, row: Any, prompt_per_day: float, ms_per_token: float | None, min_samples: int
) -> CandidateAdvice:
    info = candidate_info(row.candidate)
    samples = int(row.samples or 0)
    prompt = int(row.prompt_tokens or 0)
    cached = int(row.cached_tokens or 0)
    cand_prompt = int(row.candidate_prompt_tokens or 0)
    cand_cached = int(row.candidate_cached_tokens or 0)
    sampled = _ratio(cached, prompt)
    sampled_estimate = _ratio(cand_cached, cand_prompt)
    saved_share = max(0.0, _ratio((prompt - cached) - (cand_prompt - cand_cached), prompt) or 0.0)
    saved_per_day = prompt_per_day * saved_share
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
        estimated_hit_rate=sampled_estimate,
        tokens_saved_per_day=saved_per_day,
        prefill_ms_saved_per_day=None if ms_per_token is None else saved_per_day * ms_per_token,
        toml_lines=tuple(info.toml_lines(tenant)),
        shown=shown,
        recommended=shown and gain >= MIN_GAIN and saved_per_day > 0,
    )
