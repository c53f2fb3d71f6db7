"""The adapter interface shared by all upstream kinds.

An adapter is stateless and knows four things about one kind of server: which body field carries the cache
salt (if any), which carries the retention class (if any), where its responses report cached prompt tokens (and their
split over cache tiers), and which response headers describe the match.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.retention import REQUEST_FIELD as RETENTION_FIELD
from gateway.upstreams.tiers import TierSplit

# Fields through which a client could choose a cache namespace on some server. The gateway always removes them
# and sets only the salt it derived itself.
CLIENT_SALT_FIELDS = ("cache_salt", "salt", "extra_key", "prompt_cache_key")


@dataclass(frozen=True, slots=True)
class UsageReport:
    """Token counts of one response; None means the upstream did not say."""

    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    # Where the matched tokens' KV was found (device, host, disk) and the time spent loading it back to the device;
    # None when the upstream does not report it (every kind but the local engine).
    tiers: TierSplit | None = None
    cache_load_ms: float | None = None


@dataclass(frozen=True, slots=True)
class CacheReport:
    """What the upstream said about its prefix-cache match in response headers (local engine only)."""

    miss_kind: str | None = None
    matched_tokens: int | None = None
    prompt_tokens: int | None = None
    # Leading tokens of template text alone (a match within them reused nothing of the request).
    template_tokens: int | None = None
    # Where the first uncached token lies in the request: segment (`tools`, `system`, `messages[i]`, `prompt`) and
    # character offset inside it, as the engine located it.
    divergence_segment: str | None = None
    divergence_char_offset: int | None = None
    # The engine's own queue + prefill time to the first token (non-streamed responses).
    ttft_ms: float | None = None
    # The matched tokens by tier (`x-prefix-cache-tiers`).
    tiers: TierSplit | None = None
    # Tokens per cache page; the longest prefix of the prompt an earlier request in the namespace computed (tokens,
    # >= matched_tokens); the first token of each segment (`(("system", 3), ("messages[1]", 40))`).
    page_size: int | None = None
    seen_tokens: int | None = None
    segment_starts: tuple[tuple[str, int], ...] | None = None
    # Where `seen_tokens` ends in the request (segment, character offset), as the engine located it.
    seen_segment: str | None = None
    seen_char_offset: int | None = None
    # On an evicted/expired miss: the tier the dropped prefix was last held in, its retention class and the seconds
    # it had been idle (`x-prefix-cache-dropped`).
    dropped_tier: str | None = None
    dropped_retention: str | None = None
    dropped_idle_s: float | None = None


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def usage_from_openai_shape(payload: Mapping[str, Any]) -> UsageReport:
    """Read `usage.{prompt,completion}_tokens` and `usage.prompt_tokens_details.cached_tokens`."""
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return UsageReport()
    details = usage.get("prompt_tokens_details")
    cached = _int_or_none(details.get("cached_tokens")) if isinstance(details, dict) else None
    return UsageReport(
        prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
        cached_tokens=cached,
        completion_tokens=_int_or_none(usage.get("completion_tokens")),
    )


class UpstreamAdapter:
    """Base adapter: the OpenAI response shape, no salt, no match headers, no hash chains, no dry-run match."""

    kind = "openai"
    salt_field: str | None = None
    # The body field that takes a retention class (`gateway.retention`); None: the server has no such field, and the
    # gateway sends none (OpenAI's own `prompt_cache_retention` is a different field with different classes).
    retention_field: str | None = None
    # Response headers passed back to the client unchanged (lower case).
    passthrough_headers: tuple[str, ...] = ()
    # Whether the server returns a prompt's block hash chain when asked (`ask_for_hash_chain`).
    returns_hash_chain = False
    # Whether the server answers `POST /v1/cache/match` (a dry-run match of a request).
    supports_dry_run_match = False

    def ask_for_hash_chain(self, request: dict[str, Any], block_size: int) -> None:
        """Ask for the prompt's block hash chain, in place on the gateway's own copy of the request (a no-op for
        servers that cannot return one)."""

    def apply_salt(self, request: dict[str, Any], salt: str) -> dict[str, Any]:
        """A copy of `request` without client-supplied salt fields and with the tenant's salt where this kind
        of server takes it. The input is not mutated."""
        cleaned = {k: v for k, v in request.items() if k not in CLIENT_SALT_FIELDS}
        if self.salt_field is not None:
            cleaned[self.salt_field] = salt
        return cleaned

    def apply_retention(self, request: dict[str, Any], retention: str | None) -> None:
        """Set the retention class, in place on the gateway's own copy of the request: the client's
        `cache_retention` always goes (the gateway decided the class), and `retention` is sent where this kind of
        server takes one."""
        request.pop(RETENTION_FIELD, None)
        if retention is not None and self.retention_field is not None:
            request[self.retention_field] = retention

    def usage(self, payload: Mapping[str, Any]) -> UsageReport:
        """Usage from a non-streamed response body or from a stream's final usage chunk."""
        return usage_from_openai_shape(payload)

    def cache_report(self, headers: Mapping[str, str]) -> CacheReport:
        return CacheReport()

    def has_usage(self, payload: Mapping[str, Any]) -> bool:
        """Whether a stream chunk carries the usage this adapter reads."""
        return isinstance(payload.get("usage"), dict)
