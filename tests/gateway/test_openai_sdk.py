"""The official `openai` package pointed at the gateway (stub upstream behind it)."""

from __future__ import annotations

import openai
import pytest
from gateway_testkit import FakeStorage, gateway_config, running_gateway

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello"}]


@pytest.fixture
def keyed_gateway(stub, stub_url):
    storage = FakeStorage()
    secret = storage.add_key("k1", "acme")
    with running_gateway(gateway_config(stub_url, auth="keys"), storage) as gw:
        yield gw, secret


def test_plain_chat_completion(keyed_gateway):
    gw, secret = keyed_gateway
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=secret, max_retries=0)
    completion = client.chat.completions.create(model="m", messages=MESSAGES)
    assert completion.choices[0].message.content == "ok"
    assert completion.usage.prompt_tokens_details.cached_tokens == 4
    (record,) = gw.wait_records(1)
    assert (record.tenant, record.status_code, record.stream) == ("acme", 200, False)


def test_streamed_chat_completion(keyed_gateway):
    gw, secret = keyed_gateway
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=secret, max_retries=0)
    chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello world"
    assert all(c.usage is None for c in chunks)
    with_usage = list(
        client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    )
    assert with_usage[-1].usage.prompt_tokens_details.cached_tokens == 4
    records = gw.wait_records(2)
    assert [(r.stream, r.cached_tokens) for r in records] == [(True, 4), (True, 4)]


def test_legacy_completions(keyed_gateway):
    gw, secret = keyed_gateway
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=secret, max_retries=0)
    assert client.completions.create(model="m", prompt="Once upon").choices[0].text == "ok"
    streamed = list(client.completions.create(model="m", prompt="Once upon", stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == "Hello world"


def test_sdk_errors(keyed_gateway):
    gw, _ = keyed_gateway
    bad_key = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.chat.completions.create(model="m", messages=MESSAGES)


async def test_async_client_streams(keyed_gateway):
    gw, secret = keyed_gateway
    client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=secret, max_retries=0)
    text = ""
    async for chunk in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
        text += chunk.choices[0].delta.content or ""
    await client.close()
    assert text == "Hello world"
