"""SmolLM2-135M-Instruct with the official `openai` package: a Pydantic model parsed from a constrained answer,
log-probabilities equal to the model's own log-softmax, `n=4` computing its prompt once, and penalties changing
greedy output exactly as defined (a reference decoder built on full forwards and transformers' own processor)."""

from __future__ import annotations

import pytest
import torch
from openai import OpenAI
from pydantic import BaseModel
from transformers import RepetitionPenaltyLogitsProcessor

from local_engine.prompt.chat_prompt import chat_prompt_token_ids

from .server_fixtures import served_engine

pytestmark = pytest.mark.real_model

MODEL = "smollm2"


class Parcel(BaseModel):
    city: str
    delivered: bool
    days: int


@pytest.fixture(scope="module")
def served(smollm2_loaded):
    with served_engine(smollm2_loaded, kv_cache_tokens=8192) as (base_url, engine):
        yield OpenAI(base_url=base_url + "/v1", api_key="not-needed", max_retries=0, timeout=300), engine


def messages(question: str) -> list[dict]:
    return [{"role": "system", "content": "You answer in JSON."}, {"role": "user", "content": question}]


def test_parse_with_a_pydantic_model_returns_a_parsed_object(served):
    client, _ = served
    completion = client.chat.completions.parse(
        model=MODEL, messages=messages("My parcel went to Paris, arrived after 3 days. Describe it."),
        response_format=Parcel, max_tokens=48, temperature=0,
    )
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(message.parsed, Parcel)
    assert Parcel.model_validate_json(message.content) == message.parsed


def test_a_streamed_json_schema_answer_is_valid(served):
    client, _ = served
    schema = Parcel.model_json_schema() | {"additionalProperties": False}
    stream = client.chat.completions.create(
        model=MODEL, messages=messages("Parcel to Rome, not delivered, 5 days."), max_tokens=48, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "parcel", "schema": schema, "strict": True}},
        stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    Parcel.model_validate_json(text)


def greedy_reference(model, prompt: list[int], num_tokens: int, adjust=lambda logits, generated: logits):
    """(tokens, raw log-probabilities of each, its top 3 ids): greedy decoding with one full forward per token."""
    tokens, logprobs, tops = [], [], []
    with torch.inference_mode():
        for _ in range(num_tokens):
            logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, -1].float()
            raw = torch.log_softmax(logits, dim=-1)
            token = int(adjust(logits.clone(), tokens).argmax())
            tokens.append(token)
            logprobs.append(raw[token].item())
            tops.append(raw.topk(3).indices.tolist())
    return tokens, logprobs, tops


def test_chat_logprobs_equal_the_models_log_softmax(served, smollm2_loaded):
    client, _ = served
    chat = messages("Name a colour.")
    answer = client.chat.completions.create(model=MODEL, messages=chat, max_tokens=6, temperature=0, logprobs=True,
                                            top_logprobs=3, extra_body={"ignore_eos": True})
    content = answer.choices[0].logprobs.content
    prompt = chat_prompt_token_ids(smollm2_loaded.tokenizer, chat, None)
    tokens, logprobs, tops = greedy_reference(smollm2_loaded.model, prompt, 6)
    decode = smollm2_loaded.tokenizer.decode
    assert [entry.token for entry in content] == [decode([t]) for t in tokens]
    for entry, logprob, top in zip(content, logprobs, tops):
        assert entry.logprob == pytest.approx(logprob, abs=1e-4)
        assert [alt.token for alt in entry.top_logprobs] == [decode([t]) for t in top]


def test_prompt_logprobs_equal_the_models_log_softmax_and_are_never_cached(served, smollm2_loaded):
    client, _ = served
    text = "The quick brown fox jumps over the lazy dog"
    first = client.completions.create(model=MODEL, prompt=text, echo=True, logprobs=1, max_tokens=0)
    second = client.completions.create(model=MODEL, prompt=text, echo=True, logprobs=1, max_tokens=0)
    assert second.usage.prompt_tokens_details.cached_tokens == 0  # computed whole although the prefix is cached
    prompt = smollm2_loaded.tokenizer.encode(text)
    with torch.inference_mode():
        reference = torch.log_softmax(smollm2_loaded.model(input_ids=torch.tensor([prompt])).logits[0].float(), -1)
    expected = [reference[i - 1, prompt[i]].item() for i in range(1, len(prompt))]
    for answer in (first, second):
        assert answer.choices[0].logprobs.token_logprobs[0] is None
        assert answer.choices[0].logprobs.token_logprobs[1:] == pytest.approx(expected, abs=1e-4)


def test_n4_computes_the_prompt_once(served, smollm2_loaded):
    client, engine = served
    chat = messages("Write a haiku about parcels.")
    before = engine.counters.prefill_tokens
    answer = client.chat.completions.create(model=MODEL, messages=chat, n=4, max_tokens=8, temperature=1.0, seed=2,
                                            logprobs=True, extra_body={"cache_salt": "n4-once", "ignore_eos": True})
    num_prompt_tokens = len(chat_prompt_token_ids(smollm2_loaded.tokenizer, chat, None))
    assert [c.index for c in answer.choices] == [0, 1, 2, 3]
    uncached = answer.usage.prompt_tokens - answer.usage.prompt_tokens_details.cached_tokens
    assert uncached > 0 and engine.counters.prefill_tokens - before == uncached  # once, not 4 times
    assert answer.usage.prompt_tokens == num_prompt_tokens
    assert answer.usage.completion_tokens == 32
    assert [len(c.logprobs.content) for c in answer.choices] == [8, 8, 8, 8]
    assert len({c.message.content for c in answer.choices}) > 1  # each sequence sampled on its own


REPEATING = messages("Repeat after me ten times: parcel parcel parcel parcel")


def presence_frequency(presence: float, frequency: float):
    def adjust(logits: torch.Tensor, generated: list[int]) -> torch.Tensor:
        for token in set(generated):
            logits[token] -= frequency * generated.count(token) + presence
        return logits
    return adjust


def repetition(penalty: float, prompt: list[int]):
    processor = RepetitionPenaltyLogitsProcessor(penalty)
    return lambda logits, generated: processor(torch.tensor([prompt + generated]), logits.unsqueeze(0))[0]


@pytest.mark.parametrize("penalty", ["presence_frequency", "repetition"])
def test_penalties_change_greedy_output_as_defined(served, smollm2_loaded, penalty):
    client, _ = served
    prompt = chat_prompt_token_ids(smollm2_loaded.tokenizer, REPEATING, None)
    if penalty == "repetition":
        fields, adjust = {"repetition_penalty": 1.5}, repetition(1.5, prompt)
    else:
        fields, adjust = {"presence_penalty": 1.0, "frequency_penalty": 1.5}, presence_frequency(1.0, 1.5)
    plain, _, _ = greedy_reference(smollm2_loaded.model, prompt, 10)
    expected, _, _ = greedy_reference(smollm2_loaded.model, prompt, 10, adjust)
    assert expected != plain  # the penalty matters for this prompt
    answer = client.chat.completions.create(model=MODEL, messages=REPEATING, max_tokens=10, temperature=0,
                                            logprobs=True, extra_body={"ignore_eos": True, **fields})
    decode = smollm2_loaded.tokenizer.decode
    assert [entry.token for entry in answer.choices[0].logprobs.content] == [decode([t]) for t in expected]
