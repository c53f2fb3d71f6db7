"""A scriptable Anthropic-compatible upstream (`POST /v1/messages`, `POST /v1/messages/count_tokens`) for the
pass-through tests: it logs what it was sent and answers with fixed usage, streamed when asked.

Models: `err-529` answers that status with an Anthropic error body; anything else answers "Hi there".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from asgi_stub import AsgiStub, sse_event

STUB_MISSED_TOKENS = 4321
STUB_USAGE = {
    "input_tokens": 7,
    "cache_creation_input_tokens": 30,
    "cache_read_input_tokens": 100,
    "cache_creation": {"ephemeral_5m_input_tokens": 30, "ephemeral_1h_input_tokens": 0},
    "output_tokens": 3,
}


@dataclass
class AnthropicStubState:
    requests: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


class AnthropicStub(AsgiStub):
    def __init__(self) -> None:
        self.state = AnthropicStubState()

    async def answer(self, scope: dict[str, Any], raw: bytes, send: Any) -> None:
        body = json.loads(raw)
        self.state.requests.append(body)
        self.state.paths.append(scope["path"])
        self.state.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        if scope["path"].endswith("/count_tokens"):
            await self.send_json(send, 200, {"input_tokens": 137})
            return
        if body["model"].startswith("err-"):
            error = {"type": "error", "error": {"type": "overloaded_error", "message": "stub is overloaded"}}
            await self.send_json(send, int(body["model"][4:]), error)
            return
        message_id = f"msg_stub{len(self.state.requests)}"
        # Cache diagnostics (Anthropic's "Cache diagnostics"): asked for with `diagnostics`; no divergence on a first
        # turn (null), `system_changed` when compared with an earlier message.
        diagnostics: dict[str, Any] = {}
        if isinstance(body.get("diagnostics"), dict):
            previous = body["diagnostics"].get("previous_message_id")
            reason = {"type": "system_changed", "cache_missed_input_tokens": STUB_MISSED_TOKENS}
            diagnostics["diagnostics"] = None if previous is None else {"cache_miss_reason": reason}
        if not body.get("stream"):
            answer = {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": [{"type": "text", "text": "Hi there"}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": STUB_USAGE,
                **diagnostics,
            }
            await self.send_json(send, 200, answer)
            return
        start_usage = {**STUB_USAGE, "output_tokens": 1}
        message = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": start_usage,
            **diagnostics,
        }
        events = [
            sse_event("message_start", {"type": "message_start", "message": message}),
            sse_event(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            ),
            sse_event("ping", {"type": "ping"}),
            sse_event(
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
            ),
            sse_event(
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " there"}},
            ),
            sse_event("content_block_stop", {"type": "content_block_stop", "index": 0}),
            sse_event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 3},
                },
            ),
            sse_event("message_stop", {"type": "message_stop"}),
        ]
        await self.send_events(send, events)
