"""Conversations linked by content through the gateway and the real engine (SmolLM2 on the CPU), driven by the official
`openai` and `anthropic` packages, recording into SQLite: three turns each, the third re-sending the second answer
rewritten, on a plain and a streamed chat completion and on the Messages API."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import anthropic
import openai
import pytest
from real_engine_kit import MODEL, keyed_gateway, stored

from gateway.config import TenantSettings

pytestmark = pytest.mark.real_model

PLAIN = TenantSettings(rules=frozenset(), uplift_sample_rate=0.0)  # the prompts as sent
SYSTEM = "You are a terse assistant. Answer in one short sentence."
TENANTS = ("plain", "streamed", "messages")


@dataclass
class Deployment:
    url: str
    keys: dict[str, str]
    database_url: str

    def openai(self, tenant: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.keys[tenant], max_retries=0, timeout=300)

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key=self.keys["messages"], max_retries=0, timeout=300)

    def assert_conversation(self, ids: list[str], rewrite: tuple[str, str, int]) -> None:
        rows = stored(self.database_url, "requests", "id", ids)
        first, second, third = (rows[i] for i in ids)
        assert first["conversation_id"] and first["conversation_id"].startswith("cv_")
        assert {row["conversation_id"] for row in (first, second, third)} == {first["conversation_id"]}
        assert [row["conversation_source"] for row in (first, second, third)] == ["content"] * 3
        assert [row["turn_index"] for row in (first, second, third)] == [1, 2, 3]
        assert [row["parent_request_id"] for row in (first, second, third)] == [None, ids[0], ids[1]]
        assert first["idle_s"] is None and second["idle_s"] >= 0
        assert [row["answer_rewrite"] for row in (first, second)] == [None, None]
        where = (third["answer_rewrite"], third["answer_rewrite_segment"], third["answer_rewrite_char_offset"])
        assert where == rewrite


@pytest.fixture(scope="module")
def deployment(engine_url: str, tmp_path_factory) -> Iterator[Deployment]:
    tenants = dict.fromkeys(TENANTS, PLAIN)
    with keyed_gateway(engine_url, tmp_path_factory.mktemp("conversations"), tenants) as (url, keys, database_url):
        yield Deployment(url, keys, database_url)


def _chat(client: openai.OpenAI, messages: list[dict], stream: bool) -> tuple[str, str]:
    """(request id, answer text) of one chat completion."""
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0, stream=stream
    )
    parsed = raw.parse()
    if stream:
        text = "".join(chunk.choices[0].delta.content or "" for chunk in parsed if chunk.choices)
    else:
        text = parsed.choices[0].message.content or ""
    return raw.headers["x-request-id"], text


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_chat_completions_conversation_by_content(deployment: Deployment, stream: bool):
    client = deployment.openai("streamed" if stream else "plain")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{uuid.uuid4().hex}: Hi."}]
    first, answer = _chat(client, messages, stream)
    messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And a colour?"}]
    second, answer = _chat(client, messages, stream)
    assert answer
    if stream:  # the second answer re-sent cut short
        resent, rewrite = answer[: len(answer) // 2], ("truncated", "messages[4]", len(answer) // 2)
    else:  # with a blank line added at its end
        resent, rewrite = answer + "\n\n", ("whitespace", "messages[4]", len(answer))
    messages += [{"role": "assistant", "content": resent}, {"role": "user", "content": "Thanks."}]
    third, _ = _chat(client, messages, stream)
    deployment.assert_conversation([first, second, third], rewrite)


def test_messages_api_conversation_by_content(deployment: Deployment):
    client = deployment.anthropic()
    messages: list[dict] = [{"role": "user", "content": f"{uuid.uuid4().hex}: Hi."}]
    ids, answers = [], []
    for turn in range(3):
        raw = client.messages.with_raw_response.create(
            model=MODEL, system=SYSTEM, messages=messages, max_tokens=12
        )
        ids.append(raw.headers["x-request-id"])
        text = "".join(block.text for block in raw.parse().content if block.type == "text")
        assert text
        answers.append(text)
        resent = text if turn == 0 else text + " Really."  # the second answer re-sent edited
        messages += [
            {"role": "assistant", "content": [{"type": "text", "text": resent}]},
            {"role": "user", "content": "And a colour?" if turn == 0 else "Thanks."},
        ]
    # As the chat upstream sees it: system, user, assistant, user, then the edited answer at messages[4].
    deployment.assert_conversation(ids, ("edited", "messages[4]", len(answers[1])))
