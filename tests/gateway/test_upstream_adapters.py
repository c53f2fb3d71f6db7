"""Adapters: salt placement and stripping, and where each kind reports cached tokens."""

from __future__ import annotations

import pytest

from gateway.upstreams import adapter_for
from gateway.tenancy import derive_salt
from gateway.upstreams.base import CLIENT_SALT_FIELDS
from gateway.upstreams.prompt_cache_key import derive_prompt_cache_key

CLIENT_BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "cache_salt": "client-chosen",
    "salt": "x",
    "extra_key": "y",
    "prompt_cache_key": "z",
}


@pytest.mark.parametrize("kind", ["local_engine", "vllm", "sglang"])
def test_salted_kinds_replace_client_salt(kind):
    adapter = adapter_for(kind)
    body = adapter.apply_salt(CLIENT_BODY, "derived")
    assert body["cache_salt"] == "derived"
    assert not {"salt", "extra_key", "prompt_cache_key"} & set(body)
    assert CLIENT_BODY["cache_salt"] == "client-chosen"  # input untouched


def test_openai_kind_sends_no_client_salt_only_the_derived_prompt_cache_key():
    body = adapter_for("openai").apply_salt(CLIENT_BODY, "derived")
    assert not (set(CLIENT_SALT_FIELDS) - {"prompt_cache_key"}) & set(body)
    assert body["prompt_cache_key"] == derive_prompt_cache_key("derived", CLIENT_BODY)
    assert body["prompt_cache_key"].startswith("ps-") and "z" != body["prompt_cache_key"]
    assert body["messages"] == CLIENT_BODY["messages"]


SYSTEM = {"role": "system", "content": "You are the support assistant of a bicycle shop. " * 20}


def test_derived_prompt_cache_key_is_per_tenant_and_prefix():
    salt_a, salt_b = derive_salt("secret", "acme"), derive_salt("secret", "beta")
    first = {"model": "gpt", "messages": [SYSTEM, {"role": "user", "content": "When are you open?"}]}
    second = {"model": "gpt", "messages": [SYSTEM, {"role": "user", "content": "Can you fix a flat tyre?"}]}
    other_prefix = {"model": "gpt", "messages": [{"role": "system", "content": "Other."}, first["messages"][1]]}
    # One tenant, one prefix: one key, whatever follows the prefix.
    assert derive_prompt_cache_key(salt_a, first) == derive_prompt_cache_key(salt_a, second)
    # Another tenant with the very same prompt never shares it; another prefix gets another key.
    assert derive_prompt_cache_key(salt_a, first) != derive_prompt_cache_key(salt_b, first)
    assert derive_prompt_cache_key(salt_a, first) != derive_prompt_cache_key(salt_a, other_prefix)
    # The client's own key splits the tenant's traffic further, never across tenants.
    keyed = {**first, "prompt_cache_key": "user-42"}
    assert derive_prompt_cache_key(salt_a, keyed) != derive_prompt_cache_key(salt_a, first)
    assert derive_prompt_cache_key(salt_a, keyed) != derive_prompt_cache_key(salt_b, keyed)
    # A Responses body with the same instructions keys by the same rule.
    responses = {"model": "gpt", "instructions": SYSTEM["content"], "input": "When are you open?"}
    assert derive_prompt_cache_key(salt_a, responses) == derive_prompt_cache_key(
        salt_a, {**responses, "input": "Can you fix a flat tyre?"}
    )


def test_openai_shape_usage_and_null_when_absent():
    adapter = adapter_for("openai")
    usage = adapter.usage(
        {"usage": {"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 64}}}
    )
    assert (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) == (100, 64, 5)
    missing = adapter.usage({"usage": {"prompt_tokens": 100, "completion_tokens": 5}})
    assert missing.cached_tokens is None and missing.prompt_tokens == 100
    assert adapter.usage({}).prompt_tokens is None
    assert adapter.usage({"usage": {"prompt_tokens": 3, "prompt_tokens_details": None}}).cached_tokens is None


def test_vllm_usage():
    usage = adapter_for("vllm").usage(
        {"usage": {"prompt_tokens": 9, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 0}}}
    )
    assert usage.cached_tokens == 0


def test_sglang_reads_meta_info_when_usage_lacks_details():
    adapter = adapter_for("sglang")
    usage = adapter.usage(
        {
            "usage": {"prompt_tokens": 21, "completion_tokens": 4, "prompt_tokens_details": None},
            "meta_info": {"cached_tokens": 16},
        }
    )
    assert (usage.prompt_tokens, usage.cached_tokens) == (21, 16)
    native = adapter.usage({"meta_info": {"prompt_tokens": 7, "completion_tokens": 2, "cached_tokens": 3}})
    assert (native.prompt_tokens, native.cached_tokens, native.completion_tokens) == (7, 3, 2)
    preferred = adapter.usage(
        {
            "usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 2}},
            "meta_info": {"cached_tokens": 9},
        }
    )
    assert preferred.cached_tokens == 2


def test_local_engine_headers_and_prefix_cache_object():
    adapter = adapter_for("local_engine")
    report = adapter.cache_report(
        {"x-prefix-cache-matched-tokens": "48", "x-prefix-cache-prompt-tokens": "50", "x-prefix-cache-miss": "partial"}
    )
    assert (report.miss_kind, report.matched_tokens, report.prompt_tokens) == ("partial", 48, 50)
    assert adapter.cache_report({"x-prefix-cache-miss": "weird"}).miss_kind is None
    assert adapter.cache_report({}).matched_tokens is None
    usage = adapter.usage(
        {"usage": {"prompt_tokens": 50}, "prefix_cache": {"matched_tokens": 48, "prompt_tokens": 50, "miss": "hit"}}
    )
    assert usage.cached_tokens == 48


def test_unknown_kind():
    with pytest.raises(ValueError):
        adapter_for("nope")


def test_the_header_map_reads_as_the_response_headers_do():
    import httpx

    from gateway.forwarding import header_map

    headers = httpx.Headers(
        [(b"X-Prefix-Cache-Matched-Tokens", b"448"), (b"x-prefix-cache-miss", b"partial"), (b"Set-Cookie", b"a=1"),
         (b"set-cookie", b"b=2"), (b"x-prefix-cache-segment", "caf\u00e9".encode())]
    )
    found = header_map(headers)
    assert set(found) == {name.lower() for name in headers}
    for name in headers:
        assert found[name.lower()] == headers.get(name)
    assert found["set-cookie"] == "a=1, b=2"
    report = adapter_for("local_engine").cache_report(found)
    assert report == adapter_for("local_engine").cache_report(headers)
    assert (report.matched_tokens, report.miss_kind) == (448, "partial")
