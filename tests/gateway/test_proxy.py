"""The proxy path against the stub: salts, normalization on the wire, routing, models, health and metrics."""

from __future__ import annotations

import json
from dataclasses import replace

import httpx
import pytest
from gateway_testkit import TEST_SECRET, FakeStorage, StubUpstream, gateway_config, running_gateway, serve_in_thread

from gateway.config import ALL_RULES, TenantSettings, UpstreamConfig
from gateway.tenancy import derive_salt

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def tool(name, properties):
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": properties}}}


def test_client_salt_is_replaced_by_the_derived_one(stub, stub_url):
    storage = FakeStorage()
    acme = storage.add_key("k1", "acme")
    beta = storage.add_key("k2", "beta")
    with running_gateway(gateway_config(stub_url, auth="keys"), storage) as gw:
        for key in (acme, beta):
            body = {**CHAT, "cache_salt": "pick-me", "prompt_cache_key": "also-me", "extra_key": "me-too"}
            assert (
                httpx.post(
                    f"{gw.url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
                ).status_code
                == 200
            )
    sent = stub.state.requests
    assert [r["cache_salt"] for r in sent] == [derive_salt(TEST_SECRET, "acme"), derive_salt(TEST_SECRET, "beta")]
    assert sent[0]["cache_salt"] != sent[1]["cache_salt"]
    assert not any({"prompt_cache_key", "extra_key"} & set(r) for r in sent)


def test_openai_kind_upstream_gets_no_salt(stub, stub_url):
    config = replace(gateway_config(stub_url), upstreams=(UpstreamConfig(name="stub", url=stub_url, kind="openai"),))
    with running_gateway(config) as gw:
        response = httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "cache_salt": "x"})
        assert response.status_code == 200
        assert "cache_salt" not in stub.state.requests[-1]
        (record,) = gw.wait_records(1)
        assert record.miss_kind is None  # only the local engine reports match headers
        assert record.cached_tokens == 4


def test_openai_kind_records_null_cached_tokens_when_not_reported(stub, stub_url):
    stub.state.cached_tokens = None
    config = replace(gateway_config(stub_url), upstreams=(UpstreamConfig(name="stub", url=stub_url, kind="openai"),))
    with running_gateway(config) as gw:
        httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT)
        (record,) = gw.wait_records(1)
        assert record.prompt_tokens == 10 and record.cached_tokens is None


def test_normalization_reaches_the_upstream_and_is_recorded(gateway, stub):
    body = {
        **CHAT,
        "messages": [{"role": "system", "content": "Be brief.\r\n"}, {"role": "user", "content": "hi"}],
        "tools": [tool("zeta", {"b": {}, "a": {}}), tool("alpha", {})],
    }
    httpx.post(f"{gateway.url}/v1/chat/completions", json=body)
    sent = stub.state.requests[-1]
    assert [t["function"]["name"] for t in sent["tools"]] == ["alpha", "zeta"]
    assert list(sent["tools"][1]["function"]["parameters"]["properties"]) == ["a", "b"]
    assert sent["messages"][0]["content"] == "Be brief.\n"
    (record,) = gateway.wait_records(1)
    assert record.applied_rules == ("newlines", "tool_schema_key_order", "tool_order")
    assert record.prefix_hash is not None and record.prompt_text is None


