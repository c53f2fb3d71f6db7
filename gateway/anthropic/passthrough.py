"""Messages requests to an upstream of kind `anthropic`: the normalized body passes through unchanged otherwise.

The upstream's answer goes back as it came (status, body, events), with the gateway's request id added; usage is
read from Anthropic's fields (`input_tokens`, `cache_read_input_tokens`, `cache_creation_input_tokens`,
`output_tokens`; in a stream from `message_start` and then `message_delta`, whose counts are cumulative). The upstream
takes `x-api-key` (the upstream's configured key) and `anthropic-version` (the client's, else `DEFAULT_VERSION`).
The provider's cache diagnosis (`diagnostics`, in the message or in `message_start` / `message_delta` when streamed)
is recorded (`gateway.provider_diagnostics`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from gateway.anthropic.answer_capture import MessageAnswerCapture
from gateway.anthropic.errors import error_type_for_status
from gateway.anthropic.stream import error_event
from gateway.asgi_io import SSE_HEADERS, Send, send_response
from gateway.config import UpstreamConfig
from gateway.errors import GatewayError
from gateway.forwarding import map_transport_error, open_upstream
from gateway.passthrough_relay import EventStreamReader, relay_events, response_headers
from gateway import request_stages
from gateway.provider_diagnostics import Baselines, ProviderDiagnosis, from_anthropic
from gateway.recording import RequestTracker
from gateway.request_stages import Outcome
from gateway.upstreams.base import UsageReport
from gateway.upstreams.kinds import HEADER_MATCHED, HEADER_PROMPT, anthropic_usage
from gateway.telemetry.request_span import with_trace_context
from gateway.telemetry.response_facts import ResponseFacts
from gateway.upstreams.route import Route

DEFAULT_VERSION = "2023-06-01"
_DECODER = msgspec.json.Decoder()


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
class DiagnosisBaseline:
    """What to do with the upstream's message: read its cache diagnosis (`asked`: the request sent `diagnostics`) and
    keep its id as the tenant's latest on this prefix, the baseline of the next diagnosis."""

    baselines: Baselines
    tenant: str
    upstream: str
    prefix: str | None
    asked: bool

    def message(self, message: dict[str, Any]) -> ProviderDiagnosis | None:
        """The message's cache diagnosis (None: it has none); keeps its id as the next baseline."""
        if isinstance(message.get("id"), str):
            self.baselines.update(self.tenant, self.upstream, self.prefix, message["id"])
        return from_anthropic(message, self.asked)


def _usage(previous: UsageReport | None, usage: Any) -> tuple[UsageReport | None, int | None]:
    """The usage after one of Anthropic's usage objects (a `message_delta`'s counts are cumulative and may leave the
    prompt side out: then it is kept from `message_start`), and the cache writes it reports (None: not reported)."""
    report, writes = anthropic_usage(usage)
    if report.prompt_tokens is None and report.completion_tokens is None:
        return previous, None
    previous = previous or UsageReport()
    merged = UsageReport(
        prompt_tokens=report.prompt_tokens if report.prompt_tokens is not None else previous.prompt_tokens,
        cached_tokens=report.cached_tokens if report.prompt_tokens is not None else previous.cached_tokens,
        completion_tokens=report.completion_tokens,
    )
    return merged, writes


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
    return response_headers(tracker, upstream, (b"x-request-id", b"request-id"))


async def _open(
    client: httpx.AsyncClient, route: Route, request: httpx.Request, tracker: RequestTracker, stream: bool
) -> httpx.Response:
    return await open_upstream(client, route, with_trace_context(request, tracker.span), tracker, stream)


