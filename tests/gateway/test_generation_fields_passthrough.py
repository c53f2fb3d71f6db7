"""The gateway passes the generation fields it does not act on (structured outputs, logprobs, n, penalties) through
to every OpenAI-compatible kind of upstream unchanged: the local engine, vLLM and SGLang serve them."""

from __future__ import annotations

import httpx
import pytest
from gateway_testkit import gateway_config, running_gateway

from gateway.config import UpstreamConfig

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_FIELDS = {
    "response_format": {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA, "strict": True}},
    "n": 3,
    "logprobs": True,
    "top_logprobs": 2,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.25,
    "logit_bias": {"42": -100},
    "min_tokens": 2,
    "repetition_penalty": 1.1,
}
COMPLETION_FIELDS = {"echo": True, "logprobs": 3, "best_of": 2, "n": 1, "max_tokens": 0,
                     "response_format": {"type": "json_object"}}


@pytest.mark.parametrize("kind", ["local_engine", "vllm", "sglang"])
def test_generation_fields_reach_the_upstream_unchanged(stub, stub_url, kind):
    upstream = UpstreamConfig(name="up", url=stub_url, kind=kind, timeout_s=30.0)
    with running_gateway(gateway_config(stub_url, upstreams=(upstream,), default_upstream="up")) as gw:
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **CHAT_FIELDS}
        assert httpx.post(f"{gw.url}/v1/chat/completions", json=chat, timeout=30).status_code == 200
        sent = stub.state.requests[-1]
        assert {name: sent.get(name) for name in CHAT_FIELDS} == CHAT_FIELDS
        completion = {"model": "m", "prompt": "hi", **COMPLETION_FIELDS}
        assert httpx.post(f"{gw.url}/v1/completions", json=completion, timeout=30).status_code == 200
        sent = stub.state.requests[-1]
        assert {name: sent.get(name) for name in COMPLETION_FIELDS} == COMPLETION_FIELDS
