"""Handlers of `prefixscope conversations` and `prefixscope conversation ID` (registered lazily by `db.cli`).

Token counts are prompt tokens; a count the upstream did not report prints `-`, never 0. Each handler returns an exit
status: 0, or 2 for a bad argument (the range and limit validated as `GET /api/conversations` validates them,
`db.query_params`, with its message), a missing database or an unknown conversation.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import asdict

from db.commands import _engine, _fail, _guarded, _pct, _print_json, _table
from db.conversation_window import CONVERSATIONS_DEFAULT_SINCE, CONVERSATIONS_MAX_LIMIT
from db.ledger import cause_label
from db.queries.conversations import conversation, conversations
from db.queries.results_conversations import ConversationSummary, ConversationTurn, short_request_id
from db.query_params import row_limit, time_range

CLI_DEFAULT_LIMIT = 50


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _causes(lost: Mapping[str, int] | None) -> str:
    """`evicted 584, answer_rewritten 296, page alignment / last token 32`: the causes that lost tokens, most first,
    as people read them (`db.ledger.cause_label`); `0` when the ledger lost none, `-` without a ledger (unknown)."""
    if lost is None:
        return "-"
    ranked = sorted(lost.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{cause_label(cause)} {tokens}" for cause, tokens in ranked) or "0"


def _turns(count: int) -> str:
    return f"{count} turn" if count == 1 else f"{count} turns"


@_guarded
def conversations_list(args: argparse.Namespace) -> int:
    since, until = time_range(args.since, args.until, CONVERSATIONS_DEFAULT_SINCE)
    limit = row_limit(args.limit, CLI_DEFAULT_LIMIT, CONVERSATIONS_MAX_LIMIT)
    with _engine(args) as engine, engine.connect() as conn:
        listed = conversations(conn, since, until, tenant=args.tenant, limit=limit)
    if args.json:
        _print_json([asdict(row) for row in listed])
        return 0
    if not listed:
        print("no conversations in this range")
        return 0
    headers = ["CONVERSATION", "TENANT", "TURNS", "LAST (UTC)", "PROMPT TOK", "CACHED TOK", "NEW TOK", "LOST TOK",
               "TOKEN HIT", "ELIGIBLE HIT", "REWRITES", "REPLICAS", "LOST BY CAUSE"]
    print(_table(headers, [_summary_cells(row) for row in listed]))
    return 0


def _summary_cells(row: ConversationSummary) -> list[str]:
    return [
        row.conversation_id,
        row.tenant,
        str(row.turns),
        f"{row.last_at:%Y-%m-%d %H:%M}",
        _count(row.prompt_tokens),
        _count(row.cached_tokens),
        _count(row.new_tokens),
        _count(row.lost_tokens),
        _pct(row.token_hit_rate),
        _pct(row.eligible_hit_rate),
        str(row.answer_rewrites),
        "-" if row.replicas is None else str(row.replicas),
        _causes(row.lost_by_cause),
    ]


@_guarded
def conversation_show(args: argparse.Namespace) -> int:
    with _engine(args) as engine, engine.connect() as conn:
        found = conversation(conn, args.conversation_id, tenant=args.tenant)
    if found is None:
        return _fail(f"no conversation {args.conversation_id!r}" + (f" of tenant {args.tenant!r}" if args.tenant else ""))
    if args.json:
        _print_json({"conversation": asdict(found.summary), "turns": [asdict(turn) for turn in found.turns]})
        return 0
    summary = found.summary
    print(
        f"conversation {summary.conversation_id} (tenant {summary.tenant}): {_turns(summary.turns)}, "
        f"{summary.first_at:%Y-%m-%d %H:%M:%S} to {summary.last_at:%Y-%m-%d %H:%M:%S} UTC; token hit "
        f"{_pct(summary.token_hit_rate)}, eligible hit {_pct(summary.eligible_hit_rate)}; lost "
        f"{_count(summary.lost_tokens)} tokens"
        + (f" ({_causes(summary.lost_by_cause)})" if summary.lost_tokens else "")
    )
    headers = ["TURN", "PARENT", "REQUEST", "TIME (UTC)", "IDLE s / TTL", "REPLICA", "PROMPT", "CACHED dev/host/disk",
               "NEW", "LOST", "UNKNOWN", "TOKEN HIT", "ELIGIBLE", "REASON @ WHERE", "ANSWER REWRITE"]
    print(_table(headers, [_turn_cells(turn) for turn in found.turns]))
    return 0


def _turn_cells(turn: ConversationTurn) -> list[str]:
    tiers = turn.cached_by_tier
    cached = _count(turn.cached_tokens)
    if tiers is not None:
        cached += f" ({tiers['device']}/{tiers['host']}/{tiers['disk']})"
    idle = "-" if turn.idle_s is None else f"{turn.idle_s:.0f}"
    ttl = "-" if turn.ttl_s is None else f"{turn.ttl_s:.0f}"
    where = turn.divergence_segment or ""
    if where and turn.divergence_char_offset is not None:
        where += f"+{turn.divergence_char_offset}"
    rewrite = "-"
    if turn.answer_rewrite is not None:
        rewrite = f"{turn.answer_rewrite} @ {turn.answer_rewrite_segment or '?'}+{turn.answer_rewrite_char_offset}"
    lost = _causes(turn.lost if turn.has_ledger else None)
    return [
        "-" if turn.turn_index is None else str(turn.turn_index),
        "-" if turn.parent_request_id is None else short_request_id(turn.parent_request_id),
        short_request_id(turn.request_id),
        f"{turn.created_at:%Y-%m-%d %H:%M:%S}",
        f"{idle} / {ttl}" + (" (past TTL)" if turn.idle_beyond_ttl else ""),
        (turn.replica or "-") + (" (changed)" if turn.replica_changed else ""),
        _count(turn.prompt_tokens),
        cached,
        _count(turn.new_tokens),
        lost,
        _count(turn.unknown_tokens),
        _pct(turn.token_hit_rate),
        _pct(turn.eligible_hit_rate),
        (turn.miss_reason or "-") + (f" @ {where}" if where else ""),
        rewrite,
    ]
