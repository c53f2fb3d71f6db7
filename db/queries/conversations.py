"""Conversations: the requests that are turns of one conversation (`requests.conversation_id`, keyed per tenant), summed
per conversation (`conversations`) or over all of them (`conversation_totals`), and one conversation's turns with
their token ledgers (`conversation`, `db.ledger`).

All read request rows: the range queries by `created_at` (its index), `conversation` by its id (the index on
`(tenant, conversation_id)`). A turn is a request the upstream answered with a 2xx. A count no turn reported stays
None, never 0.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from sqlalchemy import ColumnElement, and_, case, func, literal, select

from db.conversation_window import CONVERSATIONS_MAX_LIMIT
from db.ledger import LOST_CAUSES, TokenLedger, eligible_hit_rate, lost_field
from db.models import RequestRecordRow, table_of
from db.queries.results_conversations import (
    Conversation,
    ConversationSummary,
    ConversationTotals,
    ConversationTurn,
)
from db.queries.totals import Reader
from db.retention.costs import CLASS_TTL_S
from db.timeutil import as_utc

REQUESTS = table_of(RequestRecordRow)

MAX_CONVERSATIONS: Final = CONVERSATIONS_MAX_LIMIT
"""The most conversations `conversations` returns, whatever `limit` asks."""
MAX_TURNS: Final = 5000
"""The most turns `conversation` returns (the first ones); the summary still covers every turn."""

_LOST_COLUMNS = [REQUESTS.c[lost_field(cause)] for cause in LOST_CAUSES]
_TURN_COLUMNS = [
    REQUESTS.c[name]
    for name in (
        "id",
        "created_at",
        "tenant",
        "turn_index",
        "parent_request_id",
        "conversation_source",
        "model",
        "replica",
        "retention_class",
        "idle_s",
        "prompt_tokens",
        "cached_tokens",
        "cached_tokens_device",
        "cached_tokens_host",
        "cached_tokens_disk",
        "new_tokens",
        "unknown_tokens",
        "miss_kind",
        "miss_reason",
        "divergence_segment",
        "divergence_char_offset",
        "diverged_at_token",
        "evicted_tier",
        "answer_rewrite",
        "answer_rewrite_segment",
        "answer_rewrite_char_offset",
    )
] + _LOST_COLUMNS


def _when(condition: ColumnElement[bool], value: Any) -> Any:
    return case((condition, value), else_=None)


def _aggregates() -> list[Any]:
    """The sums `_figures` reads, over a set of request rows."""
    c = REQUESTS.c
    cache_known = c.cached_tokens.is_not(None)
    in_ledger = and_(cache_known, c.new_tokens.is_not(None), c.prompt_tokens.is_not(None))
    return [
        func.count().label("turns"),
        func.min(c.created_at).label("first_at"),
        func.max(c.created_at).label("last_at"),
        func.sum(c.prompt_tokens).label("prompt_tokens"),
        func.sum(_when(cache_known, c.cached_tokens)).label("cached_tokens"),
        func.sum(_when(cache_known, c.prompt_tokens)).label("known_prompt_tokens"),
        func.sum(_when(in_ledger, c.prompt_tokens)).label("ledger_prompt_tokens"),
        func.sum(_when(in_ledger, c.cached_tokens)).label("ledger_cached_tokens"),
        func.sum(_when(in_ledger, c.new_tokens)).label("new_tokens"),
        func.sum(c.unknown_tokens).label("unknown_tokens"),
        *(func.sum(column).label(column.name) for column in _LOST_COLUMNS),
        func.count(c.answer_rewrite).label("answer_rewrites"),
        func.count(c.replica.distinct()).label("replicas"),
    ]


def _figures(row: Any) -> dict[str, Any]:
    """The fields `ConversationSummary` and `ConversationTotals` share, from a row of `_aggregates`."""
    lost = {cause: _int(getattr(row, lost_field(cause))) for cause in LOST_CAUSES}
    known_lost = [tokens for tokens in lost.values() if tokens is not None]
    cached, known_prompt = _int(row.cached_tokens), _int(row.known_prompt_tokens)
    return {
        "turns": int(row.turns),
        "prompt_tokens": _int(row.prompt_tokens),
        "cached_tokens": cached,
        "new_tokens": _int(row.new_tokens),
        "lost_tokens": sum(known_lost) if known_lost else None,
        "unknown_tokens": _int(row.unknown_tokens),
        "token_hit_rate": min(1.0, cached / known_prompt) if cached is not None and known_prompt else None,
        "eligible_hit_rate": eligible_hit_rate(
            _int(row.ledger_cached_tokens), _int(row.ledger_prompt_tokens), _int(row.new_tokens)
        ),
        "lost_by_cause": {cause: tokens for cause, tokens in lost.items() if tokens} if known_lost else None,
        "answer_rewrites": int(row.answer_rewrites),
    }


def _summary(row: Any) -> ConversationSummary:
    return ConversationSummary(
        conversation_id=row.conversation_id,
        tenant=row.tenant,
        first_at=as_utc(row.first_at),
        last_at=as_utc(row.last_at),
        replicas=int(row.replicas) or None,
        **_figures(row),
    )


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _is_turn() -> list[ColumnElement[bool]]:
    """A conversation turn: a request with a conversation id that was answered with a 2xx (rows recorded before the
    gateway left the id out of refused and unanswered requests carry one)."""
    c = REQUESTS.c
    return [c.conversation_id.is_not(None), c.status_code >= 200, c.status_code < 300]


def _range(since: datetime | None, until: datetime | None, tenant: str | None) -> list[ColumnElement[bool]]:
    clauses: list[ColumnElement[bool]] = _is_turn()
    if tenant is not None:
        clauses.append(REQUESTS.c.tenant == tenant)
    if since is not None:
        clauses.append(REQUESTS.c.created_at >= as_utc(since))
    if until is not None:
        clauses.append(REQUESTS.c.created_at < as_utc(until))
    return clauses


def conversations(
    conn: Reader,
    since: datetime | None = None,
    until: datetime | None = None,
    tenant: str | None = None,
    limit: int = 100,
) -> list[ConversationSummary]:
    """The conversations with turns in [since, until) (every tenant's, or `tenant`'s), summed over those turns, worst
    first: most tokens lost, then the most recent. At most `limit` (capped at `MAX_CONVERSATIONS`) rows."""
    stmt = (
        select(REQUESTS.c.tenant, REQUESTS.c.conversation_id, *_aggregates())
        .where(*_range(since, until, tenant))
        .group_by(REQUESTS.c.tenant, REQUESTS.c.conversation_id)
        .order_by(
            func.sum(_lost_sum()).desc(),
            func.max(REQUESTS.c.created_at).desc(),
            REQUESTS.c.tenant,
            REQUESTS.c.conversation_id,
        )
        .limit(max(0, min(limit, MAX_CONVERSATIONS)))
    )
    return [_summary(row) for row in conn.execute(stmt)]


def conversation_totals(
    conn: Reader, since: datetime | None = None, until: datetime | None = None, tenant: str | None = None
) -> ConversationTotals:
    """Every conversation with turns in [since, until) (every tenant's, or `tenant`'s) summed as one, over those
    turns (unbounded, unlike `conversations`)."""
    clauses = _range(since, until, tenant)
    row = conn.execute(select(*_aggregates()).where(*clauses)).one()
    if not row.turns:
        return ConversationTotals()
    grouped = select(REQUESTS.c.tenant, REQUESTS.c.conversation_id).where(*clauses)
    grouped = grouped.group_by(REQUESTS.c.tenant, REQUESTS.c.conversation_id)
    count = conn.scalar(select(func.count()).select_from(grouped.subquery()))
    return ConversationTotals(conversations=int(count or 0), **_figures(row))


def _lost_sum() -> Any:
    total: Any = literal(0)
    for column in _LOST_COLUMNS:
        total = total + func.coalesce(column, 0)
    return total


def conversation(conn: Reader, conversation_id: str, tenant: str | None = None) -> Conversation | None:
    """One conversation: its summary over every turn and its first `MAX_TURNS` turns in time order. `tenant` None
    (an admin) takes the tenant of the conversation's first turn; None when no turn has this id (for `tenant`)."""
    c = REQUESTS.c
    if tenant is None:
        tenant = conn.scalar(
            select(c.tenant).where(*_is_turn(), c.conversation_id == conversation_id).order_by(c.created_at, c.id)
            .limit(1)
        )
        if tenant is None:
            return None
    scope = (*_is_turn(), c.tenant == tenant, c.conversation_id == conversation_id)
    summary_row = conn.execute(
        select(c.tenant, c.conversation_id, *_aggregates()).where(*scope).group_by(c.tenant, c.conversation_id)
    ).first()
    if summary_row is None:
        return None
    rows = conn.execute(select(*_TURN_COLUMNS).where(*scope).order_by(c.created_at, c.id).limit(MAX_TURNS))
    turns: list[ConversationTurn] = []
    previous_replica: str | None = None
    for row in rows:
        turns.append(_turn(row, previous_replica))
        previous_replica = row.replica if row.replica is not None else previous_replica
    return Conversation(summary=_summary(summary_row), turns=turns)


