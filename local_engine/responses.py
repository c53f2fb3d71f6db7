"""Engine results to OpenAI response bodies and server-sent-event chunks."""

from __future__ import annotations

import json
import time
import uuid

from local_engine.cache.hash_chain import page_hash_chain
from local_engine.engine_types import Finished, MatchReport
from local_engine.protocol import CHAT, ParsedRequest


def new_response_id(endpoint: str) -> str:
    return ("chatcmpl-" if endpoint == CHAT else "cmpl-") + uuid.uuid4().hex


def match_headers(report: MatchReport) -> dict[str, str]:
    """Sent on every response, streamed or not: the match is known before the first token."""
    return {
        "x-prefix-cache-matched-tokens": str(report.matched_tokens),
        "x-prefix-cache-prompt-tokens": str(report.prompt_tokens),
        "x-prefix-cache-miss": report.miss_kind.value,
    }


def prefix_cache_object(parsed: ParsedRequest, report: MatchReport) -> dict:
    """The match report, plus the prompt's block hash chain when the client asked for it."""
    body = report.as_dict()
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
    parsed: ParsedRequest, response_id: str, text: str, finished: Finished, report: MatchReport
) -> dict:
    if parsed.endpoint == CHAT:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finished.finish_reason,
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
        "prefix_cache": prefix_cache_object(parsed, report),
        "system_fingerprint": None,
    }


class ChunkWriter:
    """Builds the SSE byte strings of one streamed response, shaped as OpenAI sends them."""

    def __init__(self, parsed: ParsedRequest, response_id: str) -> None:
        self.parsed = parsed
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
        return self._chunk([self._choice(text, None)])

    def final(self, finished: Finished) -> bytes:
        choice = self._choice(None if self.is_chat else "", finished.finish_reason)
        if finished.matched_stop is not None:
            choice["stop_reason"] = finished.matched_stop
        return self._chunk([choice])

    def usage(self, finished: Finished, report: MatchReport) -> bytes:
        """The closing usage chunk also carries the `prefix_cache` object a non-streamed body would have."""
        return self._chunk([], usage=usage(finished), prefix_cache=prefix_cache_object(self.parsed, report))

    def error(self, body: dict) -> bytes:
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"
