"""Providers' own prompt-cache diagnostics: asked for when a tenant's settings say so (`diagnostics = true`), read from
the answer and recorded beside prefixscope's explanation.

Sources (the providers' API references and their official SDKs' types):

- OpenAI, Responses API ("Prompt cache diagnostics"; `openai.types.responses.Response.prompt_cache_diagnostics`):
  asked for with `prompt_cache_options.comparison_response_id` (a recent response of the same organization);
  answered with `prompt_cache_diagnostics`, one of `{"type": "cache_miss", "reason", "cache_missed_tokens",
  "comparison_reusable_tokens"}`, `{"type": "cache_hit"}`, `{"type": "comparison_response_not_found"}`,
  `{"type": "unavailable"}`. The Chat Completions API documents no diagnostics.
- Anthropic, Messages API ("Cache diagnostics"; `anthropic.types.Message.diagnostics`): asked for with
  `diagnostics: {"previous_message_id": ID or null}`; answered with `diagnostics: {"cache_miss_reason": {"type",
  "cache_missed_input_tokens"}}` (types `model_changed`, `system_changed`, `tools_changed`, `messages_changed`,
  `previous_message_not_found`, `unavailable`); `diagnostics: null` when no divergence was found, and
  `cache_miss_reason: null` while the provider's comparison is still pending.

The record keeps the provider's reason as it names it (for a miss, the reason; otherwise the outcome's type, or
`no_divergence` / `pending` for Anthropic's nulls) and the tokens it says missed.

The baseline each request is compared with is the tenant's previous response on the same upstream with the same
prefix (`Baselines`, keyed by tenant, upstream and the keyed prefix hash; bounded and expiring), unless the client
named one itself (`previous_response_id` on the Responses API wins too).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NO_DIVERGENCE = "no_divergence"
PENDING = "pending"
REASON_MAX_CHARS = 48


@dataclass(frozen=True, slots=True)
class ProviderDiagnosis:
    """What the provider said about this request's prompt-cache reuse: its reason (see the module docstring) and the
    input tokens it estimates missed (None when it gives none)."""

    reason: str
    missed_tokens: int | None = None


def _tokens(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _label(value: Any) -> str | None:
    return value[:REASON_MAX_CHARS] if isinstance(value, str) and value else None


def from_openai(diagnostics: Any) -> ProviderDiagnosis | None:
    """An OpenAI Response's `prompt_cache_diagnostics` (None when absent or not understood)."""
    if not isinstance(diagnostics, dict):
        return None
    kind = _label(diagnostics.get("type"))
    if kind is None:
        return None
    if kind == "cache_miss":
        reason = _label(diagnostics.get("reason")) or kind
        return ProviderDiagnosis(reason, _tokens(diagnostics.get("cache_missed_tokens")))
    return ProviderDiagnosis(kind)


def from_anthropic(message: dict[str, Any], asked: bool) -> ProviderDiagnosis | None:
    """The diagnosis in an Anthropic Message (or a stream event's `message`/delta object) that has a `diagnostics`
    key; with `asked` (the request sent `diagnostics`), a null there means no divergence was found."""
    if "diagnostics" not in message:
        return None
    diagnostics = message["diagnostics"]
    if diagnostics is None:
        return ProviderDiagnosis(NO_DIVERGENCE) if asked else None
    if not isinstance(diagnostics, dict):
        return None
    reason = diagnostics.get("cache_miss_reason")
    if reason is None:
        return ProviderDiagnosis(PENDING)
    if not isinstance(reason, dict) or _label(reason.get("type")) is None:
        return None
    return ProviderDiagnosis(_label(reason["type"]) or "", _tokens(reason.get("cache_missed_input_tokens")))


class Baselines:
    """The tenant's latest response id per (upstream, prefix), to compare the next request with. Bounded (least
    recently updated out first) and expiring; keyed by tenant, so no tenant is ever compared with another's."""

    def __init__(
        self, max_entries: int = 10_000, ttl_s: float = 3600.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._max_entries = max_entries
        self._ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str, str], tuple[str, float]] = OrderedDict()

    def latest(self, tenant: str, upstream: str, prefix: str | None) -> str | None:
        entry = self._entries.get((tenant, upstream, prefix or ""))
        if entry is None or self._clock() - entry[1] > self._ttl_s:
            return None
        return entry[0]

    def update(self, tenant: str, upstream: str, prefix: str | None, response_id: str) -> None:
        key = (tenant, upstream, prefix or "")
        self._entries.pop(key, None)
        self._entries[key] = (response_id, self._clock())
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)
