"""`RequestRecord`: what the gateway records about one request, independent of how it is stored.

The same value travels through the writer's queue, the spill file (one JSON object per line) and into a `requests`
row, so it is a plain frozen dataclass with a lossless JSON form.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from functools import cache
from datetime import datetime
from typing import Any, Final

from db.advice import AdviceOutcome
from db.chains import RequestChain
from db.signatures import PromptSignature
from db.timeutil import as_utc

ENDPOINTS: Final = ("chat.completions", "completions", "messages")

# Lifetime classes of cached KV, shortest first: Anthropic's `cache_control.ttl` values, and the engine's
# `cache_retention` body field (`persistent` is exempt from TTL and kept on disk rather than dropped).
RETENTION_CLASSES: Final = ("5m", "1h", "persistent")

# Tiers that can serve cached tokens, fastest first (the engine's `prefix_cache.tiers`).
CACHE_TIERS: Final = ("device", "host", "disk")

# How far the prompt was served from cache and why not further, as the engine reports it: `hit` everything that
# could be was (all but the last token, page-aligned); `partial` a prefix matched, then the prompt diverged from
# anything cached; `cold` nothing matched and nothing like it was cached recently; `evicted` / `expired` the next
# part had been cached but was evicted for space or dropped by TTL (the engine's ghost index tells these apart).
MISS_KINDS: Final = ("hit", "partial", "cold", "evicted", "expired")

# Why the prompt was not served further from cache, as the gateway explains it (where the engine's `miss_kind` says
# how far it matched): `hit` nothing cacheable was lost; `model_changed` / `tools_changed` / `system_changed` /
# `messages_changed` the first difference from the cached prefix lies there; `volatile_value` it is a value that
# changes on every call (a date, an id); `reordered` the same parts in another order; `new_prefix` nothing like it
# was cached; `evicted` / `expired` it was cached but dropped for space or by TTL; `below_page` everything matched but a
# tail shorter than one cache page.
MISS_REASONS: Final = (
    "hit",
    "model_changed",
    "tools_changed",
    "system_changed",
    "messages_changed",
    "volatile_value",
    "reordered",
    "new_prefix",
    "evicted",
    "expired",
    "below_page",
)


TTFT_SOURCES: Final = ("gateway", "engine")
DIVERGENCE_SOURCES: Final = ("engine", "history")


def is_hit(cached_tokens: int | None, template_tokens: int | None) -> bool | None:
    """A hit reused more than the template's fixed opening (`template_tokens`, 0 when unknown); None when unknown."""
    if cached_tokens is None:
        return None
    return cached_tokens > (template_tokens or 0)


@cache
def _field_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(RequestRecord))


