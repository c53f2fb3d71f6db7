"""A scriptable OpenAI Responses upstream (`POST /v1/responses`, `GET` / `DELETE /v1/responses/{id}`) for the
pass-through tests: it logs what it was sent, keeps the responses it made, and answers with fixed usage, streamed when
asked, with prompt cache diagnostics when `prompt_cache_options.comparison_response_id` asks for them (shapes from
`openai.types.responses.Response`): a `cache_miss` (`tools_changed`) against a response it made, else
`comparison_response_not_found`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from asgi_stub import AsgiStub, sse_event

STUB_MISSED_TOKENS = 1536
STUB_USAGE = {
    "input_tokens": 2048,
    "input_tokens_details": {"cached_tokens": 1024, "cache_write_tokens": 0},
    "output_tokens": 3,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 2051,
}


@dataclass
class ResponsesStubState:
    requests: list[dict[str, Any]] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)  # (method, path) of every call
    kept: dict[str, dict[str, Any]] = field(default_factory=dict)


class ResponsesStub(AsgiStub):
    def __init__(self) -> None:
        self.state = ResponsesStubState()

    async def answer(self, scope: dict[str, Any], raw: bytes, send: Any) -> None:
        self.state.calls.append((scope["method"], scope["path"]))
        if scope["path"].startswith("/v1/responses/"):
            response_id = scope["path"].rsplit("/", 1)[1]
            kept = self.state.kept.get(response_id)
            if kept is None:
                await self.send_json(send, 404, {"error": {"message": "not found", "type": "invalid_request_error"}})
            elif scope["method"] == "DELETE":
                del self.state.kept[response_id]
                await self.send_json(send, 200, {"id": response_id, "object": "response.deleted", "deleted": True})
            else:
                await self.send_json(send, 200, kept)
            return
        body = json.loads(raw)
        self.state.requests.append(body)
        response = self._response(body, f"resp_upstream{len(self.state.requests)}")
        if body.get("store", True):
            self.state.kept[response["id"]] = response
        if not body.get("stream"):
            await self.send_json(send, 200, response)
            return
        opening = {**response, "status": "in_progress", "output": [], "usage": None}
        opening.pop("prompt_cache_diagnostics", None)
        events = [
            {"type": "response.created", "sequence_number": 0, "response": opening},
            {"type": "response.output_text.delta", "sequence_number": 1, "item_id": "msg_1", "output_index": 0,
             "content_index": 0, "delta": "Hi there", "logprobs": []},
            {"type": "response.completed", "sequence_number": 2, "response": response},
        ]
        await self.send_events(send, [sse_event(event["type"], event) for event in events])

    def _response(self, body: dict[str, Any], response_id: str) -> dict[str, Any]:
        text = {"type": "output_text", "text": "Hi there", "annotations": [], "logprobs": []}
        message = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed", "content": [text]}
        response: dict[str, Any] = {
            "id": response_id,
            "object": "response",
            "created_at": 1,
            "status": "completed",
            "model": body["model"],
            "output": [message],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": body.get("tools") or [],
            "previous_response_id": body.get("previous_response_id"),
            "prompt_cache_key": body.get("prompt_cache_key"),
            "store": body.get("store", True),
            "usage": STUB_USAGE,
        }
        options = body.get("prompt_cache_options")
        comparison = options.get("comparison_response_id") if isinstance(options, dict) else None
        if comparison is not None:
            if comparison in self.state.kept:
                response["prompt_cache_diagnostics"] = {
                    "type": "cache_miss",
                    "reason": "tools_changed",
                    "cache_missed_tokens": STUB_MISSED_TOKENS,
                    "comparison_reusable_tokens": 512,
                }
            else:
                response["prompt_cache_diagnostics"] = {"type": "comparison_response_not_found"}
        return response
