"""The response shapes of `n`, `logprobs`, `echo` and `response_format`, read by the official `openai` package, and a
400 naming the field for each value the engine refuses. A tiny random Llama behind real HTTP."""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from .server_fixtures import served_engine

MODEL = "tiny-llama"
MESSAGES = [{"role": "user", "content": "Where is my parcel?"}]


@pytest.fixture(scope="module")
def served(tiny_loaded):
    with served_engine(tiny_loaded, kv_cache_tokens=4096) as (base_url, engine):
        yield OpenAI(base_url=base_url + "/v1", api_key="not-needed", max_retries=0, timeout=120), engine


def test_streamed_chat_with_n_and_logprobs(served):
    client, _ = served
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, n=2, max_tokens=5, temperature=1.0, seed=4, logprobs=True, top_logprobs=2,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    text, entries, reasons, usage = {0: "", 1: ""}, {0: [], 1: []}, {}, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text[choice.index] += choice.delta.content or ""
            if choice.logprobs is not None:
                entries[choice.index] += choice.logprobs.content
            if choice.finish_reason:
                reasons[choice.index] = choice.finish_reason
    assert reasons == {0: "length", 1: "length"}
    for index in (0, 1):
        assert len(entries[index]) == 5
        assert "".join(entry.token for entry in entries[index]) == text[index]
        for entry in entries[index]:
            assert len(entry.top_logprobs) == 2 and entry.logprob <= 0
            assert bytes(entry.bytes) == entry.token.encode()
    assert usage.completion_tokens == 10 and usage.prompt_tokens < 40  # the prompt counted once


def test_completions_echo_with_zero_max_tokens_scores_the_prompt(served):
    client, engine = served
    prompt = "The parcel left the depot on Monday morning"
    answer = client.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=3, max_tokens=0)
    choice = answer.choices[0]
    num_tokens = len(engine.loaded.tokenizer.encode(prompt))
    assert choice.text == prompt
    assert answer.usage.completion_tokens == 0 and answer.usage.prompt_tokens == num_tokens
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == num_tokens and "".join(logprobs.tokens) == prompt
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(value < 0 for value in logprobs.token_logprobs[1:])
    assert all(len(top) == 3 for top in logprobs.top_logprobs[1:])
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(num_tokens)]


def test_completions_with_logprobs_and_best_of(served):
    client, _ = served
    answer = client.completions.create(model=MODEL, prompt="Order 1234 is", max_tokens=4, n=2, best_of=3,
                                       temperature=1.0, logprobs=1, extra_body={"ignore_eos": True})
    assert [c.index for c in answer.choices] == [0, 1]
    totals = [sum(c.logprobs.token_logprobs) for c in answer.choices]
    assert totals[0] >= totals[1] - 1e-3
    assert answer.usage.completion_tokens == 12  # all three sequences generated


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_json_object_on_both_endpoints(served, endpoint):
    client, _ = served
    fmt = {"type": "json_object"}
    if endpoint == "chat":
        text = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=48, temperature=0,
                                              response_format=fmt).choices[0].message.content
    else:
        text = client.completions.create(model=MODEL, prompt="JSON:", max_tokens=48, temperature=0,
                                         extra_body={"response_format": fmt}).choices[0].text
    assert text.startswith("{")  # compact JSON, possibly cut by max_tokens on a random model


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
         "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"$ref": "#/missing"}}}}}}, "response_format"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"n": 0}, "n"),
        ({"best_of": 2}, "best_of"),
        ({"echo": True}, "echo"),
        ({"logit_bias": {"not-a-token": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
        ({"audio": {"voice": "alloy"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ],
)
def test_chat_fields_it_cannot_honour_are_400s_naming_them(served, extra, param):
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, **extra}
    response = httpx.post(f"{served[0].base_url}chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"suffix": "end"}, "suffix"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"best_of": 1, "n": 2}, "best_of"),
        ({"best_of": 3, "n": 1, "stream": True}, "best_of"),
        ({"logprobs": 21}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_completions_fields_it_cannot_honour_are_400s_naming_them(served, extra, param):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 4, **extra}
    response = httpx.post(f"{served[0].base_url}completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
