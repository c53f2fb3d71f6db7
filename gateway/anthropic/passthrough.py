"""Messages requests to an upstream of kind `anthropic`: the normalized body passes through unchanged otherwise.

The upstream's answer goes back as it came (status, body, events), with the gateway's request id added; usage is
read from Anthropic's fields (`input_tokens`, `cache_read_input_tokens`, `cache_creation_input_tokens`,
`output_tokens`; in a stream from `message_start` and then `message_delta`, whose counts are cumulative). The upstream
takes `x-api-key` (the upstream's configured key) and `anthropic-version` (the client's, else `DEFAULT_VERSION`).
The provider's cache diagnosis (`diagnostics`, in the message or in `message_start` / `message_delta` when streamed)
is recorded (`gateway.provider_diagnostics`).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from gateway.anthropic.errors import error_type_for_status
from gateway.anthropic.stream import error_event
from gateway.asgi_io import Send, send_response
from gateway.config import UpstreamConfig
from gateway.forwarding import map_transport_error
from gateway.provider_diagnostics import Baselines, from_anthropic
from gateway.recording import Outcome, RequestTracker
from gateway.upstreams.base import UsageReport
from gateway.upstreams.kinds import HEADER_MATCHED, HEADER_PROMPT, anthropic_usage
from gateway.telemetry.request_span import with_trace_context
from gateway.upstreams.route import Route

log = logging.getLogger(__name__)

DEFAULT_VERSION = "2023-06-01"
_DECODER = msgspec.json.Decoder()
_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n")
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def upstream_headers(upstream: UpstreamConfig, version: str | None, beta: str | None) -> dict[str, str]:
    headers = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "accept-encoding": "identity",
        "anthropic-version": version or DEFAULT_VERSION,
    }
    if beta:
        headers["anthropic-beta"] = beta
    if upstream.api_key:
        headers["x-api-key"] = upstream.api_key
    return headers


def upstream_request(route: Route, path: str, payload: bytes, headers: dict[str, str]) -> httpx.Request:
    url = f"{route.upstream.api_base}/{path}"
    return httpx.Request("POST", url, headers=headers, content=payload, extensions=route.extensions)


@dataclass(frozen=True, slots=True)
class Answered:
    """What to do with the upstream's message: read its cache diagnosis (`asked`: the request sent `diagnostics`) and
    keep its id as the tenant's latest on this prefix, the baseline of the next diagnosis."""

    baselines: Baselines
    tenant: str
    upstream: str
    prefix: str | None
    asked: bool

    def message(self, tracker: RequestTracker, message: dict[str, Any]) -> None:
        diagnosis = from_anthropic(message, self.asked)
        if diagnosis is not None:
            tracker.provider_diagnosis = diagnosis
        if isinstance(message.get("id"), str):
            self.baselines.update(self.tenant, self.upstream, self.prefix, message["id"])


def _record_usage(tracker: RequestTracker, usage: Any) -> None:
    report, writes = anthropic_usage(usage)
    if report.prompt_tokens is None and report.completion_tokens is None:
        return
    previous = tracker.usage or UsageReport()
    tracker.usage = UsageReport(
        prompt_tokens=report.prompt_tokens if report.prompt_tokens is not None else previous.prompt_tokens,
        cached_tokens=report.cached_tokens if report.prompt_tokens is not None else previous.cached_tokens,
        completion_tokens=report.completion_tokens,
    )
    if writes is not None:
        tracker.cache_write_tokens = writes


def _error_type(body: bytes, status_code: int) -> str:
    try:
        decoded = _DECODER.decode(body)
    except msgspec.DecodeError:
        return error_type_for_status(status_code)
    error = decoded.get("error") if isinstance(decoded, dict) else None
    if isinstance(error, dict) and isinstance(error.get("type"), str):
        return error["type"]
    return error_type_for_status(status_code)


def _headers(tracker: RequestTracker, upstream: httpx.Response) -> list[tuple[bytes, bytes]]:
    request_id = tracker.request_id.encode()
    headers = [(b"x-request-id", request_id), (b"request-id", request_id)]
    content_type = upstream.headers.get("content-type")
    if content_type and not content_type.startswith("text/event-stream"):
        headers.append((b"content-type", content_type.encode("latin-1")))
    return headers


async def _open(
    client: httpx.AsyncClient, route: Route, request: httpx.Request, tracker: RequestTracker, stream: bool
) -> httpx.Response:
    tracker.sending_upstream()
    try:
        upstream = await client.send(with_trace_context(request, tracker.span), stream=stream)
    except httpx.HTTPError as exc:
        raise map_transport_error(exc, route) from None
    if tracker.explain is not None:
        tracker.explain.upstream_status = upstream.status_code
    return upstream


