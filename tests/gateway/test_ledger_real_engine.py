"""Acceptance: the explanations that were wrong, and each part of the token ledger, through the gateway and the real
engine, as stored.

Two engines of this module's own (page size 1; and `--page-size 16`, a 256-token pool, a short TTL, reached through
the model alias `PAGED_MODEL`), both loading at once and given long to start on a busy machine. Another alias of the
same model (`ALIAS`) goes to the first engine: the same cache under another model name. Each case runs under its own
tenant (its own cache namespace).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from gateway_testkit import db_storage, gateway_config, running_gateway
from real_engine_kit import MODEL, EngineProcess, create_keys, stored

from db.ledger import TokenLedger
from gateway.config import TenantSettings, UpstreamConfig

pytestmark = pytest.mark.real_model

PAGED_MODEL = "SmolLM2-135M-Instruct"  # routed to the paged engine
ALIAS = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the default engine, under another name
TTL_S = 4.0
SYSTEM = "You are the support assistant of a bicycle shop. Answer in two short sentences."
CASES = ("alias", "rewrite", "truncated", "compacted", "grown", "opening", "reordered", "evicted", "filler", "expired")
PLAIN = TenantSettings(rules=frozenset(), uplift_sample_rate=0.0)  # the prompts as crafted


@dataclass
class Deployment:
    url: str
    keys: dict[str, str]
    database_url: str

    def chat(self, tenant: str, messages: list[dict], max_tokens: int = 1, session: str | None = None,
             **extra: Any) -> httpx.Response:
        body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}
        headers = {"authorization": f"Bearer {self.keys[tenant]}"}
        if session is not None:
            headers["x-prefixscope-session"] = session
        response = httpx.post(f"{self.url}/v1/chat/completions", json=body, headers=headers, timeout=120)
        assert response.status_code == 200, response.text
        return response

    def row(self, response: httpx.Response) -> dict[str, Any]:
        request_id = response.headers["x-request-id"]
        return stored(self.database_url, "requests", "id", [request_id])[request_id]


START_TIMEOUT_S = 1200.0  # loading two models at once on shared cores (it asserts nothing about time)


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[str, str]]:
    plain = EngineProcess("--kv-cache-tokens", "4096")
    paged = EngineProcess("--page-size", "16", "--kv-cache-tokens", "256", "--ttl", str(TTL_S))
    try:
        yield plain.wait_healthy(START_TIMEOUT_S), paged.wait_healthy(START_TIMEOUT_S)
    finally:
        plain.stop()
        paged.stop()


@pytest.fixture(scope="module")
def deployment(engines: tuple[str, str], tmp_path_factory) -> Iterator[Deployment]:
    engine_url, paged_url = engines
    tmp_path = tmp_path_factory.mktemp("ledger")
    database_url = f"sqlite:///{tmp_path}/gateway.db"
    keys = create_keys(database_url, list(CASES))
    config = gateway_config(
        engine_url,
        upstreams=(
            UpstreamConfig(name="engine", url=engine_url, kind="local_engine", timeout_s=300.0),
            UpstreamConfig(name="paged", url=paged_url, kind="local_engine", timeout_s=300.0),
        ),
        default_upstream="engine",
        routes={PAGED_MODEL: "paged"},
        tenants=dict.fromkeys(CASES, PLAIN),
        auth="keys",
    )
    with running_gateway(config, db_storage(database_url, tmp_path)) as gw:
        yield Deployment(gw.url, keys, database_url)


def ledger_of(row: dict[str, Any]) -> TokenLedger:
    ledger = TokenLedger.of(SimpleNamespace(**row))
    assert ledger is not None and ledger.adds_up(), row
    return ledger


def answer_of(response: httpx.Response) -> str:
    return response.json()["choices"][0]["message"]["content"]


def test_a_model_alias_to_the_same_engine_is_a_hit_ending_at_the_cached_answer(deployment: Deployment):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "When are you open?"}]
    first = deployment.chat("alias", messages, max_tokens=12)
    turn = [*messages, {"role": "assistant", "content": answer_of(first)}, {"role": "user", "content": "Sunday?"}]
    row = deployment.row(deployment.chat("alias", turn, model=ALIAS))
    assert (row["miss_reason"], row["divergence_segment"]) == ("hit", "messages[2]")
    ledger = ledger_of(row)
    assert ledger.cached_by_tier == {"device": row["cached_tokens"], "host": 0, "disk": 0}
    assert ledger.new_tokens > 0 and ledger.unknown_tokens == 0
    assert ledger.lost_tokens <= 1  # at most the answer's last token, which is never computed


def test_an_answer_resent_with_whitespace_changed_is_answer_rewritten(deployment: Deployment):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "How do I fix a flat tyre?"}]
    answer = answer_of(deployment.chat("rewrite", messages, max_tokens=24))
    at = answer.index(" ", 8)
    rewritten = answer[:at] + "  " + answer[at + 1 :]
    turn = [*messages, {"role": "assistant", "content": rewritten}, {"role": "user", "content": "Thanks."}]
    row = deployment.row(deployment.chat("rewrite", turn))
    assert (row["miss_reason"], row["divergence_segment"]) == ("answer_rewritten", "messages[2]")
    assert abs(row["divergence_char_offset"] - at) <= 1
    ledger = ledger_of(row)
    assert ledger.lost["answer_rewritten"] > 0  # the rest of the answer, computed before, computed again


def test_an_answer_resent_cut_short_loses_the_page_it_broke_to_the_rewrite(deployment: Deployment):
    """16-token pages: the answer re-sent truncated leaves a partial page that, had the answer been re-sent whole,
    would have matched: lost to the rewrite, not to page alignment."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "How do I fix a flat tyre?"}]
    answer = answer_of(deployment.chat("truncated", messages, max_tokens=24, model=PAGED_MODEL))
    cut = answer[: len(answer) // 2]
    turn = [*messages, {"role": "assistant", "content": cut}, {"role": "user", "content": "Go on."}]
    row = deployment.row(deployment.chat("truncated", turn, model=PAGED_MODEL))
    assert (row["miss_reason"], row["answer_rewrite"]) == ("answer_rewritten", "truncated")
    assert row["divergence_segment"] == "messages[2]" and abs(row["divergence_char_offset"] - len(cut)) <= 8
    ledger = ledger_of(row)
    assert ledger.lost["answer_rewritten"] > 0 and "page_alignment" not in ledger.lost


def test_a_conversation_resent_with_its_history_compacted_changed_its_messages(deployment: Deployment):
    """A named conversation whose third turn replaces the first exchanges with a summary: `messages_changed` where
    the summary starts (not a new turn), and the summary's tokens are lost to it."""
    system = {"role": "system", "content": SYSTEM}
    first = [system, {"role": "user", "content": "My bell rattles."}]
    answer = answer_of(deployment.chat("compacted", first, max_tokens=12, session="bells"))
    second = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "It is a brass bell."}]
    deployment.chat("compacted", second, max_tokens=12, session="bells")
    compacted = [system, {"role": "user", "content": "Summary: a brass bell rattles."},
                 {"role": "user", "content": "Can you fix it today?"}]
    row = deployment.row(deployment.chat("compacted", compacted, session="bells"))
    assert (row["miss_reason"], row["divergence_segment"], row["divergence_char_offset"]) == (
        "messages_changed", "messages[1]", 0)
    assert row["turn_index"] == 3 and row["parent_request_id"] is not None
    ledger = ledger_of(row)
    assert ledger.lost["messages_changed"] > 0 and ledger.new_tokens > 0


