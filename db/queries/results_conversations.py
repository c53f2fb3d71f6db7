"""The results of the conversation queries (`db.queries.conversations`): one conversation summed over its turns, and
one turn with its token ledger.

Token counts are prompt tokens. A figure the upstream did not report stays None (shown `-`), never 0: a
conversation's `cached_tokens` is None when no turn reported cached tokens, its `lost_tokens` when no turn has a
ledger (`db.ledger.TokenLedger`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class ConversationSummary:
    """One conversation (`conversation_id`, keyed per tenant) over the turns recorded in the queried range.

    `prompt_tokens` sums every turn that reported its prompt; `token_hit_rate` is cached / prompt over the turns that
    reported cached tokens, `eligible_hit_rate` cached / (prompt - new) over the turns with a ledger
    (`db.ledger.eligible_hit_rate`). `lost_by_cause` maps each cause of `db.ledger.LOST_CAUSES` that lost tokens to
    its tokens (causes that lost none are left out: empty when none did), None with `lost_tokens` when no turn has a
    ledger; `lost_tokens` is their sum. `answer_rewrites` counts the turns
    whose client re-sent the previous answer differently, `replicas` the distinct replicas that served a turn (None
    when no turn went through a replica set: unknown, not 0).
    """

    conversation_id: str
    tenant: str
    turns: int
    first_at: datetime
    last_at: datetime
    prompt_tokens: int | None
    cached_tokens: int | None
    new_tokens: int | None
    lost_tokens: int | None
    unknown_tokens: int | None
    token_hit_rate: float | None
    eligible_hit_rate: float | None
    lost_by_cause: dict[str, int] | None = None
    answer_rewrites: int = 0
    replicas: int | None = None


@dataclass(frozen=True)
class ConversationTotals:
    """`conversation_totals`: every conversation with turns in a range, summed as one (the figures and their None
    as in `ConversationSummary`); `conversations` counts them."""

    conversations: int = 0
    turns: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    new_tokens: int | None = None
    lost_tokens: int | None = None
    unknown_tokens: int | None = None
    token_hit_rate: float | None = None
    eligible_hit_rate: float | None = None
    lost_by_cause: dict[str, int] | None = None
    answer_rewrites: int = 0


@dataclass(frozen=True)
class ConversationTurn:
    """One request of a conversation, with its token ledger (`prompt = cached + new + lost + unknown`).

    `cached_by_tier` maps `device` / `host` / `disk` to tokens, None when the upstream reports no tiers; `lost` maps
    the causes that lost tokens to their tokens (empty when the ledger lost none; None without a ledger, see
    `has_ledger`). `idle_s` is the time since
    the previous turn was answered; `ttl_s` the TTL of the turn's retention class (None: `persistent`, or no class),
    and `idle_beyond_ttl` whether the idle time exceeded it (None when either is unknown). `replica_changed` is True
    when a replica set served this turn from another replica than the previous turn. The miss reason and divergence
    (segment, character offset, first uncached token) are the gateway's explanation; `answer_rewrite` (one of
    `db.ledger.ANSWER_REWRITES`) with its segment and character offset says how the previous answer came back.
    """

    request_id: str
    created_at: datetime
    turn_index: int | None
    parent_request_id: str | None
    conversation_source: str | None
    model: str | None
    replica: str | None
    retention_class: str | None
    idle_s: float | None
    ttl_s: float | None
    idle_beyond_ttl: bool | None
    prompt_tokens: int | None
    cached_tokens: int | None
    cached_by_tier: dict[str, int] | None
    new_tokens: int | None
    lost: dict[str, int] | None
    lost_tokens: int | None
    unknown_tokens: int | None
    has_ledger: bool
    adds_up: bool | None
    token_hit_rate: float | None
    eligible_hit_rate: float | None
    miss_kind: str | None
    miss_reason: str | None
    divergence_segment: str | None
    divergence_char_offset: int | None
    diverged_at_token: int | None
    evicted_tier: str | None
    answer_rewrite: str | None
    answer_rewrite_segment: str | None
    answer_rewrite_char_offset: int | None
    replica_changed: bool


@dataclass(frozen=True)
class Conversation:
    """`conversation`: a conversation's summary and its turns in order (turn index, then time)."""

    summary: ConversationSummary
    turns: list[ConversationTurn]


SHORT_ID_CHARS = 12


def short_request_id(request_id: str) -> str:
    """A request id cut to its first `SHORT_ID_CHARS` characters (`req_0123abcd`, the gateway's ids being `req_` and
    24 hex digits): enough to tell a conversation's turns apart, as the CLI and the dashboard show a turn's parent."""
    return request_id[:SHORT_ID_CHARS]
