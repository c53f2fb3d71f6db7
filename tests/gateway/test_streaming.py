"""Streaming: chunks pass through as they arrive, usage is taken from the stream, disconnects cancel upstream."""

from __future__ import annotations

import json

import httpx

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def events_of(text: str) -> list[str]:
    return [block[len("data: ") :] for block in text.split("\n\n") if block.startswith("data: ")]


def test_chunks_arrive_before_the_stream_ends(gateway, stub):
    """The stub sends one chunk and then holds the stream until the test has seen that chunk."""
    with httpx.stream(
        "POST", f"{gateway.url}/v1/chat/completions", json={**CHAT, "model": "held-stream"}, timeout=30
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        received = b""
        chunks = response.iter_raw()
        while b"Hello" not in received:
            received += next(chunks)
        # The first chunk reached us while the upstream was still holding the rest.
        stub.state.release.set()
        received += b"".join(chunks)
    assert stub.state.released_before_end is True
    payloads = events_of(received.decode())
    assert payloads[-1] == "[DONE]"
    text = "".join(json.loads(p)["choices"][0]["delta"].get("content", "") for p in payloads[:-1])
    assert text == "Hello world"
    (record,) = gateway.wait_records(1)
    assert record.stream and record.status_code == 200
    assert record.ttft_ms is not None and record.ttft_ms <= record.latency_ms


def test_response_ends_at_done_even_if_the_upstream_lingers(gateway, stub):
    body = {**CHAT, "model": "linger-after-done"}
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=30)
    # We have the whole response although the upstream still holds its stream open (it waits for `release`).
    assert events_of(response.text)[-1] == "[DONE]"
    assert stub.state.released_before_end is None  # the upstream is still waiting
    stub.state.release.set()
    (record,) = gateway.wait_records(1)
    assert (record.status_code, record.error_type) == (200, None)


def test_usage_chunk_not_forwarded_unless_asked(gateway, stub):
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT)
    payloads = events_of(response.text)
    assert all("usage" not in json.loads(p) or json.loads(p)["usage"] is None for p in payloads[:-1])
    assert all(json.loads(p)["choices"] for p in payloads[:-1])
    # ... but the gateway asked upstream for it, and recorded it.
    assert stub.state.requests[-1]["stream_options"] == {"include_usage": True}
    (record,) = gateway.wait_records(1)
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (10, 4, 2)
    assert record.miss_kind == "partial"


def test_usage_chunk_forwarded_when_asked(gateway, stub):
    body = {**CHAT, "stream_options": {"include_usage": True}}
    payloads = events_of(httpx.post(f"{gateway.url}/v1/chat/completions", json=body).text)
    last = json.loads(payloads[-2])
    assert last["choices"] == [] and last["usage"]["prompt_tokens_details"]["cached_tokens"] == 4
    (record,) = gateway.wait_records(1)
    assert record.cached_tokens == 4


def test_completions_endpoint_streams_too(gateway, stub):
    response = httpx.post(f"{gateway.url}/v1/completions", json={"model": "m", "prompt": "Once", "stream": True})
    payloads = events_of(response.text)
    assert "".join(json.loads(p)["choices"][0]["text"] for p in payloads[:-1]) == "Hello world"
    assert stub.state.paths[-1] == "/v1/completions"
    (record,) = gateway.wait_records(1)
    assert record.endpoint == "completions" and record.cached_tokens == 4


def test_client_disconnect_cancels_the_upstream_request(gateway, stub):
    with httpx.stream(
        "POST", f"{gateway.url}/v1/chat/completions", json={**CHAT, "model": "endless-stream"}, timeout=30
    ) as response:
        chunks = response.iter_raw()
        received = b""
        while b"Hello" not in received:
            received += next(chunks)
    # Leaving the block closed our connection; the gateway must close the upstream one in turn.
    assert stub.state.disconnected.wait(timeout=20)
    (record,) = gateway.wait_records(1)
    assert (record.status_code, record.error_type) == (499, "client_disconnected")
    assert record.stream


def test_headers_of_the_upstream_match_report_are_passed_on(gateway, stub):
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=CHAT)
    assert response.headers["x-prefix-cache-miss"] == "partial"
    assert response.headers["x-prefix-cache-matched-tokens"] == "4"
    assert response.headers["x-request-id"].startswith("req_")
    (record,) = gateway.wait_records(1)
    assert record.request_id == response.headers["x-request-id"]
