"""Acceptance: for every miss reason, a crafted pair of requests through the gateway and the real engine produces it,
with the right segment, in the stored row. Also: normalization uplift and engine hash chains in the database.

Two engines: the session's default one (page size 1, large cache) and a paged one (`--page-size 16`, a 256-token
pool, a short TTL) for `below_page`, `evicted` and `expired`; the model alias `PAGED_MODEL` is routed to the paged
engine, which is how `model_changed` happens (the other engine has never seen the prompt). Each case runs under its
own tenant, so that neither the gateway's history nor the engines' caches (salted per tenant) carry over.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from gateway_testkit import db_storage, gateway_config, running_gateway
from real_engine_kit import MODEL, EngineProcess, create_keys, stored

from db.chains import unpack_hash_ids
from gateway.config import TenantSettings, UpstreamConfig

pytestmark = pytest.mark.real_model

PAGED_MODEL = "SmolLM2-135M-Instruct"  # an alias the engine serves; routed to the paged engine
TTL_S = 4.0
SYSTEM = (
    "You are the support assistant of a bicycle shop. You answer questions about orders, repairs, spare parts and "
    "opening hours. Today is 2025-06-01. Be brief and never invent order numbers."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Find an order by its id.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {"name": "book_repair", "description": "Book a repair slot.", "parameters": {"type": "object"}},
    },
]
CASES = (
    "hit",
    "model_changed",
    "tools_changed",
    "system_changed",
    "volatile_value",
    "messages_changed",
    "reordered",
    "new_prefix",
    "below_page",
    "evicted",
    "expired",
)
PLAIN = TenantSettings(rules=frozenset(), uplift_sample_rate=0.0)  # nothing normalized: the prompts as crafted


@dataclass
class Deployment:
    url: str
    keys: dict[str, str]
    database_url: str

    def chat(self, tenant: str, messages: list[dict], **extra: Any) -> httpx.Response:
        body = {"model": MODEL, "messages": messages, "max_tokens": 1, "temperature": 0, **extra}
        headers = {"authorization": f"Bearer {self.keys[tenant]}"}
        response = httpx.post(f"{self.url}/v1/chat/completions", json=body, headers=headers, timeout=120)
        assert response.status_code == 200, response.text
        return response

    def rows(self, responses: list[httpx.Response]) -> list[dict[str, Any]]:
        ids = [r.headers["x-request-id"] for r in responses]
        by_id = stored(self.database_url, "requests", "id", ids)
        return [by_id[i] for i in ids]


@pytest.fixture(scope="module")
def paged_engine() -> Iterator[EngineProcess]:
    """Started first, so that it loads while the default engine does."""
    engine = EngineProcess("--page-size", "16", "--kv-cache-tokens", "256", "--ttl", str(TTL_S))
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def deployment(paged_engine: EngineProcess, engine_url: str, tmp_path_factory) -> Iterator[Deployment]:
    paged_url = paged_engine.wait_healthy()
    tmp_path = tmp_path_factory.mktemp("explain")
    database_url = f"sqlite:///{tmp_path}/gateway.db"
    tenants = {name: PLAIN for name in CASES} | {"filler": PLAIN, "uplift": TenantSettings(uplift_sample_rate=1.0)}
    keys = create_keys(database_url, list(tenants))
    config = gateway_config(
        engine_url,
        upstreams=(
            UpstreamConfig(name="engine", url=engine_url, kind="local_engine", timeout_s=300.0),
            UpstreamConfig(name="paged", url=paged_url, kind="local_engine", timeout_s=300.0),
        ),
        default_upstream="engine",
        routes={PAGED_MODEL: "paged"},
        tenants=tenants,
        auth="keys",
    )
    with running_gateway(config, db_storage(database_url, tmp_path)) as gw:
        yield Deployment(gw.url, keys, database_url)


def conversation(system: str = SYSTEM, *turns: str) -> list[dict]:
    """A system prompt, then alternating user and assistant turns (ending with a user turn)."""
    roles = ("user", "assistant")
    return [{"role": "system", "content": system}] + [
        {"role": roles[i % 2], "content": text} for i, text in enumerate(turns)
    ]


ANSWER = "<the earlier answer>"
EDITED_TOOLS = [TOOLS[0], {**TOOLS[1], "function": {**TOOLS[1]["function"], "description": "Book a slot."}}]
PAIRS = {
    # The conversation grew: everything cacheable was reused.
    "hit": (
        {"messages": conversation(SYSTEM, "When are you open?")},
        # The earlier answer comes back as the gateway returned it (`ANSWER` is replaced by it).
        {"messages": conversation(SYSTEM, "When are you open?", ANSWER, "And on Sunday?")},
        "messages[2]",  # where the match ended: the end of the earlier answer (its last token is never computed)
    ),
    "model_changed": (
        {"messages": conversation(SYSTEM, "Hi")},
        {"messages": conversation(SYSTEM, "Hi"), "model": PAGED_MODEL},
        "model",
    ),
    "tools_changed": (
        {"messages": conversation(SYSTEM, "Hi"), "tools": TOOLS},
        {"messages": conversation(SYSTEM, "Hi"), "tools": EDITED_TOOLS},
        "tools",
    ),
    "system_changed": (
        {"messages": conversation(SYSTEM, "Hi")},
        {"messages": conversation(SYSTEM.replace("Be brief", "Be friendly"), "Hi")},
        "system",
    ),
    "volatile_value": (
        {"messages": conversation(SYSTEM, "Hi")},
        {"messages": conversation(SYSTEM.replace("2025-06-01", "2025-06-02"), "Hi")},
        "system",
    ),
    "messages_changed": (
        {"messages": conversation(SYSTEM, "My bike is red.", "Noted.", "Which tyres fit?")},
        {"messages": conversation(SYSTEM, "My bike is blue.", "Noted.", "Which tyres fit?")},
        "messages[1]",
    ),
    "reordered": (
        {"messages": conversation(SYSTEM, "Hi"), "tools": TOOLS},
        {"messages": conversation(SYSTEM, "Hi"), "tools": TOOLS[::-1]},
        "tools",
    ),
    "new_prefix": (
        {"messages": conversation(SYSTEM, "Hi")},
        {"messages": conversation("Translate the user's text into French.", "Good morning")},
        "system",  # only the template's opening matched: the engine places the first uncached token there
    ),
}


@pytest.mark.parametrize("reason", list(PAIRS))
def test_a_crafted_pair_is_explained_with_its_reason_and_segment(deployment: Deployment, reason: str):
    first_body, second_body, segment = PAIRS[reason]
    first = deployment.chat(reason, **first_body)
    answer = first.json()["choices"][0]["message"]["content"]
    messages = [{**m, "content": answer} if m["content"] == ANSWER else m for m in second_body["messages"]]
    second = deployment.chat(reason, **{**second_body, "messages": messages})
    first_row, row = deployment.rows([first, second])
    # A fresh tenant: a cold miss, recorded where the engine placed its first uncached token.
    first_location = (first_row["miss_reason"], first_row["divergence_segment"], first_row["divergence_char_offset"])
    assert first_location == ("new_prefix", "tools" if "tools" in first_body else "system", 0)  # its first part
    assert (row["miss_reason"], row["divergence_segment"]) == (reason, segment)
    assert row["divergence_char_offset"] is not None
    if reason == "hit":
        assert row["recomputed_tokens"] == 0
    else:
        assert row["recomputed_tokens"] == row["prompt_tokens"] - row["cached_tokens"] > 0


def test_below_page(deployment: Deployment):
    messages = conversation(SYSTEM, "Hi")
    first = deployment.chat("below_page", messages, model=PAGED_MODEL)
    second = deployment.chat("below_page", messages, model=PAGED_MODEL)
    _, row = deployment.rows([first, second])
    assert (row["prompt_tokens"] - 1) % 16 != 0  # else the whole prompt would fit in pages: a plain hit
    assert (row["miss_kind"], row["miss_reason"], row["divergence_segment"]) == ("hit", "below_page", None)
    assert row["recomputed_tokens"] == row["prompt_tokens"] - row["cached_tokens"] > 1


def test_evicted(deployment: Deployment):
    messages = conversation(SYSTEM * 3, "Hi")  # about 120 tokens; the pool holds 256
    first = deployment.chat("evicted", messages, model=PAGED_MODEL)
    for number in range(3):  # other prompts push it out (least recently used first)
        deployment.chat("filler", conversation(f"Filler {number}. " + SYSTEM * 3, "Hi"), model=PAGED_MODEL)
    again = deployment.chat("evicted", messages, model=PAGED_MODEL)
    _, row = deployment.rows([first, again])
    assert (row["miss_kind"], row["miss_reason"]) == ("evicted", "evicted")
    assert row["divergence_segment"] is not None and row["divergence_char_offset"] is not None  # the engine's report
    assert row["recomputed_tokens"] == row["prompt_tokens"] - row["cached_tokens"]


def test_expired(deployment: Deployment):
    messages = conversation("Expire me. " + SYSTEM, "Hi")
    first = deployment.chat("expired", messages, model=PAGED_MODEL)
    time.sleep(TTL_S + 1.0)  # past the engine's TTL (this waits for the engine; it asserts nothing about time)
    again = deployment.chat("expired", messages, model=PAGED_MODEL)
    _, row = deployment.rows([first, again])
    assert (row["miss_kind"], row["miss_reason"]) == ("expired", "expired")
    assert row["divergence_segment"] is not None and row["divergence_char_offset"] is not None  # the engine's report


def test_normalization_uplift_is_recorded(deployment: Deployment):
    """Tools in another order with keys in another order: normalized, the second request is a full hit; as sent, it
    would have matched only up to the tools. The gain is measured in the background and lands in the row."""

    def reverse_keys(value):
        if isinstance(value, dict):
            return {k: reverse_keys(value[k]) for k in reversed(list(value))}
        return [reverse_keys(v) for v in value] if isinstance(value, list) else value

    messages = conversation(SYSTEM, "Hi")
    first = deployment.chat("uplift", messages, tools=TOOLS)
    second = deployment.chat("uplift", messages, tools=reverse_keys(TOOLS[::-1]))
    first_row, row = deployment.rows([first, second])
    assert row["miss_reason"] == "hit" and row["cached_tokens"] == row["prompt_tokens"] - 1
    assert row["normalization_gain_tokens"] > 0
    assert first_row["normalization_gain_tokens"] == 0  # nothing was cached yet: normalization could not help


def test_engine_hash_chains_are_recorded_exactly_and_not_shown(deployment: Deployment):
    messages = conversation(SYSTEM, "Hi")
    plain = deployment.chat("hit", messages)
    streamed = deployment.chat("hit", messages, stream=True, stream_options={"include_usage": True})
    assert "hash_chain" not in plain.json()["prefix_cache"] and "hash_chain" not in streamed.text
    rows = deployment.rows([plain, streamed])
    assert [row["miss_reason"] for row in rows] == ["hit", "hit"]  # a new question, then the same again
    chains = stored(deployment.database_url, "request_chains", "request_id", [r["id"] for r in rows])
    for row in rows:
        chain = chains[row["id"]]
        assert (chain["block_size"], chain["input_length"], bool(chain["approximate"])) == (
            16,
            row["prompt_tokens"],
            False,
        )
        assert len(unpack_hash_ids(chain["hash_ids"])) == row["prompt_tokens"] // 16
    first, second = (unpack_hash_ids(chains[row["id"]]["hash_ids"]) for row in rows)
    assert first == second  # the same prompt, the same blocks
