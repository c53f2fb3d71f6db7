"""Responses requests to an upstream of kind `openai`: the normalized body goes to `POST {api_base}/responses`, and the
answer comes back as it came (status, body, events), with the gateway's request id added.

Read on the way (OpenAI's API reference, "Responses" and "Responses: streaming events"): the response's `id`,
`usage.input_tokens`, `usage.input_tokens_details.cached_tokens`, `usage.output_tokens` and `prompt_cache_diagnostics`,
from the body or, streamed, from the `response` of `response.completed` / `response.incomplete` / `response.failed`;
the first `response.output_text.delta` (or function-call arguments delta) sets the TTFT; an `error` event is
recorded as the outcome's error type. `on_answer` receives the final Response object.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import msgspec

from gateway.asgi_io import SSE_HEADERS, Send, send_response
from gateway.forwarding import map_transport_error, open_upstream, upstream_error_type
from gateway.passthrough_relay import EventStreamReader, relay_events, response_headers
from gateway.provider_diagnostics import from_openai
from gateway.recording import RequestTracker
from gateway.request_stages import Answered, Outcome
from gateway.upstreams.route import Route
from gateway.upstreams.base import UsageReport, _int_or_none

_DECODER = msgspec.json.Decoder()
_FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
_CONTENT_EVENTS = frozenset({"response.output_text.delta", "response.function_call_arguments.delta"})


def upstream_request(route: Route, path: str, method: str = "POST", payload: bytes = b"") -> httpx.Request:
    """A request to the upstream's Responses API (`{api_base}/{path}`) with its configured key."""
    url = f"{route.upstream.api_base}/{path}"
    return httpx.Request(method, url, headers=route.headers, content=payload, extensions=route.extensions)


def responses_usage(usage: Any) -> UsageReport:
    """A Responses `usage` object as a `UsageReport` (cached = `input_tokens_details.cached_tokens`)."""
    if not isinstance(usage, dict):
        return UsageReport()
    details = usage.get("input_tokens_details")
    cached = _int_or_none(details.get("cached_tokens")) if isinstance(details, dict) else None
    return UsageReport(_int_or_none(usage.get("input_tokens")), cached, _int_or_none(usage.get("output_tokens")))


def _answer(
    outcome: Outcome | None, response: dict[str, Any] | None, ttft_ms: float | None = None
) -> Answered:
    """The answered stage for `outcome` and the final Response object `response` (None: none came)."""
    if response is None:
        return Answered(outcome, ttft_ms=ttft_ms)
    usage = responses_usage(response.get("usage"))
    diagnosis = from_openai(response.get("prompt_cache_diagnostics"))
    return Answered(outcome, usage, ttft_ms=ttft_ms, provider_diagnosis=diagnosis)


async def forward_plain(
    client: httpx.AsyncClient,
    route: Route,
    payload: bytes,
    tracker: RequestTracker,
    send: Send,
    on_answer: Callable[[dict[str, Any]], None],
) -> Outcome:
    upstream = await open_upstream(client, route, upstream_request(route, "responses", payload=payload), tracker, False)
    body = upstream.content
    answer: Any = None
    if upstream.status_code >= 400:
        outcome = Outcome(upstream.status_code, upstream_error_type(body))
    else:
        try:
            answer = _DECODER.decode(body)
        except msgspec.DecodeError:
            answer = None
        outcome = Outcome(upstream.status_code)
    tracker.answered(_answer(outcome, answer if isinstance(answer, dict) else None))
    await send_response(send, upstream.status_code, body, response_headers(tracker, upstream))
    if isinstance(answer, dict):
        on_answer(answer)
    return outcome


class EventReader(EventStreamReader):
    """Reads the final response, the first content and errors out of Responses events as their bytes go by;
    `answer` makes the request's answered stage of them."""

    def __init__(self, start_perf: float) -> None:
        super().__init__()
        self._start_perf = start_perf
        self.final: dict[str, Any] | None = None
        self.ttft_ms: float | None = None  # the gateway's clock: the first content delta

    def answer(self, outcome: Outcome | None) -> Answered:
        return _answer(outcome, self.final, self.ttft_ms)

    @property
    def finished(self) -> bool:
        return self.final is not None

    def read_event(self, payload: dict[str, Any]) -> None:
        kind = payload.get("type")
        if kind in _CONTENT_EVENTS and self.ttft_ms is None:
            self.ttft_ms = (time.perf_counter() - self._start_perf) * 1000.0
        elif kind in _FINAL_EVENTS and isinstance(payload.get("response"), dict):
            self.final = payload["response"]
            if kind == "response.failed":
                error = self.final.get("error")
                self.error_type = str(error.get("code") or "response_failed") if isinstance(error, dict) else "failed"
        elif kind == "error":
            self.error_type = str(payload.get("code") or "upstream_error")


async def forward_stream(
    client: httpx.AsyncClient,
    route: Route,
    payload: bytes,
    tracker: RequestTracker,
    send: Send,
    start_perf: float,
    on_answer: Callable[[dict[str, Any]], None],
) -> Outcome:
    upstream = await open_upstream(client, route, upstream_request(route, "responses", payload=payload), tracker, True)
    try:
        if upstream.status_code >= 400:
            try:
                body = await upstream.aread()
            except httpx.HTTPError as exc:
                raise map_transport_error(exc, route) from None
            outcome = Outcome(upstream.status_code, upstream_error_type(body))
            tracker.answered(Answered(outcome))
            await send_response(send, upstream.status_code, body, response_headers(tracker, upstream))
            return outcome
        headers = SSE_HEADERS + response_headers(tracker, upstream)
        reader = EventReader(start_perf)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            outcome = await relay_events(upstream, reader, route, send, tracker)
        finally:
            if tracker.answer is None:  # cut off (client gone): what was learnt so far is recorded
                tracker.answered(reader.answer(None))
        if reader.final is not None:
            on_answer(reader.final)
        return outcome
    finally:
        await upstream.aclose()