def _turn(row: Any, previous_replica: str | None) -> ConversationTurn:
    ledger = TokenLedger.of(row)
    has_ledger = ledger is not None and row.new_tokens is not None and row.cached_tokens is not None
    ttl = CLASS_TTL_S.get(row.retention_class) if row.retention_class else None
    tiers = (row.cached_tokens_device, row.cached_tokens_host, row.cached_tokens_disk)
    prompt, cached = row.prompt_tokens, row.cached_tokens
    return ConversationTurn(
        request_id=row.id,
        created_at=as_utc(row.created_at),
        turn_index=row.turn_index,
        parent_request_id=row.parent_request_id,
        conversation_source=row.conversation_source,
        model=row.model,
        replica=row.replica,
        retention_class=row.retention_class,
        idle_s=row.idle_s,
        ttl_s=ttl,
        idle_beyond_ttl=None if ttl is None or row.idle_s is None else row.idle_s > ttl,
        prompt_tokens=prompt,
        cached_tokens=cached,
        cached_by_tier=None if any(t is None for t in tiers) else dict(zip(("device", "host", "disk"), tiers)),
        new_tokens=row.new_tokens,
        lost=dict(ledger.lost) if ledger is not None and has_ledger else None,
        lost_tokens=ledger.lost_tokens if ledger is not None and has_ledger else None,
        unknown_tokens=row.unknown_tokens,
        has_ledger=has_ledger,
        adds_up=None if ledger is None else ledger.adds_up(),
        token_hit_rate=None if prompt is None or cached is None or prompt <= 0 else min(1.0, cached / prompt),
        eligible_hit_rate=eligible_hit_rate(cached, prompt, row.new_tokens),
        miss_kind=row.miss_kind,
        miss_reason=row.miss_reason,
        divergence_segment=row.divergence_segment,
        divergence_char_offset=row.divergence_char_offset,
        diverged_at_token=row.diverged_at_token,
        evicted_tier=row.evicted_tier,
        answer_rewrite=row.answer_rewrite,
        answer_rewrite_segment=row.answer_rewrite_segment,
        answer_rewrite_char_offset=row.answer_rewrite_char_offset,
        replica_changed=row.replica is not None and previous_replica is not None and row.replica != previous_replica,
    )
