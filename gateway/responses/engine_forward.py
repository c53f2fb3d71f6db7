"""Responses requests to an upstream that speaks the chat API (the local engine, vLLM, SGLang).

The request was translated (`translate.to_chat_body`) and normalized as a chat request; the answer is translated back:
a Response for a plain request, the Responses event sequence for a streamed one. Usage reports the engine's prompt
and cached tokens (`input_tokens_details.cached_tokens`; from the match headers when the body has none). When the
response is complete, `Exchange.on_complete` receives it (to keep it for `previous_response_id` and `GET`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec

from gateway.asgi_io import JSON_CONTENT_TYPE, Send, send_response
from gateway.chat_relay import chat_completion, read_error_body, relay_chat_stream, stream_events
from gateway.forwarding import open_upstream, upstream_error_type
from gateway.parsing import CHAT
from gateway.recording import RequestTracker
from gateway.request_stages import Answered, Outcome
from gateway.responses.stream import EventWriter
from gateway.responses.translate import finish_status, output_items, response_object, usage_object
from gateway.retention import retention_header
from gateway.upstreams.route import Route
from gateway.upstreams.base import CacheReport, UsageReport

_DECODER = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()


@dataclass
class Exchange:
    """One Responses request on its way to a chat upstream."""

    client: httpx.AsyncClient
    route: Route
    body: dict[str, Any]  # the Responses body as the client sent it (echoed in the Response)
    payload: bytes  # the chat body as sent
    tracker: RequestTracker
    send: Send
    response_id: str
    start_perf: float
    retention: str | None
    on_complete: Callable[[dict[str, Any]], None]
    created_at: int = field(default_factory=lambda: int(time.time()))  # one time for every event of the response
    # What the answer says so far, for the request's answered stage (set once, when the answer ends).
    cache_report: CacheReport | None = field(default=None, init=False)
    recorded_usage: UsageReport | None = field(default=None, init=False)
    ttft_ms: float | None = field(default=None, init=False)

    def answered(self, outcome: Outcome | None) -> Outcome | None:
        """Set the request's answered stage from what the answer said (None: it was cut off before its end)."""
        self.tracker.answered(Answered(outcome, self.recorded_usage, self.cache_report, self.ttft_ms))
        return outcome

    def response(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None,
        incomplete_reason: str | None = None,
    ) -> dict[str, Any]:
        return response_object(
            self.body,
            self.response_id,
            status=status,
            output=output,
            usage=usage,
            incomplete_reason=incomplete_reason,
            created_at=self.created_at,
        )

    def headers(self, upstream: httpx.Response) -> list[tuple[bytes, bytes]]:
        headers = [(b"x-request-id", self.tracker.request_id.encode()), *retention_header(self.retention)]
        for name in self.route.adapter.passthrough_headers:
            value = upstream.headers.get(name)
            if value is not None:
                headers.append((name.encode(), value.encode("latin-1")))
        return headers

    def usage(self, usage: UsageReport) -> dict[str, Any]:
        """Responses `usage` for what the upstream reported (the match headers fill in what the body lacks); the
        record takes the same figures."""
        report = self.cache_report
        prompt = usage.prompt_tokens if usage.prompt_tokens is not None else (report and report.prompt_tokens)
        cached = usage.cached_tokens if usage.cached_tokens is not None else (report and report.matched_tokens)
        self.recorded_usage = usage
        return usage_object(int(prompt or 0), int(cached or 0), int(usage.completion_tokens or 0))

    async def open(self, *, stream: bool) -> httpx.Response:
        request = self.route.request(CHAT, self.payload)
        upstream = await open_upstream(self.client, self.route, request, self.tracker, stream)
        self.cache_report = self.route.adapter.cache_report(upstream.headers)
        return upstream

    async def relay_error(self, upstream: httpx.Response, headers: list[tuple[bytes, bytes]]) -> Outcome:
        """The chat upstream's error, OpenAI-shaped already, passed on with its status (naming the Responses field
        where the chat field has another name)."""
        body = responses_error(upstream.content)
        outcome = Outcome(upstream.status_code, upstream_error_type(body))
        self.answered(outcome)
        await send_response(self.send, upstream.status_code, body, [*headers, JSON_CONTENT_TYPE])
        return outcome


# Chat fields the translation renamed: an upstream's error naming one names the Responses field instead.
RESPONSES_PARAMS = {"response_format": "text.format", "max_tokens": "max_output_tokens"}
# A renamed chat field as a whole name in a message (not part of a longer name such as `max_tokens_x`).
_CHAT_FIELD_IN_TEXT = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, RESPONSES_PARAMS)) + r")(?!\w)")


def responses_error(body: bytes) -> bytes:
    """An OpenAI-shaped error body with the chat fields the translation renamed (`RESPONSES_PARAMS`) named as on the
    Responses API, in `error.param` (a sub-field such as `response_format.json_schema` keeps its tail) and in
    `error.message`; other bodies unchanged."""
    try:
        payload = _DECODER.decode(body)
    except msgspec.DecodeError:
        return body
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        return body
    renamed = dict(error)
    param, message = error.get("param"), error.get("message")
    if isinstance(param, str):
        head, dot, tail = param.partition(".")
        if head in RESPONSES_PARAMS:
            renamed["param"] = RESPONSES_PARAMS[head] + dot + tail
    if isinstance(message, str):
        renamed["message"] = _CHAT_FIELD_IN_TEXT.sub(lambda match: RESPONSES_PARAMS[match.group(1)], message)
    if renamed == error:
        return body
    assert isinstance(payload, dict)
    return _ENCODER.encode({**payload, "error": renamed})


async def forward_plain(exchange: Exchange) -> Outcome:
    upstream = await exchange.open(stream=False)
    headers = exchange.headers(upstream)
    if upstream.status_code >= 400:
        return await exchange.relay_error(upstream, headers)
    payload, choice = chat_completion(exchange, upstream)
    usage = exchange.usage(exchange.route.adapter.usage(payload))
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    status, reason = finish_status(choice.get("finish_reason"))
    response = exchange.response(status, output_items(message, status), usage, reason)
    outcome = Outcome(upstream.status_code)
    exchange.answered(outcome)
    await send_response(exchange.send, 200, _ENCODER.encode(response), [*headers, JSON_CONTENT_TYPE])
    exchange.on_complete(response)
    return outcome


async def forward_stream(exchange: Exchange) -> Outcome:
    upstream = await exchange.open(stream=True)
    try:
        headers = exchange.headers(upstream)
        if upstream.status_code >= 400:
            await read_error_body(exchange, upstream)
            return await exchange.relay_error(upstream, headers)
        writer = EventWriter(exchange.response)
        return await stream_events(exchange, headers, writer.start(), lambda: _pump(exchange, upstream, writer))
    finally:
        await upstream.aclose()


async def _pump(exchange: Exchange, upstream: httpx.Response, writer: EventWriter) -> Outcome:
    def error_ending(message: str, error_type: str, _status_code: int) -> bytes:
        return writer.fail(message, error_type)

    end = await relay_chat_stream(exchange, upstream, writer, error_ending)
    if end.failure is not None:
        return end.failure
    status, reason = finish_status(writer.finish_reason)
    closing, response = writer.finish(status, exchange.usage(end.usage or UsageReport()), reason)
    outcome = Outcome(upstream.status_code)
    exchange.answered(outcome)
    await exchange.send({"type": "http.response.body", "body": closing, "more_body": False})
    exchange.on_complete(response)
    return outcome