def test_rules_can_be_switched_off_and_hoisting_on_per_tenant(stub, stub_url):
    storage = FakeStorage()
    plain = storage.add_key("k1", "plain")
    hoisting = storage.add_key("k2", "hoister")
    tenants = {
        "plain": TenantSettings(rules=frozenset()),
        "hoister": TenantSettings(rules=frozenset(ALL_RULES), store_prompt_text=True),
    }
    body = {
        **CHAT,
        "messages": [{"role": "system", "content": "Now: 2025-06-01T10:00:00Z"}, {"role": "user", "content": "hi"}],
        "tools": [tool("b", {}), tool("a", {})],
    }
    with running_gateway(gateway_config(stub_url, tenants=tenants, auth="keys"), storage) as gw:
        httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {plain}"})
        httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {hoisting}"})
        records = gw.wait_records(2)
    unchanged, hoisted = stub.state.requests
    assert [t["function"]["name"] for t in unchanged["tools"]] == ["b", "a"]
    assert unchanged["messages"][0]["content"] == "Now: 2025-06-01T10:00:00Z"
    assert hoisted["messages"][0]["content"] == "Now: [volatile#1]"
    assert "2025-06-01T10:00:00Z" in hoisted["messages"][1]["content"]
    assert records[0].applied_rules == () and records[0].prompt_text is None
    assert records[1].applied_rules == ("tool_schema_key_order", "tool_order", "hoist_volatile")
    assert json.loads(records[1].prompt_text)[0]["content"] == "Now: [volatile#1]"


def test_routing_by_model(stub, stub_url):
    other = StubUpstream()
    with serve_in_thread(other) as other_url:
        config = replace(
            gateway_config(stub_url),
            upstreams=(
                UpstreamConfig(name="stub", url=stub_url),
                UpstreamConfig(name="other", url=other_url, kind="vllm"),
            ),
            routes={"special": "other"},
        )
        with running_gateway(config) as gw:
            httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "model": "special"})
            httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT)
            models = httpx.get(f"{gw.url}/v1/models").json()
            records = gw.wait_records(2)
    assert [r["model"] for r in other.state.requests] == ["special"]
    assert [r["model"] for r in stub.state.requests] == ["m"]
    assert [r.upstream for r in records] == ["other", "stub"]
    assert {m["id"] for m in models["data"]} == {"stub-model", "special"}


def test_models_needs_a_key_when_keys_exist(stub, stub_url):
    storage = FakeStorage()
    secret = storage.add_key("k1", "acme")
    with running_gateway(gateway_config(stub_url, auth="keys"), storage) as gw:
        assert httpx.get(f"{gw.url}/v1/models").status_code == 401
        listed = httpx.get(f"{gw.url}/v1/models", headers={"authorization": f"Bearer {secret}"})
        assert listed.status_code == 200 and listed.json()["object"] == "list"


def test_health_and_metrics(gateway, stub):
    httpx.post(f"{gateway.url}/v1/chat/completions", json={**CHAT, "tools": [tool("b", {}), tool("a", {})]})
    httpx.post(f"{gateway.url}/v1/chat/completions", content=b"nope")
    gateway.wait_records(2)
    health = httpx.get(f"{gateway.url}/health").json()
    assert health["status"] == "ok"
    assert set(health["records"]) == {
        "queued", "written", "spilled", "replayed", "dropped", "pending_spill", "accepted", "rejected", "lost",
        "database_recreated", "journal_failures", "torn_tails_cut", "journaled_pending", "held",
    }  # fmt: skip
    assert health["records"]["written"] == 2
    metrics = httpx.get(f"{gateway.url}/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    assert 'prefixscope_gateway_requests_total{endpoint="chat.completions",status="200",upstream="stub"} 1.0' in text
    assert 'prefixscope_gateway_requests_total{endpoint="chat.completions",status="400",upstream=""} 1.0' in text
    assert 'prefixscope_gateway_normalization_rules_applied_total{rule="tool_order"} 1.0' in text
    assert 'prefixscope_gateway_cached_tokens_total{upstream="stub"} 4.0' in text
    for name in ("queued", "written", "spilled", "replayed", "dropped", "rejected", "lost"):
        assert f"prefixscope_gateway_records_{name}_total" in text
    assert "prefixscope_gateway_open_mode 1.0" in text


def test_non_streamed_client_disconnect_is_recorded(stub, stub_url):
    stub.state.slow_seconds = 3.0
    with running_gateway(gateway_config(stub_url)) as gw:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                f"{gw.url}/v1/chat/completions", json={**CHAT, "model": "slow"}, timeout=httpx.Timeout(30, read=0.3)
            )
        (record,) = gw.wait_records(1)
        assert (record.status_code, record.error_type) == (499, "client_disconnected")
