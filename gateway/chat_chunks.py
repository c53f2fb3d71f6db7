"""Reading an upstream's streamed chat completion (OpenAI's server-sent events) chunk by chunk, for the endpoints that
translate it into another protocol (`gateway.anthropic`, `gateway.responses`).

Each event's `data:` lines are joined (the SSE rule for multi-line data) and decoded; the stream ends at `[DONE]` or
when the upstream closes. A chunk carrying an `error` object (how OpenAI-compatible servers fail mid-stream) is
returned as an `UpstreamStreamError` for the caller to end its own stream with.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

_DECODER = msgspec.json.Decoder()


@dataclass(frozen=True, slots=True)
class UpstreamStreamError:
    """An error chunk: its message and type (or code)."""

    message: str
    error_type: str


async def chat_chunks(upstream: httpx.Response) -> AsyncIterator[dict[str, Any] | UpstreamStreamError]:
    """The decoded chunks of a chat completion stream; an error chunk ends it. Undecodable events are skipped;
    `httpx.HTTPError` propagates."""
    data: list[str] = []
    async for line in upstream.aiter_lines():
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
            continue
        if line or not data:
            continue
        text, data = "\n".join(data), []
        if text == "[DONE]":
            return
        try:
            chunk = _DECODER.decode(text)
        except msgspec.DecodeError:
            continue
        if not isinstance(chunk, dict):
            continue
        failure = chunk.get("error")
        if isinstance(failure, dict):
            yield UpstreamStreamError(
                str(failure.get("message") or "The upstream failed mid-stream."),
                str(failure.get("type") or failure.get("code") or "upstream_error"),
            )
            return
        yield chunk
