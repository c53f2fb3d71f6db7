"""The token ledger: every prompt token of a request in exactly one part, and the conversation a request belongs to.

For a request whose prompt and cached tokens are known:

    prompt_tokens = cached_tokens                      (by tier when known: device + host + disk)
                  + new_tokens                         (no earlier request in the cache scope had sent them)
                  + sum(lost_<cause>_tokens)           (sent and computed before, computed again; by `LOST_CAUSES`)
                  + unknown_tokens                     (the upstream reports too little to say which part)

An upstream that reports no cached tokens leaves every part NULL but `unknown_tokens` (the whole prompt): unknown stays
unknown, never 0. The parts are stored as fields of `db.records.RequestRecord` (`new_tokens`,
`lost_<cause>_tokens`, `unknown_tokens`); `TokenLedger.of(record)` reads them back as one value.

The eligible hit rate divides the cached tokens by the tokens that could have been cached, `prompt - new`
(`eligible_hit_rate`): a conversation's new turns are unavoidable misses.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

# Why tokens sent before were computed again, in the order the ledger lists them. A changed segment (`system_changed`,
# `tools_changed`, `messages_changed`), the previous answer re-sent differently (`answer_rewritten`), the same
# content in another order (`reordered`), a value that changes on every call (`volatile_value`), another model or
# adapter (`model_changed`), dropped for space (`evicted`, from `evicted_tier`) or by TTL (`expired`), served by a
# replica that held less than another (`routed_away`), matches being page-aligned and the last prompt token always
# being computed (`page_alignment`), and outside the request's cache scope (`cache_scope`: another tenant's or
# salt's cache, or matched by the engine but not read under the Messages API's breakpoint rules).
LOST_CAUSES: Final = (
    "system_changed",
    "tools_changed",
    "messages_changed",
    "answer_rewritten",
    "reordered",
    "volatile_value",
    "model_changed",
    "evicted",
    "expired",
    "routed_away",
    "page_alignment",
    "cache_scope",
)

# How a cause reads where people see it (dashboard, CLI tables): its key, but for `page_alignment`, whose tokens are
# those past the last page boundary and the prompt's last token (always computed, for its logits): with page size 1
# the last token is all it holds. The keys stay the record's field names (`lost_<cause>_tokens`) and the JSON keys.
LOST_CAUSE_LABELS: Final = {"page_alignment": "page alignment / last token"}


def cause_label(cause: str) -> str:
    """The words a person reads for a lost cause (`LOST_CAUSE_LABELS`, else the cause itself)."""
    return LOST_CAUSE_LABELS.get(cause, cause)


# Where a request's conversation id came from, in precedence order (`docs/conversations.md`): the
# `x-prefixscope-session` header, the body's `prompt_cache_key`, `metadata` (OpenAI's `metadata.session_id` /
# `conversation_id`, Anthropic's `metadata.user_id`), `user`; else `content` (linked to the request it extends, or the
# first turn of a new conversation).
CONVERSATION_SOURCES: Final = ("header", "prompt_cache_key", "metadata", "user", "content")

# How a client re-sent the answer the gateway had returned: `whitespace` (only whitespace differs),
# `reasoning_stripped` (a reasoning block removed), `tool_arguments` (tool-call arguments re-serialized: same JSON
# value, other text), `truncated` (a prefix of it), `edited` (anything else).
ANSWER_REWRITES: Final = ("whitespace", "reasoning_stripped", "tool_arguments", "truncated", "edited")

NOT_IN_LEDGER: Final = "no ledger: the prompt or cached tokens are unknown (see `unknown_tokens`)"


def lost_field(cause: str) -> str:
    """The record field holding the tokens lost to `cause` (one of `LOST_CAUSES`)."""
    return f"lost_{cause}_tokens"


@dataclass(frozen=True, slots=True)
class TokenLedger:
    """A request's prompt tokens split into parts (see the module docstring). `cached_by_tier` is None when the
    upstream does not say which tier served the cached tokens; `lost` maps causes to tokens (0 causes left out)."""

    prompt_tokens: int
    cached_tokens: int | None = None
    cached_by_tier: Mapping[str, int] | None = None
    new_tokens: int | None = None
    lost: Mapping[str, int] = field(default_factory=dict)
    unknown_tokens: int = 0

    @property
    def lost_tokens(self) -> int:
        return sum(self.lost.values())

    def adds_up(self) -> bool:
        """Whether the known parts sum exactly to `prompt_tokens` and none is negative."""
        parts = [self.cached_tokens or 0, self.new_tokens or 0, self.unknown_tokens, *self.lost.values()]
        if any(part < 0 for part in parts):
            return False
        if self.cached_by_tier is not None and self.cached_tokens is not None:
            if sum(self.cached_by_tier.values()) != self.cached_tokens:
                return False
        return sum(parts) == self.prompt_tokens

    @property
    def eligible_hit_rate(self) -> float | None:
        """cached / (prompt - new); None when unknown or nothing was eligible."""
        return eligible_hit_rate(self.cached_tokens, self.prompt_tokens, self.new_tokens)

    def record_fields(self) -> dict[str, Any]:
        """The `RequestRecord` ledger fields (`new_tokens`, `lost_<cause>_tokens`, `unknown_tokens`)."""
        known = self.cached_tokens is not None
        values: dict[str, Any] = {"new_tokens": self.new_tokens, "unknown_tokens": self.unknown_tokens}
        for cause in LOST_CAUSES:
            values[lost_field(cause)] = self.lost.get(cause, 0) if known else None
        return values

    @classmethod
    def of(cls, record: Any) -> TokenLedger | None:
        """The ledger a `db.records.RequestRecord` (or a read row with its fields) holds; None when it holds none (no
        prompt token count, or a row from before the ledger)."""
        if record.prompt_tokens is None or record.unknown_tokens is None:
            return None
        lost = {cause: getattr(record, lost_field(cause)) or 0 for cause in LOST_CAUSES}
        tiers = (record.cached_tokens_device, record.cached_tokens_host, record.cached_tokens_disk)
        by_tier = None if any(t is None for t in tiers) else dict(zip(("device", "host", "disk"), tiers, strict=True))
        return cls(
            prompt_tokens=record.prompt_tokens,
            cached_tokens=record.cached_tokens,
            cached_by_tier=by_tier,
            new_tokens=record.new_tokens,
            lost={cause: tokens for cause, tokens in lost.items() if tokens},
            unknown_tokens=record.unknown_tokens,
        )


def eligible_hit_rate(cached: int | None, prompt: int | None, new: int | None) -> float | None:
    """cached / (prompt - new), the share of the tokens that could have been cached that were; None when any count
    is unknown or nothing was eligible."""
    if cached is None or prompt is None or new is None:
        return None
    eligible = prompt - new
    return None if eligible <= 0 else min(1.0, cached / eligible)
