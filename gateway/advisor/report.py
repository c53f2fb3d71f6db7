"""Printing rule advice (`db.queries.advice`) for `prefixscope advise`, as text or JSON."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from db.advice import MERGE_HINT
from db.queries.advice import CandidateAdvice, TenantAdvice


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def tokens_text(value: float) -> str:
    """A token count as the reports print it: `375`, `4.5k`, `1.2M`."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}"


def range_label(since: str) -> str:
    """How the queried range reads after a figure: `over the last 7d` for a duration, `since <time>` otherwise."""
    text = since.strip()
    duration = text[:1].isdigit() and text[-1:].isalpha() and "-" not in text
    return f"over the last {text}" if duration else f"since {text}"


def per_day_note(days: float) -> str:
    """After a per-day figure: empty for a range of whole days, else says it is extrapolated (shapes: `days` > 0)."""
    if days >= 1:
        return ""
    return f" (extrapolated to a day from a {days * 24:.1f} h range)"


def _duration_ms(value: float | None) -> str:
    if value is None:
        return "unknown (no TTFT or engine prefill speed recorded)"
    seconds = value / 1000
    if abs(seconds) >= 3600:
        return f"{seconds / 3600:.1f} h"
    if abs(seconds) >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


def _has_gain(candidate: CandidateAdvice) -> bool:
    """Recommended, or gains but less than another: what the `->` summary lists (a `[no gain]` one is not)."""
    return candidate.shown and (candidate.recommended or candidate.outranked_by is not None)


def candidate_lines(candidate: CandidateAdvice, days: float = 1.0) -> list[str]:
    """The text block of one candidate."""
    if candidate.recommended:
        label = "RECOMMENDED"
    elif candidate.outranked_by is not None:
        label = f"gains less than: {candidate.outranked_by}"
    else:
        label = "no gain" if candidate.shown else "not enough samples"
    lines = [f"  {candidate.title} [{label}] - {candidate.samples} sampled requests"]
    if not candidate.shown:
        return lines
    lines += [
        f"    what it changes: {candidate.description}"
        + (" (moves content: changes what the model reads)" if candidate.moves_content else ""),
        f"    token hit rate: {_pct(candidate.sampled_hit_rate)} on the samples -> "
        f"{_pct(candidate.sampled_estimated_hit_rate)} with it "
        f"(changed {candidate.changed_samples} of {candidate.samples})",
    ]
    if candidate.tokens_saved_per_day > 0:
        lines.append(
            f"    saves per day: {tokens_text(candidate.tokens_saved_per_day)} prompt tokens, "
            f"{_duration_ms(candidate.prefill_ms_saved_per_day)} of prefill{per_day_note(days)}"
        )
    else:
        lines.append("    saves per day: nothing")
    if candidate.recommended:
        lines.append(f"    to enable it, in prefixscope.toml ({MERGE_HINT}):")
        lines += [f"      {line}" for line in candidate.toml_lines]
    return lines


def format_text(found: list[TenantAdvice], tenant: str | None = None, since: str = "1d") -> str:
    """The text report; `since` is the queried range as given (`7d`, or an ISO time) and labels "today"."""
    if not found:
        if tenant is not None:
            return (
                f"no rule advice for tenant {tenant!r} in this range (check the name: `prefixscope stats --by tenant` "
                "lists the tenants; advice needs advice_sample_rate above 0 and sampled requests)"
            )
        return (
            "no rule advice in this range (the gateway samples every request of a tenant with advice_sample_rate "
            "above 0 while the advisor has capacity: send traffic through it or pick a longer --since)"
        )
    blocks = []
    for tenant in found:
        head = (
            f"tenant {tenant.tenant}: token hit rate {_pct(tenant.token_hit_rate)} {range_label(since)} "
            f"(on {tenant.samples} requests sampled under its current settings), "
            f"{tokens_text(tenant.prompt_tokens_per_day)} prompt tokens per day{per_day_note(tenant.days)}"
        )
        lines = [head]
        for candidate in tenant.candidates:
            if _has_gain(candidate):
                lines.append(
                    f"  -> {candidate.title}: estimated {_pct(candidate.estimated_hit_rate)} "
                    f"(from {candidate.samples} samples)"
                )
        if tenant.needs_more_samples:
            lines.append(
                f"  not enough sampled requests yet to advise: {tenant.most_samples} of the {tenant.min_samples} "
                f"an estimate needs; {tenant.samples_needed} more requests (each is sampled while the advisor has "
                "capacity)"
            )
        elif not tenant.recommendations:
            lines.append("  nothing to recommend: no rule that is off would raise the hit rate")
        for candidate in tenant.candidates:
            lines += candidate_lines(candidate, tenant.days)
        hidden = [c for c in tenant.candidates if not c.shown]
        if hidden:
            lines.append(f"  (estimates on fewer than {tenant.min_samples} sampled requests are not shown)")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


