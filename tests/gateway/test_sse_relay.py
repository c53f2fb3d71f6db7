"""The SSE relay: event framing across network chunks, usage capture, and the hidden usage chunk."""

from __future__ import annotations

import json
import time

from gateway.sse import SSERelay
from gateway.upstreams import adapter_for


def event(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


ROLE = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}], "usage": None}
HELLO = {"choices": [{"index": 0, "delta": {"content": "Hello"}, "finish_reason": None}], "usage": None}
STOP = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": None}
USAGE = {
    "choices": [],
    "usage": {"prompt_tokens": 12, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 8}},
}
STREAM = event(ROLE) + event(HELLO) + event(STOP) + event(USAGE) + b"data: [DONE]\n\n"


def relay(forward_usage: bool) -> SSERelay:
    return SSERelay(adapter_for("local_engine"), forward_usage=forward_usage, start_perf=time.perf_counter())


def run(r: SSERelay, data: bytes, size: int) -> list[bytes]:
    outputs = [r.feed(data[i : i + size]) for i in range(0, len(data), size)]
    outputs.append(r.flush())
    return outputs


def test_usage_chunk_hidden_when_client_did_not_ask():
    for size in (1, 7, 50, len(STREAM)):
        r = relay(forward_usage=False)
        out = b"".join(run(r, STREAM, size))
        # No `usage` member at all: the gateway asked for usage on the client's behalf, not the client.
        assert out == b"".join(event(no_usage(c)) for c in (ROLE, HELLO, STOP)) + b"data: [DONE]\n\n"
        assert r.usage is not None and (r.usage.prompt_tokens, r.usage.cached_tokens) == (12, 8)
        assert r.ttft_ms is not None and r.saw_done


def no_usage(chunk: dict) -> dict:
    return {k: v for k, v in chunk.items() if k != "usage"}


def test_null_usage_member_is_dropped_wherever_it_sits_and_content_is_untouched():
    chunks = [
        {"usage": None, "id": "a", "choices": [{"delta": {"content": 'say \\"usage\\": null, ok'}}]},
        {"id": "b", "usage": None, "choices": []},
        {"id": "c", "choices": [{"delta": {"content": '"usage": null'}}], "usage": None},
    ]
    data = b"".join(event(c) for c in chunks) + b"data: [DONE]\n\n"
    for size in (1, 5, len(data)):
        out = b"".join(run(relay(forward_usage=False), data, size))
        assert out == b"".join(event(no_usage(c)) for c in chunks) + b"data: [DONE]\n\n"
        kept = b"".join(run(relay(forward_usage=True), data, size))
        assert kept == data


def test_usage_chunk_forwarded_when_client_asked():
    r = relay(forward_usage=True)
    assert b"".join(run(r, STREAM, 13)) == STREAM
    assert r.usage.completion_tokens == 2


def test_complete_events_go_out_immediately_partial_ones_wait():
    r = relay(forward_usage=True)
    first = event(HELLO)
    assert r.feed(first + first[:10]) == first
    assert r.feed(first[10:]) == first


def test_usage_on_a_content_chunk_is_stripped_not_dropped():
    chunk = {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop"}], "usage": USAGE["usage"]}
    r = relay(forward_usage=False)
    out = r.feed(event(chunk))
    assert json.loads(out[6:]) == {"choices": chunk["choices"]}
    assert r.usage.cached_tokens == 8


def test_crlf_framing_and_comments():
    r = relay(forward_usage=False)
    data = (
        b": keep-alive\r\n\r\n"
        + event(HELLO).replace(b"\n\n", b"\r\n\r\n")
        + event(USAGE).replace(b"\n\n", b"\r\n\r\n")
    )
    out = b"".join(run(r, data, 5))
    assert b"keep-alive" in out and b"Hello" in out and b"cached_tokens" not in out
    assert r.usage.cached_tokens == 8


def test_error_event_is_forwarded_and_noted():
    r = relay(forward_usage=False)
    err = {"error": {"message": "boom", "type": "server_error"}}
    assert r.feed(event(err)) == event(err)
    assert r.error_type == "server_error"


def test_ttft_waits_for_content_not_the_role_chunk():
    r = relay(forward_usage=False)
    r.feed(event(ROLE))
    assert r.ttft_ms is None
    r.feed(event(HELLO))
    assert r.ttft_ms is not None


def test_unterminated_last_event_is_flushed():
    r = relay(forward_usage=True)
    assert r.feed(b"data: [DONE]") == b""
    assert r.flush() == b"data: [DONE]\n\n"