async def forward_plain(
    client: httpx.AsyncClient,
    route: Route,
    request: httpx.Request,
    tracker: RequestTracker,
    send: Send,
    baseline: DiagnosisBaseline | None = None,
) -> Outcome:
    upstream = await _open(client, route, request, tracker, stream=False)
    body = upstream.content
    usage = writes = diagnosis = None
    if upstream.status_code >= 400:
        outcome = Outcome(upstream.status_code, _error_type(body, upstream.status_code))
    else:
        try:
            decoded = _DECODER.decode(body)
        except msgspec.DecodeError:
            decoded = None
        if isinstance(decoded, dict):
            usage, writes = _usage(None, decoded.get("usage"))
            if tracker.span is not None:
                tracker.span.response.read_message(decoded.get("id"), decoded.get("model"), decoded.get("stop_reason"))
            if baseline is not None:
                diagnosis = baseline.message(decoded)
        outcome = Outcome(upstream.status_code)
    tracker.answered(
        request_stages.Answered(outcome, usage, cache_write_tokens=writes, provider_diagnosis=diagnosis)
    )
    headers = _headers(tracker, upstream)
    if usage is not None and usage.prompt_tokens is not None:
        # The match headers every gateway response carries, from the upstream's usage (it reports no miss kind).
        headers.append((HEADER_MATCHED.encode(), str(usage.cached_tokens or 0).encode()))
        headers.append((HEADER_PROMPT.encode(), str(usage.prompt_tokens).encode()))
    await send_response(send, upstream.status_code, body, headers)
    capture = getattr(tracker.explain, "answer", None)
    if outcome.status_code < 400 and isinstance(capture, MessageAnswerCapture):
        capture.add(body)
    return outcome


class EventReader(EventStreamReader):
    """Reads usage, the first content, the cache diagnosis and errors out of Anthropic events as their bytes go by;
    `answer` makes the request's answered stage of them."""

    def __init__(
        self, start_perf: float, baseline: DiagnosisBaseline | None = None, facts: ResponseFacts | None = None
    ) -> None:
        super().__init__()
        self._baseline = baseline
        self._facts = facts  # the request span's, when tracing
        self._start_perf = start_perf
        self.stopped = False
        self.usage: UsageReport | None = None
        self.cache_write_tokens: int | None = None
        self.ttft_ms: float | None = None  # the gateway's clock: the first content delta
        self.diagnosis: ProviderDiagnosis | None = None

    def answer(self, outcome: Outcome | None) -> request_stages.Answered:
        return request_stages.Answered(
            outcome,
            self.usage,
            ttft_ms=self.ttft_ms,
            cache_write_tokens=self.cache_write_tokens,
            provider_diagnosis=self.diagnosis,
        )

    def _read_usage(self, usage: Any) -> None:
        self.usage, writes = _usage(self.usage, usage)
        if writes is not None:
            self.cache_write_tokens = writes

    def _read_diagnosis(self, message: dict[str, Any]) -> None:
        diagnosis = self._baseline.message(message) if self._baseline is not None else None
        if diagnosis is not None:
            self.diagnosis = diagnosis

    @property
    def finished(self) -> bool:
        return self.stopped

    def broken_ending(self, error: GatewayError) -> bytes:
        return error_event(error.message, error_type_for_status(error.status_code))

    def read_event(self, payload: dict[str, Any]) -> None:
        kind = payload.get("type")
        if kind == "message_start" and isinstance(payload.get("message"), dict):
            message = payload["message"]
            self._read_usage(message.get("usage"))
            self._read_diagnosis(message)
            if self._facts is not None:
                self._facts.read_message(message.get("id"), message.get("model"), None)
        elif kind == "message_delta":
            self._read_usage(payload.get("usage"))
            delta = payload.get("delta")
            if self._facts is not None and isinstance(delta, dict):
                self._facts.read_message(None, None, delta.get("stop_reason"))
            if "diagnostics" in payload:
                self._read_diagnosis({"diagnostics": payload["diagnostics"]})
        elif kind == "content_block_delta" and self.ttft_ms is None:
            self.ttft_ms = (time.perf_counter() - self._start_perf) * 1000.0
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
    baseline: DiagnosisBaseline | None = None,
) -> Outcome:
    upstream = await _open(client, route, request, tracker, stream=True)
    try:
        if upstream.status_code >= 400:
            try:
                body = await upstream.aread()
            except httpx.HTTPError as exc:
                raise map_transport_error(exc, route) from None
            outcome = Outcome(upstream.status_code, _error_type(body, upstream.status_code))
            tracker.answered(request_stages.Answered(outcome))
            await send_response(send, upstream.status_code, body, _headers(tracker, upstream))
            return outcome
        reader = EventReader(start_perf, baseline, tracker.span.response if tracker.span is not None else None)
        try:
            await send(
                {"type": "http.response.start", "status": 200, "headers": SSE_HEADERS + _headers(tracker, upstream)}
            )
            return await relay_events(upstream, reader, route, send, tracker)
        finally:
            if tracker.answer is None:  # cut off (client gone): what was learnt so far is recorded
                tracker.answered(reader.answer(None))
    finally:
        await upstream.aclose()