# What an estimate on too few samples does not show.
_HIDDEN = ("sampled_estimated_hit_rate", "estimated_hit_rate", "tokens_saved_per_day", "prefill_ms_saved_per_day")


def to_json(found: list[TenantAdvice]) -> list[dict[str, Any]]:
    result = []
    for tenant in found:
        data = asdict(tenant)
        data["candidates"] = [
            {**asdict(c), "toml": "\n".join(c.toml_lines)} | ({} if c.shown else dict.fromkeys(_HIDDEN))
            for c in tenant.candidates
        ]
        result.append(data)
    return result


def _prices(config: str | None) -> Any:
    from pathlib import Path

    from db.retention.prices import UpstreamPrices

    path = Path(config) if config is not None else Path("prefixscope.toml")
    if config is not None and not path.exists():
        raise ValueError(f"--config {config}: no such file")
    return UpstreamPrices.from_file(path)


def _measured_prefill_ms_per_token(conn: Any) -> Any:
    """upstream name -> ms per prefilled token from the engine's latest recorded context (None when unknown)."""
    from db.engine_context import latest_engine_context

    def speed(upstream: str) -> float | None:
        context = latest_engine_context(conn, upstream)
        rate = None if context is None else context.prefill_tokens_per_s
        return 1000.0 / rate if rate else None

    return speed


def advise_command(args: argparse.Namespace) -> int:
    """Raises ValueError (bad options, prices), `db.errors.DatabaseError` or SQLAlchemyError (the caller prints)."""
    from db.config import database_url_from_env
    from db.engine import create_sync_engine_for
    from db.queries.advice import advice
    from db.queries.patterns import fleet_patterns
    from db.queries.retention import retention_advice
    from db.readiness import require_schema
    from db.timeutil import parse_moment, utc_now
    from gateway.advisor.retention_report import format_patterns, format_retention, patterns_json, retention_json

    if args.min_samples < 1:
        raise ValueError("--min-samples must be at least 1")
    if args.top < 1:
        raise ValueError("--top must be at least 1")
    prices = _prices(args.config)
    since = parse_moment(args.since, utc_now())
    url = database_url_from_env(args.database_url)
    require_schema(url, explicit=args.database_url is not None)  # reading never creates a database
    engine = create_sync_engine_for(url)
    try:
        with engine.connect() as conn:
            found = advice(conn, since, tenant=args.tenant, min_samples=args.min_samples)
            speeds = _measured_prefill_ms_per_token(conn)
            retention = retention_advice(
                conn, since, lambda name: prices.for_upstream(name, speeds(name)), tenant=args.tenant, top=args.top
            )
            patterns = fleet_patterns(conn, since, tenant=args.tenant, top=args.top)
    finally:
        engine.dispose()
    if args.json:
        document = {
            "rules": to_json(found),
            "retention": retention_json(retention),
            "patterns": patterns_json(patterns),
        }
        print(json.dumps(document, indent=2))
    else:
        print(format_text(found, args.tenant, args.since))
        print()
        print(format_retention(retention))
        print()
        print(format_patterns(patterns))
    return 0