def test_a_system_prompt_grown_counts_what_it_added_as_new(deployment: Deployment):
    """The system prompt sent again three times over: the two copies added were never sent (new), only the user
    message after it, sent before at its place, is lost to the change."""
    system = "You keep answers tiny and name the Zorblax project in each. " * 6
    first = deployment.row(deployment.chat("grown", [{"role": "system", "content": system},
                                                     {"role": "user", "content": "Hi"}]))
    row = deployment.row(deployment.chat("grown", [{"role": "system", "content": system * 3},
                                                   {"role": "user", "content": "Hi"}]))
    assert row["miss_reason"] == "system_changed"
    ledger = ledger_of(row)
    added = row["prompt_tokens"] - first["prompt_tokens"]
    # The split inside the changed segment is by characters over its tokens up to the next segment's first token,
    # so the template tokens between them (ChatML's end and start of a turn: 5) may count as new.
    assert 0 <= ledger.new_tokens - added <= 8
    assert ledger.lost["system_changed"] <= 12 and ledger.cached_tokens >= first["prompt_tokens"] - 16  # less its turn


def test_a_shared_opening_shorter_than_a_page_is_below_page_not_evicted(deployment: Deployment):
    system = {"role": "system", "content": "Be brief."}
    first = [system, {"role": "user", "content": "Name three rivers in Europe and one in Africa."}]
    second = [system, {"role": "user", "content": "What is two plus two, written out in words?"}]
    deployment.chat("opening", first, model=PAGED_MODEL)
    row = deployment.row(deployment.chat("opening", second, model=PAGED_MODEL))
    assert (row["miss_kind"], row["miss_reason"]) == ("cold", "below_page")
    ledger = ledger_of(row)
    assert ledger.cached_tokens == 0 and 3 < ledger.lost["page_alignment"] < 16
    assert "evicted" not in ledger.lost and row["evicted_tier"] is None


