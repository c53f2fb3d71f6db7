"""`RequestRecord`: what the gateway records about one request, independent of how it is stored.

The same value travels through the writer's queue, the spill file (one JSON object per line) and into a `requests`
row, so it is a plain frozen dataclass with a lossless JSON form.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from datetime import datetime
from functools import cache
from typing import Any, Final

import msgspec

from db.advice import AdviceOutcome
from db.chains import RequestChain
from db.ledger import NOT_IN_LEDGER
from db.record_schema import stored
from db.signatures import PromptSignature
from db.timeutil import as_utc

ENDPOINTS: Final = ("chat.completions", "completions", "messages", "responses")

# Column widths of the text fields that other tables repeat (rollup keys).
TENANT_NAME_MAX: Final = 200
MODEL_NAME_MAX: Final = 200
MISS_REASON_MAX: Final = 32
SEGMENT_MAX: Final = 100

# What NULL means, for the fields that share a meaning.
UNREPORTED: Final = "the upstream did not report it (or the request failed before it was known)"
UNEXPLAINED: Final = "not explained: the upstream did not answer, or explanations are off"
NOT_A_REPLICA_SET: Final = "the upstream is not a replica set"
NO_TIERS: Final = "the upstream does not report cache tiers (or the report was malformed)"

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
# tail shorter than one cache page (or all that was shared with earlier requests was shorter than one page);
# `answer_rewritten` the client re-sent the previous answer differently; `routed_away` another replica held more of
# it; `cache_scope` it was cached under another tenant or salt, or matched but not read under the Messages API's
# cache breakpoints (none, or none at or past the model's minimum cacheable length).
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
    "answer_rewritten",
    "routed_away",
    "cache_scope",
)

UNAUTHENTICATED_TENANT: Final = "unauthenticated"
"""The tenant name recorded for requests refused before a key named a tenant (no key, a bad key). It is reserved (no
real tenant may take it, `db.tenants.validate_tenant_name`), so the read side shows those requests as `(rejected)`."""


TTFT_SOURCES: Final = ("gateway", "engine")
DIVERGENCE_SOURCES: Final = ("engine", "history")


def is_hit(cached_tokens: int | None, template_tokens: int | None) -> bool | None:
    """A hit reused more than the template's fixed opening (`template_tokens`, 0 when unknown); None when unknown."""
    if cached_tokens is None:
        return None
    return cached_tokens > (template_tokens or 0)


def uncached_prompt_tokens(record: "RequestRecord") -> int | None:
    """Prompt tokens not served from cache (`prompt_tokens - cached_tokens`, tokens) for every answered request, a
    hit's new suffix included; the explained `recomputed_tokens` when the usage is unknown (None when that is too).
    The `recomputed_tokens` span attribute and `/metrics` counters count this."""
    if record.prompt_tokens is None or record.cached_tokens is None:
        return record.recomputed_tokens
    return max(0, record.prompt_tokens - record.cached_tokens)


@cache
def _field_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(RequestRecord))


_JSON_ENCODER = msgspec.json.Encoder()
# Top-level values msgspec writes as `json.dumps` does (a float only when finite; the lists and dicts `to_json` builds
# hold strings, integers and booleans only).
_PLAIN_TYPES = frozenset({str, int, bool, type(None), list, dict})


