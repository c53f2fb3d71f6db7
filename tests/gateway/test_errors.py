"""Every failure is an OpenAI-shaped error with the right status, and every request is recorded."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest
from gateway_testkit import FakeStorage, closed_port, gateway_config, running_gateway

from gateway.config import UpstreamConfig

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def assert_openai_error(response: httpx.Response, status: int, error_type: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if error_type is not None:
        assert error["type"] == error_type
    return error


def test_upstream_down_is_502_and_recorded(stub):
    config = gateway_config(f"http://127.0.0.1:{closed_port()}")
    with running_gateway(config) as gw:
        response = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT)
        assert_openai_error(response, 502, "upstream_unavailable")
        streamed = httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": True})
        assert_openai_error(streamed, 502)
        records = gw.wait_records(2)
        assert [(r.status_code, r.error_type, r.stream) for r in records] == [
            (502, "upstream_unavailable", False),
            (502, "upstream_unavailable", True),
        ]
        assert records[0].prompt_tokens is None and records[0].cached_tokens is None


def test_upstream_timeout_is_504_and_recorded(stub, stub_url):
    stub.state.slow_seconds = 3.0
    config = gateway_config(stub_url)
    config = replace(config, upstreams=(UpstreamConfig(name="stub", url=stub_url, timeout_s=0.3),))
    with running_gateway(config) as gw:
        response = httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "model": "slow"}, timeout=30)
        assert_openai_error(response, 504, "upstream_timeout")
        (record,) = gw.wait_records(1)
        assert (record.status_code, record.error_type, record.model) == (504, "upstream_timeout", "slow")


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", b"{not json", None),
        ("/v1/chat/completions", b"[1, 2]", None),
        ("/v1/chat/completions", b"", None),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        ("/v1/chat/completions", b'{"model": "m"}', "messages"),
        ("/v1/chat/completions", b'{"model": "m", "messages": []}', "messages"),
        ("/v1/chat/completions", b'{"model": "m", "messages": ["x"]}', "messages[0]"),
        ("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user"}], "stream": "yes"}', "stream"),
        ("/v1/completions", b'{"model": "m"}', "prompt"),
        ("/v1/completions", b'{"model": "m", "prompt": []}', "prompt"),
        ("/v1/completions", b'{"model": 5, "prompt": "x"}', "model"),
    ],
)
def test_bad_requests_are_400_and_recorded(gateway, stub, path, body, param):
    response = httpx.post(f"{gateway.url}{path}", content=body, headers={"content-type": "application/json"})
    error = assert_openai_error(response, 400, "invalid_request_error")
    assert error["param"] == param
    (record,) = gateway.wait_records(1)
    assert record.status_code == 400 and record.error_type == "invalid_request_error"
    assert record.endpoint == ("completions" if path == "/v1/completions" else "chat.completions")
    assert stub.state.requests == []


def test_body_over_limit_is_413_and_recorded(stub, stub_url):
    with running_gateway(gateway_config(stub_url, max_body_bytes=1000)) as gw:
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]}
        assert_openai_error(httpx.post(f"{gw.url}/v1/chat/completions", json=big), 413)

        def chunks():
            for _ in range(10):
                yield b" " * 200  # chunked upload: no Content-Length to check up front

        chunked = httpx.post(f"{gw.url}/v1/chat/completions", content=chunks())
        assert_openai_error(chunked, 413)
        assert httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT).status_code == 200
        records = gw.wait_records(3)
        assert [r.status_code for r in records] == [413, 413, 200]


def test_unknown_key_is_401_and_recorded(stub, stub_url):
    storage = FakeStorage()
    storage.add_key("k1", "acme")
    with running_gateway(gateway_config(stub_url, auth="keys"), storage) as gw:
        response = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer nope"})
        assert_openai_error(response, 401, "authentication_error")
        (record,) = gw.wait_records(1)
        assert (record.status_code, record.error_type) == (401, "authentication_error")


def test_another_tenants_stats_is_403(stub, stub_url):
    storage = FakeStorage()
    secret = storage.add_key("k1", "acme")
    with running_gateway(gateway_config(stub_url, auth="keys"), storage) as gw:
        response = httpx.get(
            f"{gw.url}/api/stats", params={"tenant": "beta"}, headers={"authorization": f"Bearer {secret}"}
        )
        assert_openai_error(response, 403, "permission_error")


@pytest.mark.parametrize("status", [400, 429])
def test_upstream_4xx_passes_through_and_is_recorded(gateway, stub, status):
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json={**CHAT, "model": f"err-{status}"})
    assert response.status_code == status
    assert response.json()["error"]["message"] == "stub says no"
    streamed = httpx.post(f"{gateway.url}/v1/chat/completions", json={**CHAT, "model": f"err-{status}", "stream": True})
    assert streamed.status_code == status
    assert streamed.json()["error"]["message"] == "stub says no"
    records = gateway.wait_records(2)
    assert [(r.status_code, r.error_type) for r in records] == [(status, "invalid_request_error")] * 2


def test_wrong_method_and_unknown_path(gateway):
    assert_openai_error(httpx.get(f"{gateway.url}/v1/chat/completions"), 405)
    assert_openai_error(httpx.get(f"{gateway.url}/v1/nothing-here"), 404)
