"""A scriptable OpenAI-compatible upstream for the gateway tests, shaped like the local engine where it matters:
match headers, the `prefix_cache` object (with a block hash chain when asked) and the dry-run match endpoint."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

STUB_HASH_IDS = [11, 22]  # the block hash chain the stub returns when asked
STUB_TOOL_CALL = {"id": "call_stub1", "name": "get_weather", "arguments": '{"city": "Paris", "unit": "C"}'}


@dataclass
class StubState:
    """What the stub saw, and knobs the tests turn."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    request_headers: list[dict[str, str]] = field(default_factory=list)  # of each completion request
    match_requests: list[dict[str, Any]] = field(default_factory=list)  # bodies sent to `/v1/cache/match`
    match_matched_tokens: int = 1  # what the dry-run match answers
    match_status: int = 200  # the dry-run match's status (an OpenAI-shaped error body when not 200)
    match_waits: bool = False  # True: dry runs get no answer until it is False again (or the next test's state)
    release: threading.Event = field(default_factory=threading.Event)  # lets a held stream continue
    released_before_end: bool | None = None
    disconnected: threading.Event = field(default_factory=threading.Event)
    slow_seconds: float = 5.0
    cached_tokens: int | None = 4
    miss: str = "partial"
    # The per-tier report: `prefix_cache.tiers` and `prefix_cache.load_ms` in the body and usage chunk (when not
    # None, sent as given, garbled or not) and the `x-prefix-cache-tiers` header value.
    tiers: Any = None
    load_ms: Any = None
    tiers_header: str | None = None
    health_status: int = 200  # what `GET /health` answers


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class StubUpstream:
    """A small OpenAI-compatible server whose behaviour is chosen by the request's model name:

    - `slow`: waits `slow_seconds` before answering (timeouts);
    - `err-400` / `err-429`: answers that status with an OpenAI error body;
    - `held-stream`: streams one chunk, then waits for `state.release` before the rest;
    - `endless-stream`: streams a chunk every 50 ms until the client goes away (records `disconnected`);
    - `linger-after-done`: streams normally but holds the connection open after `[DONE]` until `state.release`;
    - `tool-calls`: answers with text and one tool call (`STUB_TOOL_CALL`; streamed as `delta.tool_calls` with the
      arguments in two pieces) and finish_reason `tool_calls`;
    - anything else: answers at once (streamed when asked, with a usage chunk when include_usage is set).

    `POST /v1/cache/match` answers `state.match_matched_tokens` and is logged in `state.match_requests` only.
    """

    def __init__(self) -> None:
        self.state = StubState()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        path = scope["path"]
        if path == "/health":
            await self._json(send, self.state.health_status, {"status": "ok"})
            return
        if path.endswith("/models"):
            await self._json(send, 200, {"object": "list", "data": [{"id": "stub-model", "object": "model"}]})
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = json.loads(b"".join(chunks))
        if path.endswith("/cache/match"):
            state = self.state
            state.match_requests.append(body)
            while state.match_waits and state is self.state:
                await asyncio.sleep(0.02)
            if self.state.match_status != 200:
                error = {"message": "stub match error", "type": "invalid_request_error", "param": None, "code": None}
                await self._json(send, self.state.match_status, {"error": error})
                return
            answer = {"matched_tokens": self.state.match_matched_tokens, "prompt_tokens": 10, "miss": "partial"}
            await self._json(send, 200, answer)
            return
        self.state.requests.append(body)
        self.state.paths.append(path)
        self.state.request_headers.append({k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]})
        model = body.get("model", "")
        if model == "slow":
            await asyncio.sleep(self.state.slow_seconds)
        if model.startswith("err-"):
            status = int(model[4:])
            error = {"error": {"message": "stub says no", "type": "invalid_request_error", "param": None, "code": "x"}}
            await self._json(send, status, error)
            return
        if body.get("stream"):
            await self._stream(send, receive, body, path)
        else:
            await self._json(send, 200, self._completion(body, path), self._cache_headers())

    def _usage(self) -> dict[str, Any]:
        usage: dict[str, Any] = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
        if self.state.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": self.state.cached_tokens}
        return usage

    def _prefix_cache(self, body: dict[str, Any]) -> dict[str, Any]:
        """The engine's `prefix_cache` object, with a hash chain when the request asked for one."""
        report: dict[str, Any] = {"matched_tokens": self.state.cached_tokens or 0, "prompt_tokens": 10}
        report["miss"] = self.state.miss
        if self.state.tiers is not None:
            report["tiers"] = self.state.tiers
        if self.state.load_ms is not None:
            report["load_ms"] = self.state.load_ms
        if body.get("return_hash_chain") is True:
            block_size = body.get("hash_block_size", 16)
            report["hash_chain"] = {"block_size": block_size, "input_length": 10, "hash_ids": STUB_HASH_IDS}
        return report

    def _cache_headers(self) -> list[tuple[bytes, bytes]]:
        headers = [
            (b"x-prefix-cache-matched-tokens", str(self.state.cached_tokens or 0).encode()),
            (b"x-prefix-cache-prompt-tokens", b"10"),
            (b"x-prefix-cache-miss", self.state.miss.encode()),
        ]
        if self.state.tiers_header is not None:
            headers.append((b"x-prefix-cache-tiers", self.state.tiers_header.encode()))
        return headers

    def _completion(self, body: dict[str, Any], path: str) -> dict[str, Any]:
        if path.endswith("/chat/completions") and body.get("model") == "tool-calls":
            call = {
                "id": STUB_TOOL_CALL["id"],
                "type": "function",
                "function": {"name": STUB_TOOL_CALL["name"], "arguments": STUB_TOOL_CALL["arguments"]},
            }
            message = {"role": "assistant", "content": "Let me check.", "tool_calls": [call]}
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
            kind = "chat.completion"
        elif path.endswith("/chat/completions"):
            choice = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": "ok", "finish_reason": "stop"}
            kind = "text_completion"
        return {
            "id": "cmpl-1",
            "object": kind,
            "created": 1,
            "model": body["model"],
            "choices": [choice],
            "usage": self._usage(),
            "prefix_cache": self._prefix_cache(body),
        }

    def _chunk(self, body: dict[str, Any], path: str, text: str, finish: str | None = None) -> dict[str, Any]:
        if path.endswith("/chat/completions"):
            choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish}
            kind = "text_completion"
        chunk = {"id": "cmpl-1", "object": kind, "created": 1, "model": body["model"], "choices": [choice]}
        if (body.get("stream_options") or {}).get("include_usage"):
            chunk["usage"] = None
        return chunk

    async def _stream(self, send: Any, receive: Any, body: dict[str, Any], path: str) -> None:
        headers = [(b"content-type", b"text/event-stream"), *self._cache_headers()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        model = body["model"]
        await send({"type": "http.response.body", "body": _sse(self._chunk(body, path, "Hello")), "more_body": True})
        if model == "endless-stream":
            watcher = asyncio.ensure_future(receive())
            while not watcher.done():
                await send(
                    {"type": "http.response.body", "body": _sse(self._chunk(body, path, ".")), "more_body": True}
                )
                await asyncio.sleep(0.05)
            self.state.disconnected.set()
            return
        if model == "tool-calls":
            arguments = STUB_TOOL_CALL["arguments"]
            pieces = [
                {
                    "index": 0,
                    "id": STUB_TOOL_CALL["id"],
                    "type": "function",
                    "function": {"name": STUB_TOOL_CALL["name"], "arguments": arguments[:10]},
                },
                {"index": 0, "function": {"arguments": arguments[10:]}},
            ]
            for piece in pieces:
                chunk = self._chunk(body, path, "")
                chunk["choices"][0]["delta"] = {"tool_calls": [piece]}
                await send({"type": "http.response.body", "body": _sse(chunk), "more_body": True})
            final_chunk = self._chunk(body, path, "", "tool_calls")
            final_chunk["choices"][0]["delta"] = {}
            await send({"type": "http.response.body", "body": _sse(final_chunk), "more_body": True})
            await self._stream_end(send, body, model)
            return
        if model == "held-stream":
            released = await asyncio.to_thread(self.state.release.wait, 20)
            self.state.released_before_end = released
        for text in (" wor", "ld"):
            await send({"type": "http.response.body", "body": _sse(self._chunk(body, path, text)), "more_body": True})
        await send({"type": "http.response.body", "body": _sse(self._chunk(body, path, "", "stop")), "more_body": True})
        if model == "linger-after-done":
            await self._stream_end(send, body, model, linger=True)
            return
        await self._stream_end(send, body, model)

    async def _stream_end(self, send: Any, body: dict[str, Any], model: str, linger: bool = False) -> None:
        if (body.get("stream_options") or {}).get("include_usage"):
            final = {
                "id": "cmpl-1",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": model,
                "choices": [],
                "usage": self._usage(),
                "prefix_cache": self._prefix_cache(body),
            }
            await send({"type": "http.response.body", "body": _sse(final), "more_body": True})
        if linger:
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
            self.state.released_before_end = await asyncio.to_thread(self.state.release.wait, 20)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    @staticmethod
    async def _json(send: Any, status: int, obj: Any, headers: list[tuple[bytes, bytes]] = ()) -> None:  # type: ignore[assignment]
        body = json.dumps(obj).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), *headers],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})
