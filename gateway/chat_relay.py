"""Relaying an upstream's streamed chat completion to a client that speaks another protocol (`gateway.anthropic`,
`gateway.responses`): one loop for both, the protocol's events written by the writer passed in.

Each chunk (`gateway.chat_chunks`) goes to the writer and what it writes goes to the client at once. On the way the
last usage chunk is kept, the engine's `prefix_cache` object on it goes to the explain context, and the TTFT is taken
when the writer first sees content. An error chunk or a broken transport (mapped as `map_transport_error` does) ends
the stream with the protocol's error event, and the answered stage is set before its last byte.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import msgspec

from gateway.asgi_io import SSE_HEADERS, Send
from gateway.chat_chunks import UpstreamStreamError, chat_chunks
from gateway.conversations.answer import ChunkCapture, MessageCapture
from gateway.errors import GatewayError
from gateway.forwarding import map_transport_error
from gateway.recording import RequestTracker
from gateway.request_stages import Outcome
from gateway.upstreams.base import UsageReport
from gateway.upstreams.route import Route

log = logging.getLogger(__name__)

_DECODER = msgspec.json.Decoder()


class ChatExchange(Protocol):
    """What the relay needs of an endpoint's exchange (both endpoints' `Exchange` dataclasses have it)."""

    route: Route
    tracker: RequestTracker
    send: Send
    start_perf: float  # `time.perf_counter()` when the request arrived
    ttft_ms: float | None  # set here, in milliseconds, on the first content

    def answered(self, outcome: Outcome | None) -> Outcome | None: ...


class ChunkWriter(Protocol):
    """Turns chat chunks into the client protocol's event bytes (`saw_content`: a chunk carried content)."""

    saw_content: bool

    def feed(self, chunk: dict[str, Any]) -> bytes: ...


class UpstreamBadAnswer(GatewayError):
    """The upstream answered 2xx with something that is not a chat completion."""

    status_code = 502
    error_type = "upstream_unavailable"


def chat_completion(exchange: ChatExchange, upstream: httpx.Response) -> tuple[dict[str, Any], dict[str, Any]]:
    """A 2xx plain answer's chat completion and its first choice; its `prefix_cache` object goes to the explain
    context. Raises `UpstreamBadAnswer` (502) when the body is not a chat completion with a choice."""
    try:
        payload = _DECODER.decode(upstream.content)
    except msgspec.DecodeError:
        payload = None
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise UpstreamBadAnswer(f"The upstream {exchange.route.name!r} answered without a chat completion.")
    assert isinstance(payload, dict)
    explain = exchange.tracker.explain
    if explain is not None:
        explain.answer = MessageCapture(choices[0].get("message"))
        if isinstance(payload.get("prefix_cache"), dict):
            explain.prefix_cache = payload["prefix_cache"]
    return payload, choices[0]


async def read_error_body(exchange: ChatExchange, upstream: httpx.Response) -> None:
    """Read a streamed error answer's body (for `upstream.content`); a transport failure raises the mapped error."""
    try:
        await upstream.aread()
    except httpx.HTTPError as exc:
        raise map_transport_error(exc, exchange.route) from None


async def stream_events(
    exchange: ChatExchange, headers: list[tuple[bytes, bytes]], opening: bytes, pump: Callable[[], Awaitable[Outcome]]
) -> Outcome:
    """Start the 200 event stream with `opening` and let `pump` relay the rest; a stream cut off before its end (the
    client gone) still records what was learnt so far."""
    try:
        await exchange.send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + headers})
        await exchange.send({"type": "http.response.body", "body": opening, "more_body": True})
        return await pump()
    finally:
        if exchange.tracker.answer is None:
            exchange.answered(None)


# The error ending: (message, error type, status code) -> the protocol's last event bytes.
ErrorEnding = Callable[[str, str, int], bytes]


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """How the relayed stream ended: the last usage the upstream reported (None: none), or `failure`, the outcome
    of a stream that failed (already answered and ended with the error event)."""

    usage: UsageReport | None
    failure: Outcome | None = None


async def relay_chat_stream(
    exchange: ChatExchange, upstream: httpx.Response, writer: ChunkWriter, error_ending: ErrorEnding
) -> StreamEnd:
    """Send the writer's events for each chunk of `upstream` (a 2xx chat stream) as it comes. On failure the
    recorded status is the upstream's for an error chunk, the mapped error's for a broken transport."""
    tracker = exchange.tracker
    adapter = exchange.route.adapter
    usage: UsageReport | None = None
    error: tuple[str, str, int] | None = None  # message, error type, recorded status
    capture = ChunkCapture() if tracker.explain is not None else None
    if tracker.explain is not None:
        tracker.explain.answer = capture
    try:
        async for chunk in chat_chunks(upstream):
            if isinstance(chunk, UpstreamStreamError):
                error = (chunk.message, chunk.error_type, upstream.status_code)
                break
            if adapter.has_usage(chunk):
                usage = adapter.usage(chunk)
                if tracker.explain is not None and isinstance(chunk.get("prefix_cache"), dict):
                    tracker.explain.prefix_cache = chunk["prefix_cache"]
            out = writer.feed(chunk)
            if exchange.ttft_ms is None and writer.saw_content:
                exchange.ttft_ms = (time.perf_counter() - exchange.start_perf) * 1000.0
            if out:
                await exchange.send({"type": "http.response.body", "body": out, "more_body": True})
            if capture is not None:
                capture.add(chunk)  # after its bytes went out
    except httpx.HTTPError as exc:
        failure = map_transport_error(exc, exchange.route)
        log.warning("upstream stream from %s broke: %s", exchange.route.name, failure.message)
        error = (failure.message, failure.error_type, failure.status_code)
    if error is None:
        return StreamEnd(usage)
    message, error_type, status_code = error
    outcome = Outcome(status_code, error_type)
    exchange.answered(outcome)
    body = error_ending(message, error_type, status_code)
    await exchange.send({"type": "http.response.body", "body": body, "more_body": False})
    return StreamEnd(usage, outcome)
