"""Fleet patterns: a generated fleet with one planted pattern of each kind (a system prompt that differs only in a
tenant name, the same tools in another order, tool lists one tool apart) finds each once, with its token cost, from
keyed signatures stored in the database (no prompt text)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from db.migrate import upgrade
from db.queries.patterns import fleet_patterns
from db.records import RequestRecord
from db.store import store_records
from gateway.advisor.signature import BLOCK_CHARS, prompt_signature
from gateway.parsing import CHAT
from gateway.record_keys import RecordHasher

START = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
KEY = RecordHasher("fleet-test-secret").fleet_key()
WORDS = "cache prefix engine tenant tool prompt block token gateway replica tier page slot turn answer".split()
NAME_AT = 212  # where the tenant name sits in the shared system prompt


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def tool(name: str) -> dict[str, Any]:
    function = {"name": name, "description": f"does {name}", "parameters": {"type": "object"}}
    return {"type": "function", "function": function}


def fleet() -> list[tuple[str, dict[str, Any]]]:
    rng = random.Random(7)
    shared = words(rng, 500)
    head, rest = shared[:NAME_AT], shared[NAME_AT:]
    requests = []
    names = ["Acme", "Globex Corporation", "Initech", "Umbrella Health", "Hooli", "Stark Industries"]
    for index, name in enumerate(names):  # span: one system prompt, a tenant name at the same place
        for turn in range(3):
            system = f"{head}You work for {name}.{rest}"
            requests.append((f"support-{index}", {"messages": [
                {"role": "system", "content": system}, {"role": "user", "content": words(rng, 8 + turn)}]}))
    order_tools = [tool(n) for n in ("find_booking", "check_stock", "order_part", "book_slot")]
    for turn in range(6):  # tool_order: the same tools, shuffled
        shuffled = order_tools[:]
        rng.shuffle(shuffled)
        requests.append(("shuffler", {"tools": shuffled, "messages": [
            {"role": "system", "content": words(rng, 60)}, {"role": "user", "content": "hi"}]}))
    base = [tool(n) for n in ("search_docs", "open_ticket", "close_ticket")]
    for turn in range(4):  # one_tool: tool lists that differ by one tool
        extra = tool("escalate") if turn % 2 else tool("refund")
        requests.append((f"helpdesk-{turn % 2}", {"tools": [*base, extra], "messages": [
            {"role": "system", "content": words(rng, 60)}, {"role": "user", "content": "hello"}]}))
    for index in range(10):  # noise: nothing shared
        requests.append((f"noise-{index}", {"messages": [{"role": "system", "content": words(rng, 300)}]}))
    return requests


def test_planted_patterns_are_found_with_their_token_cost(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    upgrade(url)
    records = []
    for index, (tenant, body) in enumerate(fleet()):
        signature = prompt_signature(CHAT, body, KEY, prompt_tokens=None)
        records.append(RequestRecord(
            request_id=f"r{index}", created_at=START + timedelta(seconds=index), tenant=tenant, key_id=None,
            endpoint=CHAT, model="m", upstream="engine", stream=False, status_code=200, error_type=None,
            prompt_tokens=None, cached_tokens=None, completion_tokens=1, ttft_ms=None, latency_ms=1.0,
            signature=signature,
        ))
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            store_records(conn, records)
        with engine.connect() as conn:
            stored = conn.execute(text("SELECT * FROM prompt_signatures")).mappings().all()
            patterns = fleet_patterns(conn, START)
    finally:
        engine.dispose()
    assert len(stored) == len(records)
    assert not any("Acme" in str(value) for row in stored for value in row.values())  # hashes only
    by_kind = {p.kind: p for p in patterns}
    assert sorted(p.kind for p in patterns) == ["one_tool", "span", "tool_order"], patterns

    span = by_kind["span"]
    assert (span.requests, span.tenants, span.variants) == (18, 6, 6)
    shared_head = NAME_AT // BLOCK_CHARS * BLOCK_CHARS
    assert f"characters {shared_head}-" in span.where
    # Cost: per request, the system prompt from the span's start on (at 4 characters a token without usage).
    span_records = [r for r in records if r.tenant.startswith("support-")]
    expected = sum((r.signature.text_chars - shared_head) * 0.25 for r in span_records)
    assert span.tokens_total == round(expected) and span.tokens_total > 0
    assert "move the varying span" in span.action

    order = by_kind["tool_order"]
    assert order.requests == 6 and order.tenants == 1 and order.variants >= 2
    assert order.tokens_total > 0 and "pin the tool order" in order.action

    one = by_kind["one_tool"]
    assert (one.requests, one.tenants, one.variants) == (4, 2, 2)
    # Cost: the tool tokens of the requests outside the most common list (helpdesk-0's came first).
    assert one.tokens_total == round(sum(r.signature.tool_chars * 0.25 for r in records if r.tenant == "helpdesk-1"))
    assert "union of the tools" in one.action
    assert "tool_order" in one.action  # the gateway's default rule sorts tools: "put it last" alone would not hold


def test_signatures_are_keyed_so_another_secret_gives_other_hashes() -> None:
    body = {"messages": [{"role": "system", "content": "x" * 300}], "tools": [tool("a")]}
    mine = prompt_signature(CHAT, body, KEY, 75)
    other = prompt_signature(CHAT, body, RecordHasher("another-secret").fleet_key(), 75)
    assert mine.text_chars == other.text_chars == 300 and len(mine.head) == 300 // BLOCK_CHARS
    assert set(mine.head).isdisjoint(other.head) and mine.tools != other.tools
    assert mine.tokens_per_char() == pytest.approx(75 / mine.prompt_chars)
