"""Engine results to OpenAI response bodies and server-sent-event chunks."""

from __future__ import annotations

import json
import time
import uuid

from local_engine.hash_chain import page_hash_chain
from local_engine.engine.types import Finished
from local_engine.api.match_details import MatchDetails
from local_engine.api.protocol import CHAT, ParsedRequest
from local_engine.prompt.tool_calls import ToolCall, ToolCallStream, format_for


def tool_call_stream(parsed: ParsedRequest, tokenizer) -> ToolCallStream | None:
    """The splitter of content and tool calls for this request, or None when tool calls are not parsed
    (completions, no tools, or `tool_choice: "none"`)."""
    if parsed.endpoint != CHAT or parsed.tool_choice.mode == "none":
        return None
    return ToolCallStream(format_for(tokenizer), parsed.tool_opening, parsed.tool_choice.function)


def _finish_reason(finished: Finished, calls: list[ToolCall]) -> str:
    """`tool_calls` when the answer's calls are whole; `length` when `max_tokens` cut one short (as in OpenAI's
    API), so a client can tell that its arguments may be incomplete."""
    if not calls or finished.finish_reason not in ("stop", "length"):
        return finished.finish_reason
    return "tool_calls" if finished.finish_reason == "stop" or all(call.complete for call in calls) else "length"


def new_response_id(endpoint: str) -> str:
    return ("chatcmpl-" if endpoint == CHAT else "cmpl-") + uuid.uuid4().hex


def match_headers(report: MatchDetails) -> dict[str, str]:
    """Sent on every response, streamed or not: the match is known before the first token."""
    return report.headers()


def prefix_cache_object(parsed: ParsedRequest, report: MatchDetails, finished: Finished | None = None) -> dict:
    """The match report with the engine's time to first token, plus the prompt's block hash chain when asked."""
    body = report.as_dict(None if finished is None else finished.timings.ttft_ms)
    if parsed.hash_chain_block_size:
        body["hash_chain"] = hash_chain_object(parsed.namespace, parsed.prompt_token_ids, parsed.hash_chain_block_size)
    return body


def hash_chain_object(namespace: str, token_ids, block_size: int) -> dict:
    return {
        "block_size": block_size,
        "input_length": len(token_ids),
        "hash_ids": page_hash_chain(namespace, token_ids, block_size),
    }


def usage(finished: Finished) -> dict:
    return {
        "prompt_tokens": finished.prompt_tokens,
        "completion_tokens": finished.completion_tokens,
        "total_tokens": finished.prompt_tokens + finished.completion_tokens,
        # Always present: 0 means "nothing matched", never "unknown".
        "prompt_tokens_details": {"cached_tokens": finished.cached_tokens},
    }


def completion_body(
    parsed: ParsedRequest,
    response_id: str,
    text: str,
    finished: Finished,
    report: MatchDetails,
    tools: ToolCallStream | None = None,
) -> dict:
    if parsed.endpoint == CHAT:
        message: dict = {"role": "assistant", "content": text}
        calls: list[ToolCall] = []
        if tools is not None:
            content, calls = tools.feed(text)
            rest, more = tools.finish()
            calls += more
            content += rest
            message["content"] = content if content or not calls else None
            if calls:
                message["tool_calls"] = [call.as_openai() for call in calls]
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": _finish_reason(finished, calls),
        }
        object_name = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finished.finish_reason}
        object_name = "text_completion"
    if finished.matched_stop is not None:
        choice["stop_reason"] = finished.matched_stop  # which stop string matched, named as vLLM does
    return {
        "id": response_id,
        "object": object_name,
        "created": int(time.time()),
        "model": parsed.model,
        "choices": [choice],
        "usage": usage(finished),
        "prefix_cache": prefix_cache_object(parsed, report, finished),
        "system_fingerprint": None,
    }


class ChunkWriter:
    """Builds the SSE byte strings of one streamed response, shaped as OpenAI sends them."""

    def __init__(self, parsed: ParsedRequest, response_id: str, tools: ToolCallStream | None = None) -> None:
        self.parsed = parsed
        self.tools = tools
        self.response_id = response_id
        self.created = int(time.time())
        self.is_chat = parsed.endpoint == CHAT

    def _chunk(self, choices: list, **extra) -> bytes:
        body = {
            "id": self.response_id,
            "object": "chat.completion.chunk" if self.is_chat else "text_completion",
            "created": self.created,
            "model": self.parsed.model,
            "choices": choices,
            "system_fingerprint": None,
        }
        if self.parsed.include_usage:
            body["usage"] = None
        body.update(extra)
        return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"

    def _choice(self, text: str | None, finish_reason: str | None, role: bool = False) -> dict:
        if self.is_chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text is not None else {})
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}

    def first(self) -> bytes | None:
        """Chat streams open with the assistant role, as OpenAI's do."""
        return self._chunk([self._choice(None, None, role=True)]) if self.is_chat else None

    def text(self, text: str) -> bytes:
        """The chunk(s) for newly generated text; empty while text that may open a tool call is held back."""
        if self.tools is None:
            return self._chunk([self._choice(text, None)])
        return self._content_and_calls(*self.tools.feed(text))

    def _content_and_calls(self, content: str, calls: list[ToolCall]) -> bytes:
        out = self._chunk([self._choice(content, None)]) if content else b""
        first_index = len(self.tools.calls) - len(calls)  # calls are numbered across the whole answer
        for offset, call in enumerate(calls):
            delta = {"tool_calls": [call.as_openai(first_index + offset)]}
            out += self._chunk([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}])
        return out

    def final(self, finished: Finished) -> bytes:
        reason = finished.finish_reason
        out = b""
        if self.tools is not None:
            out = self._content_and_calls(*self.tools.finish())
            reason = _finish_reason(finished, self.tools.calls)
        choice = self._choice(None if self.is_chat else "", reason)
        if finished.matched_stop is not None:
            choice["stop_reason"] = finished.matched_stop
        return out + self._chunk([choice])

    def usage(self, finished: Finished, report: MatchDetails) -> bytes:
        """The closing usage chunk also carries the `prefix_cache` object a non-streamed body would have."""
        return self._chunk([], usage=usage(finished), prefix_cache=prefix_cache_object(self.parsed, report, finished))

    def error(self, body: dict) -> bytes:
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"
