"""The Messages API through the gateway to the real engine (SmolLM2-135M-Instruct on the CPU), driven by the official
`anthropic` package, recording into SQLite. Every test starts its prompts with a fresh nonce so that nothing cached
by an earlier test can help it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from gateway_testkit import db_storage, gateway_config, running_gateway, wait_until
from sqlalchemy import bindparam, create_engine, text

from db.ledger import LOST_CAUSES
from gateway.config import UpstreamConfig
from gateway.config.messages import MessagesSettings

pytestmark = pytest.mark.real_model

MODEL = "smollm2"
MIN_CACHEABLE = 64
LONG_SYSTEM = (
    "You are the support assistant of a bicycle shop. You answer questions about orders, repairs, spare parts "
    "and opening hours. Be brief, be friendly, and never invent order numbers or prices. "
) * 4
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city name"}},
        "required": ["city"],
    },
}


@dataclass
class Deployment:
    url: str
    keys: dict[str, str]  # "alpha" / "beta" -> key
    tenants: dict[str, str]  # "alpha" / "beta" -> the tenant's name, fresh for each test
    database_url: str

    def anthropic(self, tenant: str = "alpha") -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key=self.keys[tenant], max_retries=0, timeout=300)

    def openai(self, tenant: str = "alpha") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.keys[tenant], max_retries=0, timeout=300)

    def rows(self, request_ids: list[str]) -> dict[str, dict]:
        """The stored rows of these requests, once the writer has written them all (bounded wait)."""
        engine = create_engine(self.database_url)
        query = text("SELECT * FROM requests WHERE id IN :ids").bindparams(bindparam("ids", expanding=True))
        try:

            def fetch() -> list[dict]:
                with engine.connect() as conn:
                    return [dict(row._mapping) for row in conn.execute(query, {"ids": request_ids})]

            wait_until(lambda: len(fetch()) >= len(request_ids))
            return {row["id"]: row for row in fetch()}
        finally:
            engine.dispose()

    def count_rows(self) -> int:
        engine = create_engine(self.database_url)
        try:
            with engine.connect() as conn:
                return conn.execute(text("SELECT COUNT(*) FROM requests")).scalar_one()
        finally:
            engine.dispose()


@pytest.fixture
def deployment(engine_url: str, tmp_path: Path) -> Iterator[Deployment]:
    from db.keys import create_api_key
    from db.migrate import upgrade

    database_url = f"sqlite:///{tmp_path}/gateway.db"
    upgrade(database_url)
    sync_engine = create_engine(database_url)
    # Fresh tenants (so fresh cache namespaces) for every test: nothing cached by another test, in this module or
    # another on the same engine, can reach these requests.
    tenants = {name: f"messages-{name}-{uuid.uuid4().hex[:8]}" for name in ("alpha", "beta")}
    keys = {name: create_api_key(sync_engine, tenant).plaintext_key for name, tenant in tenants.items()}
    sync_engine.dispose()
    config = gateway_config(
        engine_url,
        upstreams=(UpstreamConfig(name="engine", url=engine_url, kind="local_engine", timeout_s=300.0),),
        default_upstream="engine",
        auth="keys",
    )
    config = replace(config, messages=MessagesSettings(1024, {MODEL: MIN_CACHEABLE}))
    with running_gateway(config, db_storage(database_url, tmp_path)) as gw:
        yield Deployment(gw.url, keys, tenants, database_url)


def cached_system(ttl: str = "5m") -> list[dict]:
    return [
        {
            "type": "text",
            "text": f"[session {uuid.uuid4().hex}] {LONG_SYSTEM}",
            "cache_control": {"type": "ephemeral", "ttl": ttl},
        }
    ]


def usage_tuple(usage) -> tuple[int, int, int]:
    return usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens


def test_breakpoint_writes_then_reads_the_prefix(deployment: Deployment):
    client = deployment.anthropic()
    system = cached_system()
    first = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=4, system=system, messages=[{"role": "user", "content": "When are you open?"}]
    )
    second = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=4, system=system, messages=[{"role": "user", "content": "Can you fix a flat tyre?"}]
    )
    one, two = first.parse().usage, second.parse().usage
    assert one.cache_creation_input_tokens > 100 and one.cache_read_input_tokens == 0
    assert one.cache_creation.ephemeral_5m_input_tokens == one.cache_creation_input_tokens
    assert one.cache_creation.ephemeral_1h_input_tokens == 0
    prefix = one.cache_creation_input_tokens
    assert two.cache_read_input_tokens >= 0.9 * prefix
    assert two.cache_read_input_tokens + two.cache_creation_input_tokens == prefix
    # The three parts add up to the prompt as the engine counted it.
    for response, usage in ((first, one), (second, two)):
        assert sum(usage_tuple(usage)) == int(response.headers["x-prefix-cache-prompt-tokens"])
    assert second.headers["x-prefix-cache-miss"] == "partial"
    ids = [first.headers["x-request-id"], second.headers["x-request-id"]]
    rows = deployment.rows(ids)
    assert sorted(rows) == sorted(ids)  # one row per request
    assert [rows[i]["endpoint"] for i in ids] == ["messages", "messages"]
    assert [rows[i]["cached_tokens"] for i in ids] == [0, two.cache_read_input_tokens]
    assert [rows[i]["cache_write_tokens"] for i in ids] == [prefix, two.cache_creation_input_tokens]
    assert [rows[i]["prompt_tokens"] for i in ids] == [sum(usage_tuple(one)), sum(usage_tuple(two))]
    assert [rows[i]["retention_class"] for i in ids] == ["5m", "5m"]
    assert [rows[i]["tenant"] for i in ids] == [deployment.tenants["alpha"]] * 2
    assert rows[ids[0]]["miss_reason"] == "new_prefix" and rows[ids[1]]["miss_reason"] == "hit"


def test_one_hour_breakpoints_and_the_minimum_cacheable_prefix(deployment: Deployment):
    client = deployment.anthropic()
    hour = client.messages.create(
        model=MODEL, max_tokens=2, system=cached_system("1h"), messages=[{"role": "user", "content": "Hi"}]
    )
    assert hour.usage.cache_creation.ephemeral_1h_input_tokens == hour.usage.cache_creation_input_tokens > 100
    assert hour.usage.cache_creation.ephemeral_5m_input_tokens == 0
    short_system = [{"type": "text", "text": f"{uuid.uuid4().hex} Be brief.", "cache_control": {"type": "ephemeral"}}]
    ids = []
    for _ in range(2):
        raw = client.messages.with_raw_response.create(
            model=MODEL, max_tokens=2, system=short_system, messages=[{"role": "user", "content": "Hi"}]
        )
        short = raw.parse()
        ids.append(raw.headers["x-request-id"])
        # Below the model's minimum cacheable prefix: nothing written, nothing read, even when the engine reused it.
        assert short.usage.cache_creation_input_tokens == 0 and short.usage.cache_read_input_tokens == 0
        assert short.usage.input_tokens > 20
    # The second one the engine matched, yet the client read none of it: outside what the request could cache, not
    # evicted; its ledger carries the engine's match as lost to the cache scope.
    again = deployment.rows(ids)[ids[1]]
    assert again["cached_tokens"] == 0 and again["miss_reason"] == "cache_scope"
    assert again["lost_cache_scope_tokens"] > 0 and not again["lost_evicted_tokens"]
    parts = ["new_tokens", "unknown_tokens", *(f"lost_{cause}_tokens" for cause in LOST_CAUSES)]
    assert sum(again[part] or 0 for part in parts) == again["prompt_tokens"]


def test_streaming_event_sequence_and_final_usage(deployment: Deployment):
    client = deployment.anthropic()
    system = cached_system()
    client.messages.create(model=MODEL, max_tokens=2, system=system, messages=[{"role": "user", "content": "Hi"}])
    body = {
        "model": MODEL,
        "max_tokens": 6,
        "stream": True,
        "temperature": 0,
        "system": system,
        "messages": [{"role": "user", "content": "Do you sell bells?"}],
    }
    headers = {"x-api-key": deployment.keys["alpha"], "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", f"{deployment.url}/v1/messages", json=body, headers=headers, timeout=300) as response:
        assert response.status_code == 200
        raw = response.read().decode()
    events = []
    for block in raw.split("\n\n"):
        if block.strip():
            fields = dict(line.split(": ", 1) for line in block.splitlines())
            events.append((fields["event"], json.loads(fields["data"])))
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    start_usage = events[0][1]["message"]["usage"]
    final = events[-2][1]
    assert final["delta"]["stop_reason"] == "max_tokens"
    assert final["usage"]["output_tokens"] == 6
    assert final["usage"]["cache_read_input_tokens"] == start_usage["cache_read_input_tokens"] > 100
    assert final["usage"]["cache_creation_input_tokens"] == 0
    text_out = "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta")
    # The SDK's stream helper sees the same message.
    with client.messages.stream(
        model=MODEL,
        max_tokens=6,
        system=system,
        messages=[{"role": "user", "content": "Do you sell bells?"}],
        extra_body={"temperature": 0},  # greedy, so both streams say the same
    ) as stream:
        streamed_text = "".join(stream.text_stream)
        message = stream.get_final_message()
    assert streamed_text == text_out
    assert message.usage.cache_read_input_tokens > 100 and message.stop_reason == "max_tokens"


def test_tool_history_is_accepted_by_the_engine(deployment: Deployment):
    """A conversation that already holds a tool_use and its tool_result renders on the engine and gets an answer."""
    client = deployment.anthropic()
    message = client.messages.create(
        model=MODEL,
        max_tokens=8,
        tools=[WEATHER_TOOL],
        messages=[
            {"role": "user", "content": f"[{uuid.uuid4().hex}] What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 C and sunny"}],
            },
        ],
    )
    assert message.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert message.usage.output_tokens > 0


def test_tool_use_round_trip(deployment: Deployment):
    """tool_use -> tool_result -> answer. Needs the engine to return tool calls as tool calls (its chat API's
    `tool_calls` and a named `tool_choice`)."""
    client = deployment.anthropic()
    question = {"role": "user", "content": f"[{uuid.uuid4().hex}] What is the weather in Paris?"}
    first = client.messages.create(
        model=MODEL,
        max_tokens=128,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[question],
        extra_body={"temperature": 0},  # greedy, so the call is the same on every run
    )
    assert first.stop_reason == "tool_use"
    tool_use = next(block for block in first.content if block.type == "tool_use")
    assert tool_use.name == "get_weather" and isinstance(tool_use.input.get("city"), str)
    answer = client.messages.create(
        model=MODEL,
        max_tokens=16,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "none"},
        messages=[
            question,
            {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "21 C and sunny"}],
            },
        ],
    )
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [block.type for block in answer.content] == ["text"]


def test_errors_have_anthropics_shape_and_one_row_each(deployment: Deployment):
    client = deployment.anthropic()
    before = deployment.count_rows()
    ids = []
    with pytest.raises(anthropic.NotFoundError) as unknown_model:
        client.messages.create(model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert unknown_model.value.body == {"type": "error", "error": {"type": "not_found_error", "message": "model: no-such-model"}}
    ids.append(unknown_model.value.response.headers["x-request-id"])
    with pytest.raises(anthropic.BadRequestError) as too_long:
        client.messages.create(model=MODEL, max_tokens=100_000, messages=[{"role": "user", "content": "Hi"}])
    assert "context window" in too_long.value.body["error"]["message"]
    ids.append(too_long.value.response.headers["x-request-id"])
    with pytest.raises(anthropic.BadRequestError) as document:
        client.messages.create(
            model=MODEL,
            max_tokens=4,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
                    ],
                }
            ],
        )
    assert "'document' are not supported" in document.value.body["error"]["message"]
    ids.append(document.value.response.headers["x-request-id"])
    rows = deployment.rows(ids)
    assert [rows[i]["status_code"] for i in ids] == [404, 400, 400]
    assert all(rows[i]["endpoint"] == "messages" for i in ids)
    assert deployment.count_rows() == before + 3


def test_chat_and_messages_share_the_cached_prefix(deployment: Deployment):
    """One tenant sends the same conversation as Anthropic messages and as OpenAI chat: the rendered prompts are the
    same, so each hits what the other cached."""
    system = cached_system()
    question = {"role": "user", "content": "Which bikes do you repair?"}
    messages_response = deployment.anthropic().messages.with_raw_response.create(
        model=MODEL, max_tokens=4, system=system, messages=[question]
    )
    usage = messages_response.parse().usage
    chat_messages = [{"role": "system", "content": system[0]["text"]}, question]
    chat = deployment.openai().chat.completions.with_raw_response.create(
        model=MODEL, messages=chat_messages, max_tokens=4
    )
    chat_usage = chat.parse().usage
    assert chat_usage.prompt_tokens == sum(usage_tuple(usage))
    assert chat_usage.prompt_tokens_details.cached_tokens == chat_usage.prompt_tokens - 1  # all but the last token
    # And the other way round: a chat request first, then the same system prompt as a Messages request.
    system_two = cached_system()
    deployment.openai().chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": system_two[0]["text"]}, question], max_tokens=2
    )
    after_chat = deployment.anthropic().messages.create(
        model=MODEL, max_tokens=2, system=system_two, messages=[{"role": "user", "content": "And e-bikes?"}]
    )
    assert after_chat.usage.cache_read_input_tokens > 100 and after_chat.usage.cache_creation_input_tokens == 0
    # Another tenant's identical request reads nothing: caches are per tenant.
    other = deployment.anthropic("beta").messages.create(
        model=MODEL, max_tokens=2, system=system_two, messages=[{"role": "user", "content": "And e-bikes?"}]
    )
    assert other.usage.cache_read_input_tokens == 0 and other.usage.cache_creation_input_tokens > 100
    ids = [messages_response.headers["x-request-id"], chat.headers["x-request-id"]]
    rows = deployment.rows(ids)
    assert rows[ids[0]]["prefix_hash"] == rows[ids[1]]["prefix_hash"]
    assert (rows[ids[0]]["endpoint"], rows[ids[1]]["endpoint"]) == ("messages", "chat.completions")
    assert rows[ids[1]]["miss_reason"] == "hit"


def test_count_tokens_matches_the_prompt(deployment: Deployment):
    client = deployment.anthropic()
    system = cached_system()
    messages = [{"role": "user", "content": "Hello there"}]
    counted = client.messages.count_tokens(model=MODEL, system=system, messages=messages)
    answered = client.messages.create(model=MODEL, max_tokens=2, system=system, messages=messages)
    assert counted.input_tokens == sum(usage_tuple(answered.usage))


def test_stop_sequences_end_with_stop_reason_stop_sequence(deployment: Deployment):
    client = deployment.anthropic()
    messages = [{"role": "user", "content": f"[{uuid.uuid4().hex}] Count from one to ten in words."}]
    greedy = {"temperature": 0}
    free = client.messages.create(model=MODEL, max_tokens=12, messages=messages, extra_body=greedy)
    text = free.content[0].text
    stop = text[4:8]
    assert len(stop) == 4 and stop.strip()
    stopped = client.messages.create(
        model=MODEL, max_tokens=12, messages=messages, stop_sequences=[stop], extra_body=greedy
    )
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", stop)
    assert stop not in stopped.content[0].text and text.startswith(stopped.content[0].text)
    with client.messages.stream(
        model=MODEL, max_tokens=12, messages=messages, stop_sequences=[stop], extra_body=greedy
    ) as stream:
        streamed = stream.get_final_message()
    assert (streamed.stop_reason, streamed.stop_sequence) == ("stop_sequence", stop)