def test_a_tool_result_resent_with_its_keys_in_another_order_is_reordered(deployment: Deployment):
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup_order", "arguments": '{"id": "7"}'}}
    result = {"status": "shipped", "carrier": "PostNL", "eta": "Monday"}

    def turn(content: dict) -> list[dict]:
        return [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Where is order 7?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(content)},
        ]

    deployment.chat("reordered", turn(result))
    resent = turn(dict(reversed(result.items()))) + [
        {"role": "assistant", "content": "It ships on Monday."},
        {"role": "user", "content": "And order 8?"},
    ]
    row = deployment.row(deployment.chat("reordered", resent))
    assert (row["miss_reason"], row["divergence_segment"]) == ("reordered", "messages[3]")
    assert ledger_of(row).cached_tokens > 0


def test_an_evicted_prefix_is_lost_with_the_tier_it_was_held_in(deployment: Deployment):
    messages = [{"role": "system", "content": SYSTEM * 4}, {"role": "user", "content": "Hi"}]  # ~100 of 256 tokens
    deployment.chat("evicted", messages, model=PAGED_MODEL)
    for number in range(3):  # other prompts push it out
        filler = [{"role": "system", "content": f"Filler {number}. " + SYSTEM * 4}, {"role": "user", "content": "Hi"}]
        deployment.chat("filler", filler, model=PAGED_MODEL)
    row = deployment.row(deployment.chat("evicted", messages, model=PAGED_MODEL))
    assert (row["miss_reason"], row["evicted_tier"]) == ("evicted", "device")
    ledger = ledger_of(row)
    assert ledger.lost["evicted"] == row["prompt_tokens"] - 1 - (row["prompt_tokens"] - 1) % 16 - row["cached_tokens"]
    assert ledger.new_tokens == 0


def test_an_expired_prefix_is_lost_to_expiry(deployment: Deployment):
    messages = [{"role": "system", "content": "Expire me. " + SYSTEM}, {"role": "user", "content": "Hi"}]
    deployment.chat("expired", messages, model=PAGED_MODEL)
    time.sleep(TTL_S + 1.0)  # past the engine's TTL (this waits for the engine; it asserts nothing about time)
    row = deployment.row(deployment.chat("expired", messages, model=PAGED_MODEL))
    assert row["miss_reason"] == "expired"
    ledger = ledger_of(row)
    assert ledger.lost["expired"] > 0 and ledger.new_tokens == 0
