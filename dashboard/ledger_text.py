"""How the Requests page words a request's token ledger and its conversation (pure functions, no Streamlit)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from db.ledger import LOST_CAUSES, TokenLedger, cause_label


def ledger_sentence(record: Any) -> str:
    """`cached 96 (device 64 · host 32 · disk 0) + new 200 + lost 304 (answer_rewritten 296, page alignment / last
    token 8) + unknown 0 = 600 prompt tokens; eligible hit rate 24.0%` for a `db.records.RequestRecord` (causes as
    `db.ledger.cause_label` words them); what is unknown reads `-` or says so."""
    ledger = TokenLedger.of(record)
    if ledger is None:
        return "none recorded (the prompt tokens are unknown, or the request predates the ledger)"
    if ledger.cached_tokens is None:
        return f"cached - + new - + lost - + unknown {ledger.unknown_tokens:,} = {ledger.prompt_tokens:,} prompt " \
               "tokens (the upstream does not report cached tokens)"
    cached = f"cached {ledger.cached_tokens:,}"
    if ledger.cached_by_tier is not None:
        cached += " (" + " · ".join(f"{tier} {tokens:,}" for tier, tokens in ledger.cached_by_tier.items()) + ")"
    new = "-" if ledger.new_tokens is None else f"{ledger.new_tokens:,}"
    causes = [cause for cause in LOST_CAUSES if ledger.lost.get(cause)]
    lost = f"lost {ledger.lost_tokens:,}"
    if causes:
        lost += " (" + ", ".join(f"{cause_label(cause)} {ledger.lost[cause]:,}" for cause in causes) + ")"
    if record.evicted_tier and ledger.lost.get("evicted"):
        lost += f", evicted from {record.evicted_tier}"
    total = f"{ledger.prompt_tokens:,} prompt tokens"
    sign = "=" if ledger.adds_up() else "≠"
    rate = ledger.eligible_hit_rate
    eligible = "-" if rate is None else f"{rate:.1%}"
    return f"{cached} + new {new} + {lost} + unknown {ledger.unknown_tokens:,} {sign} {total}; eligible hit rate {eligible}"


def conversation_href(conversation_id: str, tenant: str) -> str:
    """The Conversations page's URL (relative to the dashboard's root) showing one conversation."""
    return "conversations?" + urlencode({"conversation": conversation_id, "tenant": tenant})


def conversation_sentence(record: Any) -> str | None:
    """`[conv-a](conversations?...), turn 3 (after request X, idle 400 s), answer rewritten: whitespace at
    messages[2] +25`, or None when the request is not a turn of a conversation."""
    if record.conversation_id is None:
        return None
    parts = [f"[{record.conversation_id}]({conversation_href(record.conversation_id, record.tenant)})"]
    if record.turn_index is not None:
        parts.append(f"turn {record.turn_index}")
    if record.parent_request_id is not None:
        idle = "" if record.idle_s is None else f", idle {record.idle_s:,.0f} s"
        parts.append(f"after request `{record.parent_request_id}`{idle}")
    if record.conversation_source:
        parts.append(f"linked by {record.conversation_source}")
    if record.answer_rewrite:
        offset = "" if record.answer_rewrite_char_offset is None else f" +{record.answer_rewrite_char_offset}"
        parts.append(f"previous answer rewritten: {record.answer_rewrite} at {record.answer_rewrite_segment}{offset}")
    return " · ".join(parts)