def _plain_json(data: dict[str, Any]) -> str | None:
    """`to_json`'s dict as the text `json.dumps(data, separators=(",", ":"))` writes, in a few microseconds instead of
    tens; None (the caller falls back to `json.dumps`) for a value of another type, a non-finite float, a non-ASCII
    character or anything msgspec cannot encode."""
    for value in data.values():
        kind = type(value)
        if kind is float:
            if not math.isfinite(value):
                return None
        elif kind not in _PLAIN_TYPES:
            return None
    try:
        encoded = _JSON_ENCODER.encode(data)
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        return None
    return encoded.decode("ascii") if encoded.isascii() else None


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

    request_id: str = field(metadata=stored("string", max_chars=64, column="id", client_text=True))
    created_at: datetime = field(metadata=stored("datetime", unit="UTC"))
    # The tenant's name rather than a foreign key: history outlives tenants, and the writer must never fail a batch
    # because a tenant row is missing.
    tenant: str = field(metadata=stored("string", max_chars=TENANT_NAME_MAX, client_text=True))
    key_id: str | None = field(
        metadata=stored("string", max_chars=32, client_text=True, null="no key: open mode, or rejected before auth")
    )
    endpoint: str = field(metadata=stored("string", max_chars=32, client_text=True))  # one of `ENDPOINTS`
    model: str = field(metadata=stored("string", max_chars=MODEL_NAME_MAX, client_text=True))
    upstream: str = field(metadata=stored("string", max_chars=200, client_text=True))
    stream: bool = field(metadata=stored("bool"))
    status_code: int = field(metadata=stored("smallint"))  # the HTTP status sent to the client
    error_type: str | None = field(
        metadata=stored("string", max_chars=100, client_text=True, null="the request succeeded")
    )
    prompt_tokens: int | None = field(
        metadata=stored("int", unit="tokens", null=UNREPORTED, sums=("prompt_tokens",))
    )
    cached_tokens: int | None = field(
        metadata=stored("int", unit="tokens", null=UNREPORTED, sums=("cached_tokens",))
    )
    completion_tokens: int | None = field(
        metadata=stored("int", unit="tokens", null=UNREPORTED, sums=("completion_tokens",))
    )
    ttft_ms: float | None = field(metadata=stored("float", unit="ms", null="no first token (an error, no content)"))
    latency_ms: float = field(metadata=stored("float", unit="ms", sums=("latency_ms_sum",)))  # until the last byte
    # The normalization rules that changed the request, in pipeline order (and `record_sanitized:<field>` flags).
    applied_rules: tuple[str, ...] = field(default=(), metadata=stored("json"))
    miss_kind: str | None = field(  # one of `MISS_KINDS`
        default=None, metadata=stored("string", max_chars=16, client_text=True, null="the upstream does not say")
    )
    prefix_hash: str | None = field(  # keyed per tenant (`hash_key_version`)
        default=None, metadata=stored("string", max_chars=128, client_text=True, null="no prompt was read")
    )
    prompt_text: str | None = field(
        default=None,
        metadata=stored("text", listed=False, client_text=True, null="the tenant does not store prompt text"),
    )
    # Token index at which the prompt first differed from the longest cached prefix (the first uncached token), when
    # the engine located the divergence itself.
    diverged_at_token: int | None = field(
        default=None, metadata=stored("int", unit="tokens", null="the engine did not locate the divergence")
    )
    # Why the rest missed (one of `MISS_REASONS`), and where the prompt first differed from the cached one: a segment
    # (`tools`, `system`, `messages[3]`) and a character offset inside it.
    miss_reason: str | None = field(
        default=None,
        metadata=stored("string", max_chars=MISS_REASON_MAX, client_text=True, cut=True, null=UNEXPLAINED),
    )
    divergence_segment: str | None = field(
        default=None,
        metadata=stored("string", max_chars=SEGMENT_MAX, client_text=True, cut=True, null="nothing diverged"),
    )
    divergence_char_offset: int | None = field(
        default=None, metadata=stored("int", unit="characters", null="nothing diverged, or no offset known")
    )
    # Prompt tokens computed rather than served from cache (prompt - matched); 0 for a hit.
    recomputed_tokens: int | None = field(default=None, metadata=stored("int", unit="tokens", null=UNEXPLAINED))
    # Tokens normalization gained, from a dry-run match of the un-normalized request; None when not sampled.
    normalization_gain_tokens: int | None = field(
        default=None,
        metadata=stored("int", unit="tokens", null="not sampled", sums=("normalization_gain_tokens",)),
    )
    # The prompt's block hash chain, for the what-if simulator (recorded while the tenant's `hash_chain` is on); kept
    # in `request_chains`.
    chain: RequestChain | None = None
    # Sampled by the rule advisor: per candidate rule, the tokens this request would have hit (`db.advice`); kept in
    # `hourly_advice`.
    advice: tuple[AdviceOutcome, ...] = ()
    # Sampled by the rule advisor: keyed block hashes of the prompt, for the fleet patterns (`db.patterns`).
    signature: PromptSignature | None = None
    # Where `ttft_ms` comes from: `gateway` (first streamed content byte, measured by the gateway) or `engine` (the
    # engine's own queue + prefill time, for non-streamed responses); one of `TTFT_SOURCES`.
    ttft_source: str | None = field(default=None, metadata=stored("string", max_chars=16, null="no TTFT"))
    # How the divergence was located: `engine` (its own report) or `history` (approximated by the gateway from the
    # nearest earlier request, for upstreams that do not report it); one of `DIVERGENCE_SOURCES`.
    divergence_source: str | None = field(
        default=None, metadata=stored("string", max_chars=16, null="nothing diverged")
    )
    # Leading prompt tokens of the chat template's fixed opening, when the engine reports them: matching only these
    # reused nothing of the request, so it is not a hit.
    template_tokens: int | None = field(default=None, metadata=stored("int", unit="tokens", null=UNREPORTED))
    # The engine's label of the tenant's cache namespace (`gateway.tenancy.namespace_label`), when a salt was sent:
    # kept in `namespace_tenants` so the dashboard can name the tenant of each namespace in the engine's cache.
    namespace_label: str | None = None
    # How `prefix_hash` and the chain's hashes are keyed: 1 for keyed BLAKE2b under a per-tenant key derived from the
    # gateway's secret (gateway.record_keys).
    hash_key_version: int | None = field(
        default=None,
        metadata=stored("smallint", listed=False, null="a row from before keyed hashes (plain hashes of the prompt)"),
    )
    # Prompt tokens written to the cache (`cache_creation_input_tokens` on the Messages API), and the retention class
    # (`RETENTION_CLASSES`) the request asked for: the longest of its cache breakpoints on the Messages API, the
    # tenant's effective `cache_retention` elsewhere.
    cache_write_tokens: int | None = field(
        default=None, metadata=stored("int", unit="tokens", null="not the Messages API")
    )
    retention_class: str | None = field(
        default=None, metadata=stored("string", max_chars=16, null="no retention class applies")
    )
    # When the upstream is a replica set: the replica that served the request (its URL), the routing policy (one of
    # `ROUTING_POLICIES`), the cached tokens the router predicted there, and where that prediction came from (one of
    # `ROUTING_INDEX_SOURCES`).
    replica: str | None = field(
        default=None, metadata=stored("string", max_chars=200, cut=True, null=NOT_A_REPLICA_SET)
    )
    routing_policy: str | None = field(
        default=None, metadata=stored("string", max_chars=16, null=NOT_A_REPLICA_SET)
    )
    predicted_match_tokens: int | None = field(
        default=None, metadata=stored("int", unit="tokens", null=NOT_A_REPLICA_SET)
    )
    routing_index_source: str | None = field(
        default=None, metadata=stored("string", max_chars=16, null=NOT_A_REPLICA_SET)
    )
    # `cached_tokens` split by the tier that served them (device pool, host memory, disk), and the time the engine
    # spent loading the host and disk part back to the device; rolled up by `db.rollups.tier_split`.
    cached_tokens_device: int | None = field(default=None, metadata=stored("int", unit="tokens", null=NO_TIERS))
    cached_tokens_host: int | None = field(default=None, metadata=stored("int", unit="tokens", null=NO_TIERS))
    cached_tokens_disk: int | None = field(default=None, metadata=stored("int", unit="tokens", null=NO_TIERS))
    cache_load_ms: float | None = field(default=None, metadata=stored("float", unit="ms", null=NO_TIERS))
    # The provider's own prompt-cache diagnosis (`gateway.provider_diagnostics`): its reason as the provider names it
    # (`tools_changed`, `cache_hit`, `no_divergence`...; text from the upstream, made storable) and the input tokens it
    # says missed.
    provider_miss_reason: str | None = field(
        default=None,
        metadata=stored("string", max_chars=48, client_text=True, null="the upstream returned no diagnosis"),
    )
    provider_missed_tokens: int | None = field(
        default=None, metadata=stored("int", unit="tokens", null="the upstream returned no diagnosis or no count")
    )
    # The conversation this request is a turn of (`db.ledger`, `docs/conversations.md`): its id (keyed per tenant),
    # where the id came from (one of `CONVERSATION_SOURCES`), the turn's index (1 for the first) and the request it
    # follows, and the seconds since that request was answered.
    conversation_id: str | None = field(
        default=None, metadata=stored("string", max_chars=64, null="not linked: explanations off, or not read")
    )
    conversation_source: str | None = field(
        default=None, metadata=stored("string", max_chars=16, null="not linked to a conversation")
    )
    turn_index: int | None = field(default=None, metadata=stored("int", null="not linked to a conversation"))
    parent_request_id: str | None = field(
        default=None, metadata=stored("string", max_chars=64, null="the first turn, or not linked")
    )
    idle_s: float | None = field(
        default=None, metadata=stored("float", unit="s", null="the first turn, or not linked")
    )
    # The previous answer re-sent differently from how the gateway returned it: how (one of `ANSWER_REWRITES`), and
    # where the re-sent text first differs (segment `messages[i]` and character offset inside it).
    answer_rewrite: str | None = field(
        default=None, metadata=stored("string", max_chars=24, null="the previous answer came back as it was sent")
    )
    answer_rewrite_segment: str | None = field(
        default=None, metadata=stored("string", max_chars=SEGMENT_MAX, cut=True, null="no answer rewritten")
    )
    answer_rewrite_char_offset: int | None = field(
        default=None, metadata=stored("int", unit="characters", null="no answer rewritten")
    )
    # The token ledger (`db.ledger.TokenLedger`): `prompt_tokens` = cached + new + lost by cause + unknown.
    new_tokens: int | None = field(
        default=None, metadata=stored("int", unit="tokens", null=NOT_IN_LEDGER, sums=("new_tokens",))
    )
    lost_system_changed_tokens: int | None = field(
        default=None, metadata=stored("int", unit="tokens", null=NOT_IN_LEDGER, sums=("lost_system_changed_tokens",))
    )
    lost_tools_changed_tokens: int | None = field(
        default=None, metadata=stored("int", unit="tokens", null=NOT_IN_LEDGER, sums=("lost_tools_changed_tokens",))
    )
    lost_messages_changed_tokens: int | None = field(
        default=None, metadata=stored("int", unit="tokens", null=NOT_IN_LEDGER, sums=("lost_messages_changed_tokens",))
    )
    lost_answer_rewritten_tokens: int | None = field(
        default=None, metadata=stored("int", unit="tokens", null=NOT_IN_LEDGER, sums=("lost_answer_rewritten_tokens",))
    )
    lost_reordered_tokens: int | None = field(
        default=None, metadata=stored("int", unit="tokens", null=NOT_IN_LEDGER, sums=("lost_reordered_tokens",))
    )
    lost_volatile_value_tokens: int | None = field(
        default=None, metadata=stored("int", unit="tokens", null=NOT_IN_LEDGER, sums=("lost_volatile_value_tokens",))
    )
    lost_model_changed_tokens: int | None = field(
        default=None, metadata=stored("int", unit="tokens", null=NOT_IN_LEDGER, sums=("lost_model_changed_tokens",))
    )
    lost_evicted_tokens: int | None = field(
        default=None, metadata=stored("int", unit="tokens", null=NOT_IN_LEDGER, sums=("lost_evicted_tokens",))
    )
    lost_expired_tokens: int | None = field(
        default=None, metadata=stored("int", unit="tokens", null=NOT_IN_LEDGER, sums=("lost_expired_tokens",))
    )
    lost_routed_away_tokens: int | None = field(
        default=None, metadata=stored("int", unit="tokens", null=NOT_IN_LEDGER, sums=("lost_routed_away_tokens",))
    )
    lost_page_alignment_tokens: int | None = field(
        default=None, metadata=stored("int", unit="tokens", null=NOT_IN_LEDGER, sums=("lost_page_alignment_tokens",))
    )
    lost_cache_scope_tokens: int | None = field(
        default=None, metadata=stored("int", unit="tokens", null=NOT_IN_LEDGER, sums=("lost_cache_scope_tokens",))
    )
    unknown_tokens: int | None = field(
        default=None,
        metadata=stored("int", unit="tokens", null="the prompt tokens are unknown", sums=("unknown_tokens",)),
    )
    # The tier the evicted KV was last held in (one of `CACHE_TIERS`), when tokens were lost to eviction.
    evicted_tier: str | None = field(
        default=None, metadata=stored("string", max_chars=16, null="nothing was lost to eviction, or not said")
    )

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
        line = _plain_json(data)
        return line if line is not None else json.dumps(data, separators=(",", ":"), default=str)

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
