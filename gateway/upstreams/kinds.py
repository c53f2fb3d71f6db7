"""The concrete upstream kinds."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from db.records import MISS_KINDS
from gateway.retention import REQUEST_FIELD as RETENTION_FIELD
from gateway.upstreams.base import CacheReport, UpstreamAdapter, UsageReport, _int_or_none
from gateway.upstreams.engine_report import LEDGER_HEADERS, ledger_fields
from gateway.upstreams.prompt_cache_key import FIELD as PROMPT_CACHE_KEY
from gateway.upstreams.prompt_cache_key import derive_prompt_cache_key
from gateway.upstreams.tiers import HEADER_TIERS, load_ms_from_prefix_cache, tiers_from_header, tiers_from_prefix_cache


class OpenAICompatibleAdapter(UpstreamAdapter):
    """Any OpenAI-compatible server, hosted APIs included.

    Cached tokens come from `usage.prompt_tokens_details.cached_tokens` when present and are recorded as NULL
    (unknown) when absent. Such servers take no cache salt, so the gateway sends none (and strips any the client
    sent). Hosted APIs isolate their prompt caches per organization: every tenant that reaches one through the
    same upstream entry (the same API key) shares that organization's cache. Tenants that must not share a cache
    need separate upstream entries with separate organizations' keys.

    No retention class is sent: OpenAI's own `prompt_cache_retention` takes other classes (`in_memory`, `24h`), only
    some models accept `24h`, and other OpenAI-compatible servers know neither field, so no mapping is safe.

    In place of the client's `prompt_cache_key` the gateway sends one derived per tenant and prefix
    (`gateway.upstreams.prompt_cache_key`): a tenant's long prefixes stay on the same cache machines, apart from
    other tenants'.
    """

    kind = "openai"

    def apply_salt(self, request: dict[str, Any], salt: str) -> dict[str, Any]:
        cleaned = super().apply_salt(request, salt)
        cleaned[PROMPT_CACHE_KEY] = derive_prompt_cache_key(salt, request)
        return cleaned


class VLLMAdapter(UpstreamAdapter):
    """vLLM: salt in the `cache_salt` body field; cached tokens in `usage.prompt_tokens_details.cached_tokens`
    (vLLM reports them when started with `--enable-prompt-tokens-details`, NULL otherwise)."""

    kind = "vllm"
    salt_field = "cache_salt"


class SGLangAdapter(UpstreamAdapter):
    """SGLang: salt in `cache_salt` (its OpenAI server maps it to the radix cache's `extra_key`); cached tokens
    in `usage.prompt_tokens_details.cached_tokens` when the server runs with `--enable-cache-report`, or in
    `meta_info.cached_tokens` (the native API's shape), else NULL."""

    kind = "sglang"
    salt_field = "cache_salt"

    def usage(self, payload: Mapping[str, Any]) -> UsageReport:
        report = super().usage(payload)
        if report.cached_tokens is None:
            meta = payload.get("meta_info")
            if isinstance(meta, dict):
                report = replace(
                    report,
                    cached_tokens=_int_or_none(meta.get("cached_tokens")),
                    prompt_tokens=report.prompt_tokens
                    if report.prompt_tokens is not None
                    else _int_or_none(meta.get("prompt_tokens")),
                    completion_tokens=report.completion_tokens
                    if report.completion_tokens is not None
                    else _int_or_none(meta.get("completion_tokens")),
                )
        return report

    def has_usage(self, payload: Mapping[str, Any]) -> bool:
        return isinstance(payload.get("usage"), dict) or isinstance(payload.get("meta_info"), dict)


HEADER_MATCHED = "x-prefix-cache-matched-tokens"
HEADER_PROMPT = "x-prefix-cache-prompt-tokens"
HEADER_MISS = "x-prefix-cache-miss"
HEADER_TEMPLATE = "x-prefix-cache-template-tokens"
HEADER_SEGMENT = "x-prefix-cache-divergence-segment"
HEADER_OFFSET = "x-prefix-cache-divergence-offset"
HEADER_TTFT = "x-prefix-cache-ttft-ms"
_SEGMENT = re.compile(r"tools|system|prompt|messages\[\d{1,6}\]")


def _header_int(headers: Mapping[str, str], name: str) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _header_float(headers: Mapping[str, str], name: str) -> float | None:
    try:
        value = float(headers.get(name, ""))
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


class LocalEngineAdapter(UpstreamAdapter):
    """prefixscope's own engine: salt in `cache_salt`; cached tokens in `usage.prompt_tokens_details`; the match
    report (matched/prompt tokens, the miss kind, the template's opening tokens and where the match ended in the
    request; its page size, the tokens an earlier request computed, the segments' first tokens and what a miss
    dropped: `gateway.upstreams.engine_report`) in `x-prefix-cache-*` headers, known before the first byte (and its
    TTFT on non-streamed responses); the
    prompt's block hash chain in `prefix_cache.hash_chain` when asked (`return_hash_chain`); a dry-run match. It takes
    a retention class in `cache_retention` and splits the matched tokens over its cache tiers (`prefix_cache.tiers`
    and `load_ms` in the body or the usage chunk, `x-prefix-cache-tiers` in the headers)."""

    kind = "local_engine"
    salt_field = "cache_salt"
    retention_field = RETENTION_FIELD
    passthrough_headers = (HEADER_MATCHED, HEADER_PROMPT, HEADER_MISS, HEADER_TEMPLATE, HEADER_SEGMENT, HEADER_OFFSET,
                           HEADER_TTFT, HEADER_TIERS, *LEDGER_HEADERS)
    returns_hash_chain = True
    supports_dry_run_match = True

    def ask_for_hash_chain(self, request: dict[str, Any], block_size: int) -> None:
        if request.get("return_hash_chain") is True:
            return  # the client asked itself, with its own block size
        request["return_hash_chain"] = True
        request["hash_block_size"] = block_size

    def cache_report(self, headers: Mapping[str, str]) -> CacheReport:
        miss = headers.get(HEADER_MISS)
        segment = headers.get(HEADER_SEGMENT)
        return CacheReport(
            miss_kind=miss if miss in MISS_KINDS else None,
            matched_tokens=_header_int(headers, HEADER_MATCHED),
            prompt_tokens=_header_int(headers, HEADER_PROMPT),
            template_tokens=_header_int(headers, HEADER_TEMPLATE),
            divergence_segment=segment if segment is not None and _SEGMENT.fullmatch(segment) else None,
            divergence_char_offset=_header_int(headers, HEADER_OFFSET),
            ttft_ms=_header_float(headers, HEADER_TTFT),
            tiers=tiers_from_header(headers.get(HEADER_TIERS)),
            **ledger_fields(headers),
        )

    def usage(self, payload: Mapping[str, Any]) -> UsageReport:
        report = super().usage(payload)
        prefix_cache = payload.get("prefix_cache")
        if not isinstance(prefix_cache, dict):
            return report
        if report.cached_tokens is None:
            report = replace(report, cached_tokens=_int_or_none(prefix_cache.get("matched_tokens")))
        tiers = tiers_from_prefix_cache(prefix_cache)
        load_ms = load_ms_from_prefix_cache(prefix_cache)
        if tiers is not None or load_ms is not None:
            report = replace(report, tiers=tiers, cache_load_ms=load_ms)
        return report


def anthropic_usage(usage: Any) -> tuple[UsageReport, int | None]:
    """An Anthropic `usage` object as a `UsageReport` (prompt = input + cache reads + cache writes; cached = reads),
    and the cache writes (None when not reported)."""
    if not isinstance(usage, dict):
        return UsageReport(), None
    parts = [_int_or_none(usage.get(name)) for name in ("input_tokens", "cache_read_input_tokens")]
    writes = _int_or_none(usage.get("cache_creation_input_tokens"))
    prompt = None if parts[0] is None else parts[0] + (parts[1] or 0) + (writes or 0)
    return UsageReport(prompt, parts[1], _int_or_none(usage.get("output_tokens"))), writes


class AnthropicAdapter(UpstreamAdapter):
    """An Anthropic-compatible server (Anthropic's API or one that speaks it): Messages requests pass through after
    normalization (`gateway.anthropic.passthrough`); usage comes from `usage.input_tokens`,
    `cache_read_input_tokens` and `cache_creation_input_tokens`. No cache salt: as with hosted OpenAI-style APIs,
    tenants that must not share a cache need separate upstream entries with separate organizations' keys."""

    kind = "anthropic"

    def usage(self, payload: Mapping[str, Any]) -> UsageReport:
        if "choices" in payload or "prompt_tokens" in (payload.get("usage") or {}):
            return super().usage(payload)  # its OpenAI-compatible chat endpoint
        return anthropic_usage(payload.get("usage"))[0]
