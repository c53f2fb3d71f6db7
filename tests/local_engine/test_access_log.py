"""The engine's access log (local_engine.api.access_log): one INFO line per completion with its figures, never its
text or keys; other endpoints at DEBUG; off with `access_log=False`."""

from __future__ import annotations

import logging

import httpx
import pytest

from .server_fixtures import served_engine

SECRET_TEXT = "the pelican's passphrase is tangerine-quartz"
API_KEY = "sk-engine-test-key-0123456789"


@pytest.fixture(scope="module")
def server(tiny_loaded):
    with served_engine(tiny_loaded, api_key=API_KEY, kv_cache_tokens=4096) as served:
        yield served


def _post(base_url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(base_url + path, json=body, timeout=60, headers={"authorization": f"Bearer {API_KEY}"})


def _access_records(caplog) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == "local_engine.access"]


def _chat(**extra) -> dict:
    return {"model": "tiny-llama", "max_tokens": 5, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": SECRET_TEXT}],
            **extra}


def test_a_completion_gets_one_line_with_its_figures_and_no_text(server, caplog):
    base_url, _ = server
    caplog.set_level(logging.INFO, logger="local_engine.access")
    first = _post(base_url, "/v1/chat/completions", _chat())
    again = _post(base_url, "/v1/chat/completions", _chat())  # the same prompt: most of it from the cache
    assert first.status_code == again.status_code == 200
    records = [r for r in _access_records(caplog) if r.access["path"] == "/v1/chat/completions"]
    assert len(records) == 2
    for record, response in zip(records, (first, again)):
        body, fields = response.json(), record.access
        usage = body["usage"]
        assert record.levelno == logging.INFO
        assert fields["request_id"] == body["id"] and fields["method"] == "POST" and fields["status"] == 200
        assert fields["prompt_tokens"] == usage["prompt_tokens"]
        assert fields["cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
        assert fields["computed_tokens"] == usage["prompt_tokens"] - fields["cached_tokens"]
        assert fields["output_tokens"] == usage["completion_tokens"] == 5
        assert fields["finish_reason"] == body["choices"][0]["finish_reason"] == "length"
        assert fields["ttft_ms"] == pytest.approx(float(response.headers["x-prefix-cache-ttft-ms"]), abs=0.06)
        assert fields["stream"] == "false"
        line = record.getMessage()
        assert line.startswith(f"access {body['id']} POST /v1/chat/completions 200 ")
        assert f"prompt_tokens={usage['prompt_tokens']}" in line and "finish_reason=length" in line
        assert "tangerine" not in line and "pelican" not in line and API_KEY not in line
        assert "tangerine" not in str(fields) and API_KEY not in str(fields)
    assert records[1].access["cached_tokens"] > records[0].access["cached_tokens"]


def test_a_stream_is_logged_when_it_ends(server, caplog):
    base_url, _ = server
    caplog.set_level(logging.INFO, logger="local_engine.access")
    body = _chat(stream=True, stream_options={"include_usage": True}, n=2)
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"authorization": f"Bearer {API_KEY}"}) as response:
        assert response.status_code == 200
        text = response.read().decode()
    (record,) = [r for r in _access_records(caplog) if r.access["path"] == "/v1/chat/completions"]
    assert record.access["stream"] == "true" and record.access["status"] == 200
    assert record.access["output_tokens"] == 10  # both choices' tokens
    assert record.access["request_id"] in text and record.access["finish_reason"] == "length"
    assert "tangerine" not in record.getMessage()


def test_a_refused_request_and_other_endpoints(server, caplog):
    base_url, _ = server
    caplog.set_level(logging.DEBUG, logger="local_engine.access")
    refused = _post(base_url, "/v1/completions", {"model": "tiny-llama", "prompt": SECRET_TEXT, "max_tokens": -1})
    assert refused.status_code == 400
    unauthorized = httpx.post(base_url + "/v1/completions", json={"prompt": SECRET_TEXT}, timeout=30,
                              headers={"authorization": "Bearer wrong-key-abc"})
    assert unauthorized.status_code == 401
    assert httpx.get(base_url + "/health", timeout=30).status_code == 200
    by_status = {r.access["status"]: r for r in _access_records(caplog)}
    assert by_status[400].levelno == logging.INFO and by_status[400].access["prompt_tokens"] is None
    assert by_status[401].access["path"] == "/v1/completions"
    (health,) = [r for r in _access_records(caplog) if r.access["path"] == "/health"]
    assert health.levelno == logging.DEBUG and "prompt_tokens" not in health.access
    for record in _access_records(caplog):
        assert "tangerine" not in record.getMessage() and "wrong-key-abc" not in record.getMessage()


def test_the_access_log_can_be_turned_off(tiny_loaded, caplog, monkeypatch):
    from tests.local_engine import server_fixtures

    real_create_app = server_fixtures.create_app
    monkeypatch.setattr(server_fixtures, "create_app", lambda engine, config: real_create_app(engine, config,
                                                                                             access_log=False))
    caplog.set_level(logging.DEBUG, logger="local_engine.access")
    with served_engine(tiny_loaded, kv_cache_tokens=1024) as (base_url, _):
        answer = httpx.post(base_url + "/v1/completions", timeout=60,
                            json={"model": "tiny-llama", "prompt": [5, 6, 7], "max_tokens": 2})
        assert answer.status_code == 200
    assert _access_records(caplog) == []


def test_a_log_level_above_info_writes_no_completion_lines(server, caplog):
    base_url, _ = server
    caplog.set_level(logging.WARNING, logger="local_engine.access")
    assert _post(base_url, "/v1/chat/completions", _chat()).status_code == 200
    assert _access_records(caplog) == []