async def forward_plain(
    client: httpx.AsyncClient,
    route: Route,
    request: httpx.Request,
    tracker: RequestTracker,
    send: Send,
    answered: Answered | None = None,
) -> Outcome:
    upstream = await _open(client, route, request, tracker, stream=False)
    body = upstream.content
    if upstream.status_code >= 400:
        outcome = tracker.outcome = Outcome(upstream.status_code, _error_type(body, upstream.status_code))
    else:
        try:
            decoded = _DECODER.decode(body)
        except msgspec.DecodeError:
            decoded = None
        if isinstance(decoded, dict):
            _record_usage(tracker, decoded.get("usage"))
            if answered is not None:
                answered.message(tracker, decoded)
        outcome = tracker.outcome = Outcome(upstream.status_code)
    headers = _headers(tracker, upstream)
    usage = tracker.usage
    if usage is not None and usage.prompt_tokens is not None:
        # The match headers every gateway response carries, from the upstream's usage (it reports no miss kind).
        headers.append((HEADER_MATCHED.encode(), str(usage.cached_tokens or 0).encode()))
        headers.append((HEADER_PROMPT.encode(), str(usage.prompt_tokens).encode()))
    await send_response(send, upstream.status_code, body, headers)
    return outcome


class EventReader:
    """Reads usage, the first content and errors out of Anthropic events as their bytes go by."""

    def __init__(self, tracker: RequestTracker, start_perf: float, answered: Answered | None = None) -> None:
        self._tracker = tracker
        self._answered = answered
        self._start_perf = start_perf
        self._buffer = b""
        self.error_type: str | None = None
        self.stopped = False

    def feed(self, chunk: bytes) -> None:
        data = self._buffer + chunk
        position = 0
        for match in _BOUNDARY.finditer(data):
            self._event(data[position : match.start()])
            position = match.end()
        self._buffer = data[position:]

    def _event(self, event: bytes) -> None:
        lines = [line[5:].strip() for line in event.splitlines() if line.startswith(b"data:")]
        if not lines:
            return
        try:
            payload = _DECODER.decode(b"\n".join(lines))
        except msgspec.DecodeError:
            return
        if not isinstance(payload, dict):
            return
        kind = payload.get("type")
        if kind == "message_start" and isinstance(payload.get("message"), dict):
            _record_usage(self._tracker, payload["message"].get("usage"))
            if self._answered is not None:
                self._answered.message(self._tracker, payload["message"])
        elif kind == "message_delta":
            _record_usage(self._tracker, payload.get("usage"))
            if self._answered is not None and "diagnostics" in payload:
                self._answered.message(self._tracker, {"diagnostics": payload["diagnostics"]})
        elif kind == "content_block_delta" and self._tracker.ttft_ms is None:
            self._tracker.ttft_ms = (time.perf_counter() - self._start_perf) * 1000.0
        elif kind == "error":
            error = payload.get("error")
            self.error_type = str(error.get("type")) if isinstance(error, dict) else "api_error"
        elif kind == "message_stop":
            self.stopped = True


async def forward_stream(
    client: httpx.AsyncClient,
    route: Route,
    request: httpx.Request,
    tracker: RequestTracker,
    send: Send,
    start_perf: float,
    answered: Answered | None = None,
) -> Outcome:
    upstream = await _open(client, route, request, tracker, stream=True)
    try:
        if upstream.status_code >= 400:
            try:
                body = await upstream.aread()
            except httpx.HTTPError as exc:
                raise map_transport_error(exc, route) from None
            outcome = tracker.outcome = Outcome(upstream.status_code, _error_type(body, upstream.status_code))
            await send_response(send, upstream.status_code, body, _headers(tracker, upstream))
            return outcome
        await send(
            {"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS + _headers(tracker, upstream)}
        )
        reader = EventReader(tracker, start_perf, answered)
        try:
            async for chunk in upstream.aiter_raw():
                reader.feed(chunk)
                if reader.stopped or reader.error_type is not None:
                    tracker.outcome = Outcome(upstream.status_code, reader.error_type)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError as exc:
            error = map_transport_error(exc, route)
            log.warning("upstream stream from %s broke: %s", route.name, error.message)
            if tracker.outcome is None:
                tracker.outcome = Outcome(error.status_code, error.error_type)
                tail = error_event(error.message, error_type_for_status(error.status_code))
                await send({"type": "http.response.body", "body": tail, "more_body": False})
                return tracker.outcome
        if tracker.outcome is None:
            tracker.outcome = Outcome(upstream.status_code, reader.error_type)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return tracker.outcome
    finally:
        await upstream.aclose()
