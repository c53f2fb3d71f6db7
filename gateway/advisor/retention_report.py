"""Printing retention advice (`db.queries.retention`) and fleet patterns (`db.queries.patterns`) for
`prefixscope advise`, as text or JSON-ready dicts."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from db.advice import MERGE_HINT
from db.patterns.finder import FleetPattern
from db.retention.advice import GAP_EDGES_S, GapHistogram, PrefixRetention, TenantRetention, UsedOnce, is_used_once
from db.retention.reuse import EntryLosses, PrefixReuse
from gateway.advisor.report import per_day_note, tokens_text


def _amount(value: float, unit: str) -> str:
    if unit == "ms":
        seconds = value / 1000
        return f"{seconds / 60:.1f} min of prefill" if abs(seconds) >= 60 else f"{seconds:.1f} s of prefill"
    for suffix, size in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f}{suffix} input-token equivalents"
    return f"{value:.0f} input-token equivalents"


def _seconds(value: float) -> str:
    """`3.5s`, `3m`, `1.5h`: one decimal at most, in the largest unit that fits."""
    for unit, size in (("h", 3600), ("m", 60)):
        if value >= size:
            return f"{round(value / size, 1):g}{unit}"
    return f"{round(value, 1):g}s"


def gap_line(gaps: GapHistogram) -> str:
    """`<=10s:3 <=1m:5 ... >1d:0`, then the median and 90th percentile gap."""
    if not gaps.total:
        return "no reuse (used once)"
    labels = [f"<={_seconds(edge)}" for edge in GAP_EDGES_S] + [f">{_seconds(GAP_EDGES_S[-1])}"]
    bins = " ".join(f"{label}:{count}" for label, count in zip(labels, gaps.counts, strict=True) if count)
    return f"{bins}; median {_seconds(gaps.median_s or 0)}, 90% within {_seconds(gaps.p90_s or 0)}"


def _losses(losses: tuple[EntryLosses, ...]) -> str:
    parts = []
    for loss in losses:
        idle = "" if loss.median_idle_s is None else f", median idle {_seconds(loss.median_idle_s)}"
        tokens = f", {tokens_text(loss.tokens)} tokens" if loss.tokens else ""
        parts.append(f"{loss.key} {loss.count}x (read {loss.reads_per_entry:.1f}x each before{tokens}{idle})")
    return ", ".join(parts)


def reuse_line(reuse: PrefixReuse) -> str | None:
    """`reads by tier: device 40 (12k tokens), host 3 (900 tokens); evicted from: device 5x (read 2.0x each
    before); expired by class: 5m 3x (...)`; None when the records say nothing of its entries."""
    parts = []
    if reuse.reads:
        parts.append("reads by tier: " + ", ".join(
            f"{r.tier} {r.requests} ({tokens_text(r.tokens)} tokens)" for r in reuse.reads))
    if reuse.evicted:
        parts.append(f"evicted from: {_losses(reuse.evicted)}")
    if reuse.expired:
        parts.append(f"expired by class: {_losses(reuse.expired)}")
    return "; ".join(parts) or None


def prefix_lines(prefix: PrefixRetention, unit: str, days: float = 1.0) -> list[str]:
    unread = "-" if prefix.unread_write_share is None else f"{100 * prefix.unread_write_share:.0f}%"
    best = prefix.best.retention
    return [
        f"  prefix {prefix.prefix_hash[:16]} ({prefix.prefix_tokens} tokens, {prefix.uses} use{'' if prefix.uses == 1 else 's'}): "
        f"today {prefix.today}, "
        f"best {best if best != 'none' else 'do not cache'} -> saves {_amount(prefix.saving_per_day, unit)} per day "
        f"more than today's class{per_day_note(days)}",
        f"    writes never read again today: {unread}; gaps between uses: {gap_line(prefix.gaps)}",
        *([f"    {line}"] if (line := reuse_line(prefix.reuse)) else []),
        f"    to do: {prefix.action}",
    ]


def used_once_line(once: UsedOnce, unit: str, days: float = 1.0) -> str:
    """`  12 prefixes used once (48.0k tokens in all): none read again; do not cache them ...`: the one line that
    stands for every prefix used once (their blocks would all say the same)."""
    plural = "" if once.prefixes == 1 else "es"
    head = f"  {once.prefixes} prefix{plural} used once ({tokens_text(once.tokens)} tokens in all): "
    if once.saving_per_day <= 0:
        return head + "none read again; nothing to change"
    return (head + f"none read again; not caching them saves {_amount(once.saving_per_day, unit)} per day"
            f"{per_day_note(days)} (send no cache breakpoint or retention class for them)")


def format_retention(found: list[TenantRetention]) -> str:
    if not found:
        return "retention: no prefix reuse recorded in this range (requests with a prefix hash and prompt tokens)"
    blocks = []
    for tenant in found:
        head = f"retention for tenant {tenant.tenant} ({tenant.upstream_kind} prices): "
        if tenant.advised_class == tenant.today_class:
            kept = any(prefix.kept_for_reuse for prefix in tenant.prefixes)
            why = "its prefixes' leading blocks are read from cache" if kept else "no other class saves more"
            head += f"keep today's class ({tenant.today_class}): {why}"
        else:
            advised = tenant.advised_class if tenant.advised_class != "none" else "do not cache"
            head += (f"advised class {advised}, saving {_amount(tenant.saving_per_day, tenant.unit)} per day over "
                     f"today's classes{per_day_note(tenant.days)}")
        lines = [head]
        for prefix in tenant.prefixes:
            if not is_used_once(prefix):
                lines += prefix_lines(prefix, tenant.unit, tenant.days)
        if tenant.used_once.prefixes:
            lines.append(used_once_line(tenant.used_once, tenant.unit, tenant.days))
        if tenant.toml_lines:
            lines.append(f"  to apply it, in prefixscope.toml ({MERGE_HINT}):")
            lines += [f"    {line}" for line in tenant.toml_lines]
        elif tenant.advised_class == "none":
            lines.append("  no prefixscope.toml setting turns caching off for a tenant: have its clients send no cache "
                         "breakpoint for these prefixes")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def format_patterns(patterns: list[FleetPattern]) -> str:
    if not patterns:
        return "fleet patterns: none found among the sampled prompts in this range"
    lines = ["fleet patterns (across tenants and conversations, from keyed block hashes):"]
    for p in patterns:
        lines.append(
            f"  {p.kind}: {p.requests} requests from {p.tenants} tenant{'' if p.tenants == 1 else 's'}, "
            f"{p.variants} variants, at {p.where}; costs {tokens_text(p.tokens_total)} tokens "
            f"({tokens_text(p.tokens_per_request)} per affected request), {tokens_text(p.shared_tokens)} tokens "
            "otherwise shared"
        )
        lines.append(f"    to do: {p.action}")
    return "\n".join(lines)


def retention_json(found: list[TenantRetention]) -> list[dict[str, Any]]:
    return [asdict(tenant) for tenant in found]


def patterns_json(patterns: list[FleetPattern]) -> list[dict[str, Any]]:
    return [asdict(p) for p in patterns]
