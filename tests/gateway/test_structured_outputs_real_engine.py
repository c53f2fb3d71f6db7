"""Clients no one here wrote, unchanged, through the gateway to the real engine: the `openai` package's
`chat.completions.parse`, LangChain's `with_structured_output` and `instructor` get typed objects back (the gateway
passes `response_format` through); `n=4` computes its prompt once on the engine; logprobs come through."""

from __future__ import annotations

import re

import httpx
import instructor
import openai
import pytest
from gateway_testkit import gateway_config, running_gateway
from langchain_openai import ChatOpenAI
from pydantic import BaseModel
from real_engine_kit import MODEL

from gateway.config import UpstreamConfig

pytestmark = pytest.mark.real_model


class Shipment(BaseModel):
    city: str
    delivered: bool
    days: int


QUESTION = "A parcel shipped to Lyon arrived after 4 days. Describe the shipment as JSON."


@pytest.fixture(scope="module")
def gateway(engine_url):
    upstream = UpstreamConfig(name="engine", url=engine_url, kind="local_engine", timeout_s=300.0)
    with running_gateway(gateway_config(engine_url, upstreams=(upstream,), default_upstream="engine")) as gw:
        yield gw


@pytest.fixture(scope="module")
def client(gateway):
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_openai_parse_returns_a_parsed_object(client):
    completion = client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], response_format=Shipment, max_tokens=48,
        temperature=0,
    )
    assert isinstance(completion.choices[0].message.parsed, Shipment)


def test_langchain_with_structured_output(gateway):
    llm = ChatOpenAI(model=MODEL, base_url=f"{gateway.url}/v1", api_key="unused", temperature=0, max_tokens=48,
                     max_retries=0, timeout=300)
    answer = llm.with_structured_output(Shipment).invoke(QUESTION)
    assert isinstance(answer, Shipment)


def test_instructor_with_a_response_model(client):
    patched = instructor.from_openai(client, mode=instructor.Mode.JSON_SCHEMA)
    answer = patched.chat.completions.create(
        model=MODEL, response_model=Shipment, messages=[{"role": "user", "content": QUESTION}], max_tokens=48,
        temperature=0, max_retries=0,
    )
    assert isinstance(answer, Shipment)


def prefill_tokens(engine_url: str) -> float:
    metrics = httpx.get(f"{engine_url}/metrics", timeout=30).text
    return float(re.search(r"^prefixscope_engine_prefill_tokens(?:_total)? (\S+)$", metrics, re.M).group(1))


def test_n4_computes_the_prompt_once_and_logprobs_pass_through(client, engine_url):
    before = prefill_tokens(engine_url)
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name four fruits."}], n=4, max_tokens=6,
        temperature=1.0, seed=9, logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True},
    )
    assert [choice.index for choice in answer.choices] == [0, 1, 2, 3]
    uncached = answer.usage.prompt_tokens - answer.usage.prompt_tokens_details.cached_tokens
    assert uncached > 0 and prefill_tokens(engine_url) - before == uncached  # once, not four times
    assert answer.usage.completion_tokens == 24
    assert all(len(choice.logprobs.content) == 6 for choice in answer.choices)