# Routing policies over a replica set, and where a cache-aware prediction came from: `events` the replica's KV events
# (vLLM's format, over ZeroMQ), `approximate` what the gateway itself sent to that replica, `none` no index knew the
# replica; `precise` (rows before the KV events) the engine's former HTTP event feed.
ROUTING_POLICIES: Final = ("cache_aware", "round_robin", "least_loaded")
ROUTING_INDEX_SOURCES: Final = ("events", "approximate", "none", "precise")


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request as seen by the gateway.

    Token counts are None when unknown (an upstream that does not report them, or a request that failed before
    usage was known); 0 means a known zero. A hit reused more than the template's fixed opening (`is_hit`).
    """

    request_id: str
    created_at: datetime
    tenant: str
    key_id: str | None
    endpoint: str
    model: str
    upstream: str
    stream: bool
    status_code: int
    error_type: str | None
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    ttft_ms: float | None
    latency_ms: float
    applied_rules: tuple[str, ...] = ()
    miss_kind: str | None = None
    prefix_hash: str | None = None
    prompt_text: str | None = None
    # Token index at which the prompt first differed from the longest cached prefix (the first uncached token), when
    # the engine located the divergence itself.
    diverged_at_token: int | None = None
    # Why the rest missed (one of `MISS_REASONS`), and where the prompt first differed from the cached one: a segment
    # (`tools`, `system`, `messages[3]`) and a character offset inside it.
    miss_reason: str | None = None
    divergence_segment: str | None = None
    divergence_char_offset: int | None = None
    # Prompt tokens computed rather than served from cache (prompt - matched); 0 for a hit.
    recomputed_tokens: int | None = None
    # Tokens normalization gained, from a dry-run match of the un-normalized request; None when not sampled.
    normalization_gain_tokens: int | None = None
    # The prompt's block hash chain, for the what-if simulator (recorded while the tenant's `hash_chain` is on).
    chain: RequestChain | None = None
    # Sampled by the rule advisor: per candidate rule, the tokens this request would have hit (`db.advice`).
    advice: tuple[AdviceOutcome, ...] = ()
    # Sampled by the rule advisor: keyed block hashes of the prompt, for the fleet patterns (`db.patterns`).
    signature: PromptSignature | None = None
    # Where `ttft_ms` comes from: `gateway` (first streamed content byte, measured by the gateway) or `engine` (the
    # engine's own queue + prefill time, for non-streamed responses); None when there is no TTFT.
    ttft_source: str | None = None
    # How the divergence was located: `engine` (its own report) or `history` (approximated by the gateway from the
    # nearest earlier request, for upstreams that do not report it); None when nothing diverged.
    divergence_source: str | None = None
    # Leading prompt tokens of the chat template's fixed opening, when the engine reports them: matching only these
    # reused nothing of the request, so it is not a hit.
    template_tokens: int | None = None
    # The engine's label of the tenant's cache namespace (`gateway.tenancy.namespace_label`), when a salt was sent:
    # kept in `namespace_tenants` so the dashboard can name the tenant of each namespace in the engine's cache.
    namespace_label: str | None = None
    # How `prefix_hash` and the chain's hashes are keyed: None for rows from before keyed hashes (plain hashes of
    # the prompt), 1 for keyed BLAKE2b under a per-tenant key derived from the gateway's secret (gateway.record_keys).
    hash_key_version: int | None = None
    # Prompt tokens written to the cache (`cache_creation_input_tokens` on the Messages API; None elsewhere), and the
    # retention class (`RETENTION_CLASSES`) the request asked for: the longest of its cache breakpoints on the Messages
    # API, the tenant's effective `cache_retention` elsewhere (None when none applies).
    cache_write_tokens: int | None = None
    retention_class: str | None = None
    # When the upstream is a replica set: the replica that served the request (its URL), the routing policy, the
    # cached tokens the router predicted there, and where that prediction came from (`ROUTING_INDEX_SOURCES`).
    replica: str | None = None
    routing_policy: str | None = None
    predicted_match_tokens: int | None = None
    routing_index_source: str | None = None
    # `cached_tokens` split by the tier that served them (device pool, host memory, disk), and the time the engine
    # spent loading the host and disk part back to the device (ms); None for upstreams that do not report tiers.
    cached_tokens_device: int | None = None
    cached_tokens_host: int | None = None
    cached_tokens_disk: int | None = None
    cache_load_ms: float | None = None

    @property
    def cache_hit(self) -> bool | None:
        """True when cached tokens reach beyond the template's fixed opening, False on a known miss, None when
        unknown."""
        return is_hit(self.cached_tokens, self.template_tokens)

    def to_json(self) -> str:
        """One line of JSON (no newlines inside), as written to the spill file."""
        # A shallow copy (asdict deep-copies every value, several times slower): only the tuples and the chain below
        # are not plain JSON values, and they are replaced.
        data: dict[str, Any] = {name: getattr(self, name) for name in _field_names()}
        data["created_at"] = as_utc(self.created_at).isoformat()
        data["applied_rules"] = list(self.applied_rules)
        data["chain"] = None if self.chain is None else self.chain.to_dict()
        data["advice"] = [outcome.to_dict() for outcome in self.advice]
        data["signature"] = None if self.signature is None else self.signature.to_dict()
        # ASCII output survives any string (lone surrogates included); default=str keeps a value of an unexpected
        # type in readable form rather than failing the spill.
        return json.dumps(data, separators=(",", ":"), default=str)

    @classmethod
    def from_json(cls, line: str) -> RequestRecord:
        """The inverse of `to_json`; unknown keys are ignored so that older spill files stay readable."""
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError("a request record must be a JSON object")
        known = {f.name for f in fields(cls)}
        kwargs = {key: value for key, value in data.items() if key in known}
        kwargs["created_at"] = as_utc(datetime.fromisoformat(kwargs["created_at"]))
        kwargs["applied_rules"] = tuple(kwargs.get("applied_rules") or ())
        chain = kwargs.get("chain")
        kwargs["chain"] = None if chain is None else RequestChain.from_dict(chain)
        kwargs["advice"] = tuple(AdviceOutcome.from_dict(item) for item in kwargs.get("advice") or ())
        signature = kwargs.get("signature")
        kwargs["signature"] = None if signature is None else PromptSignature.from_dict(signature)
        return cls(**kwargs)
