"""Conversations written as request rows, for the tests of the conversation queries, API, CLI and dashboard.

`conversation_records(start)`: three conversations, one request of none and two refused or unanswered requests that
carry a conversation id (`conv-refused`, `conv-a`) but are no turns (`is_turn`), with ledgers that add up:
- `conv-a` (tenant acme, 4 turns): a first turn, a hit short of a page, a re-sent answer with its whitespace changed
  served by another replica after an idle time past the 5m class, then an eviction;
- `conv-b` (acme, 2 turns): a hit short of a page;
- `conv-c` (beta, 2 turns): an upstream that reports no cached tokens (every part unknown).
`EXPECTED` holds the figures the queries must return for them.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from db.ledger import TokenLedger
from db.records import RequestRecord


def _record(start: datetime, minutes: float, tenant: str, **values: Any) -> RequestRecord:
    base: dict[str, Any] = {
        "request_id": str(uuid.uuid4()),
        "created_at": start + timedelta(minutes=minutes),
        "tenant": tenant,
        "key_id": "k1",
        "endpoint": "chat.completions",
        "model": "m1",
        "upstream": "local",
        "stream": False,
        "status_code": 200,
        "error_type": None,
        "completion_tokens": 10,
        "ttft_ms": 50.0,
        "latency_ms": 120.0,
    }
    base.update(values)
    return RequestRecord(**base)


def _turn(
    start: datetime,
    minutes: float,
    tenant: str,
    conversation_id: str,
    index: int,
    parent: RequestRecord | None,
    ledger: TokenLedger,
    **values: Any,
) -> RequestRecord:
    tiers = dict(ledger.cached_by_tier or {})
    fields: dict[str, Any] = {
        "prompt_tokens": ledger.prompt_tokens,
        "cached_tokens": ledger.cached_tokens,
        "cached_tokens_device": tiers.get("device"),
        "cached_tokens_host": tiers.get("host"),
        "cached_tokens_disk": tiers.get("disk"),
        "conversation_id": conversation_id,
        "conversation_source": "header",
        "turn_index": index,
        "parent_request_id": None if parent is None else parent.request_id,
        **ledger.record_fields(),
    }
    fields.update(values)
    return _record(start, minutes, tenant, **fields)


def conversation_records(start: datetime) -> list[RequestRecord]:
    """The sample rows (see the module docstring), the first at `start`, the last 20 minutes later."""
    nothing_cached = {"device": 0, "host": 0, "disk": 0}
    a1 = _turn(start, 0, "acme", "conv-a", 1, None, TokenLedger(200, 0, nothing_cached, 200), replica="http://r1",
               retention_class="5m")
    a2 = _turn(start, 1, "acme", "conv-a", 2, a1,
               TokenLedger(400, 192, {"device": 192, "host": 0, "disk": 0}, 200, {"page_alignment": 8}),
               replica="http://r1", retention_class="5m", idle_s=30.0, miss_reason="below_page")
    a3 = _turn(start, 8, "acme", "conv-a", 3, a2,
               TokenLedger(600, 96, {"device": 64, "host": 32, "disk": 0}, 200,
                           {"answer_rewritten": 296, "page_alignment": 8}),
               replica="http://r2", retention_class="5m", idle_s=400.0, miss_reason="answer_rewritten",
               miss_kind="partial", divergence_segment="messages[2]", divergence_char_offset=25,
               answer_rewrite="whitespace", answer_rewrite_segment="messages[2]", answer_rewrite_char_offset=25)
    a4 = _turn(start, 20, "acme", "conv-a", 4, a3,
               TokenLedger(800, 0, nothing_cached, 200, {"evicted": 584, "page_alignment": 16}),
               replica="http://r2", retention_class="5m", idle_s=700.0, miss_reason="evicted", miss_kind="evicted",
               divergence_segment="system", divergence_char_offset=0, evicted_tier="device")
    b1 = _turn(start, 2, "acme", "conv-b", 1, None, TokenLedger(100, 0, nothing_cached, 100))
    b2 = _turn(start, 3, "acme", "conv-b", 2, b1,
               TokenLedger(220, 96, {"device": 96, "host": 0, "disk": 0}, 120, {"page_alignment": 4}),
               idle_s=50.0, miss_reason="below_page")
    c1 = _turn(start, 4, "beta", "conv-c", 1, None, TokenLedger(300, None, None, None, {}, 300), upstream="openai")
    c2 = _turn(start, 5, "beta", "conv-c", 2, c1, TokenLedger(300, None, None, None, {}, 300), upstream="openai",
               idle_s=60.0)
    loose = _record(start, 6, "acme", prompt_tokens=50, cached_tokens=0)
    # Rows written before the gateway left refused and unanswered requests out of conversations: no turns.
    refused = _record(start, 7, "acme", status_code=400, error_type="invalid_request_error", prompt_tokens=None,
                      cached_tokens=None, conversation_id="conv-refused", conversation_source="content", turn_index=1)
    unanswered = _record(start, 9, "acme", status_code=502, error_type="upstream_error", prompt_tokens=None,
                         cached_tokens=None, conversation_id="conv-a",
                         conversation_source="header", turn_index=4, parent_request_id=a3.request_id)
    return [a1, a2, a3, a4, b1, b2, c1, c2, loose, refused, unanswered]


def is_turn(record: RequestRecord) -> bool:
    """Whether a sample row is a conversation turn: it has a conversation id and was answered with a 2xx."""
    return record.conversation_id is not None and 200 <= record.status_code < 300


# What the queries must answer for the sample (per conversation: turns, prompt, cached, new, lost, unknown, token
# hit rate, eligible hit rate, lost by cause, answer rewrites, replicas).
EXPECTED: dict[str, dict[str, Any]] = {
    "conv-a": {
        "tenant": "acme", "turns": 4, "prompt_tokens": 2000, "cached_tokens": 288, "new_tokens": 800,
        "lost_tokens": 912, "unknown_tokens": 0, "token_hit_rate": 288 / 2000, "eligible_hit_rate": 288 / 1200,
        "lost_by_cause": {"answer_rewritten": 296, "evicted": 584, "page_alignment": 32}, "answer_rewrites": 1,
        "replicas": 2,
    },
    "conv-b": {
        "tenant": "acme", "turns": 2, "prompt_tokens": 320, "cached_tokens": 96, "new_tokens": 220,
        "lost_tokens": 4, "unknown_tokens": 0, "token_hit_rate": 96 / 320, "eligible_hit_rate": 96 / 100,
        "lost_by_cause": {"page_alignment": 4}, "answer_rewrites": 0, "replicas": None,
    },
    "conv-c": {
        "tenant": "beta", "turns": 2, "prompt_tokens": 600, "cached_tokens": None, "new_tokens": None,
        "lost_tokens": None, "unknown_tokens": 600, "token_hit_rate": None, "eligible_hit_rate": None,
        "lost_by_cause": None, "answer_rewrites": 0, "replicas": None,
    },
}


def comparable(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with each rate rounded to 9 places, to compare figures read back with `EXPECTED`."""
    return {name: round(value, 9) if isinstance(value, float) else value for name, value in values.items()}


def figures(summary: Any) -> dict[str, Any]:
    """The figures `EXPECTED` holds, read from a summary (an object or a JSON mapping), comparable."""
    names = EXPECTED["conv-a"]
    read = summary.get if isinstance(summary, dict) else lambda name: getattr(summary, name)
    return comparable({name: read(name) for name in names})
