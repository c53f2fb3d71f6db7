"""Calling the upstream: one plain request/response, or a streamed response relayed chunk by chunk.

Both functions send the client's response themselves and return the outcome `(status_code, error_type)` for
the record. Before anything was sent to the client they raise `GatewayError`s (the caller answers with an
OpenAI-shaped error); once a stream has started, failures end the stream with an error event instead.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import httpx
import msgspec

from gateway.asgi_io import JSON_CONTENT_TYPE, SSE_HEADERS, Send, send_response
from gateway.conversations.answer import PlainCapture, StreamCapture
from gateway.errors import GatewayError, UpstreamTimeout, UpstreamUnavailable
from gateway.explain.chains import body_without_hash_chain
from gateway.recording import RequestTracker
from gateway.request_stages import Answered, Outcome
from gateway.retention import retention_header
from gateway.sse import SSERelay
from gateway.telemetry.request_span import with_trace_context
from gateway.upstreams.base import CacheReport
from gateway.upstreams.route import Route

log = logging.getLogger(__name__)


class _Envelope(msgspec.Struct):
    """The parts of a response body the gateway reads; the rest is skipped by the decoder, and `choices` is kept
    undecoded (read only for a traced request's finish reasons)."""

    usage: dict[str, Any] | None = None
    meta_info: dict[str, Any] | None = None
    prefix_cache: dict[str, Any] | None = None
    error: Any = None
    # For the request's span: the response id and model, and each choice's finish reason.
    id: Any = None
    model: Any = None
    choices: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


_ENVELOPE = msgspec.json.Decoder(_Envelope)


def map_transport_error(exc: httpx.HTTPError, route: Route) -> GatewayError:
    """httpx failures -> 504 for timeouts, 502 for everything else (refused, reset, protocol errors)."""
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout(f"The upstream {route.name!r} did not answer in time ({type(exc).__name__}).")
    return UpstreamUnavailable(f"The upstream {route.name!r} is unavailable: {type(exc).__name__}: {exc}")


async def open_upstream(
    client: httpx.AsyncClient, route: Route, request: httpx.Request, tracker: RequestTracker, stream: bool
) -> httpx.Response:
    """Send `request` (first telling the tracker it goes upstream); the upstream's status goes to the explain
    context. A transport failure raises the mapped `GatewayError` (`map_transport_error`)."""
    tracker.sending_upstream()
    try:
        upstream = await client.send(request, stream=stream)
    except httpx.HTTPError as exc:
        raise map_transport_error(exc, route) from None
    if tracker.explain is not None:
        tracker.explain.upstream_status = upstream.status_code
    return upstream


def header_map(headers: httpx.Headers) -> dict[str, str]:
    """`headers` as a dict under lower-case names, a repeated header's values joined with ", " as `headers.get`
    joins them: one pass over the list, where each `httpx.Headers.get` scans it all again."""
    found: dict[str, str] = {}
    for name, value in headers.multi_items():
        found[name] = value if name not in found else f"{found[name]}, {value}"
    return found


def _response_headers(route: Route, upstream: Mapping[str, str], tracker: RequestTracker) -> list[tuple[bytes, bytes]]:
    """The request id, the retention class the gateway applied, and the upstream's match headers (`upstream`: the
    response's `header_map`)."""
    headers = [(b"x-request-id", tracker.request_id.encode()), *retention_header(tracker.retention_class)]
    for name in route.adapter.passthrough_headers:
        value = upstream.get(name)
        if value is not None:
            headers.append((name.encode(), value.encode("latin-1")))
    return headers


def _decode_envelope(body: bytes) -> _Envelope | None:
    try:
        return _ENVELOPE.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def upstream_error_type(body: bytes) -> str:
    """The `error.type` (or code) of an upstream error body, else a generic label."""
    envelope = _decode_envelope(body)
    if envelope is not None and isinstance(envelope.error, dict):
        value = envelope.error.get("type") or envelope.error.get("code")
        if value:
            return str(value)
    return "upstream_error"


async def _relay_upstream_error(
    send: Send,
    upstream: httpx.Response,
    headers: list[tuple[bytes, bytes]],
    tracker: RequestTracker,
    cache_report: CacheReport,
) -> Outcome:
    """Pass an upstream error status and body through unchanged."""
    body = upstream.content
    content_type = upstream.headers.get("content-type", "application/json").encode("latin-1")
    outcome = Outcome(upstream.status_code, upstream_error_type(body))
    tracker.answered(Answered(outcome, cache_report=cache_report))
    await send_response(send, upstream.status_code, body, [*headers, (b"content-type", content_type)])
    return outcome


def _match_report(
    tracker: RequestTracker, route: Route, upstream: httpx.Response, headers: Mapping[str, str]
) -> CacheReport:
    """What the response headers (`headers`: its `header_map`) say: the match report, and (for the explanation) that
    the upstream answered."""
    if tracker.explain is not None:
        tracker.explain.upstream_status = upstream.status_code
    return route.adapter.cache_report(headers)


async def forward_plain(
    client: httpx.AsyncClient, route: Route, endpoint: str, payload: bytes, tracker: RequestTracker, send: Send
) -> Outcome:
    tracker.sending_upstream()
    try:
        upstream = await client.send(with_trace_context(route.request(endpoint, payload), tracker.span))
    except httpx.HTTPError as exc:
        raise map_transport_error(exc, route) from None
    received = header_map(upstream.headers)
    headers = _response_headers(route, received, tracker)
    cache_report = _match_report(tracker, route, upstream, received)
    if upstream.status_code >= 400:
        return await _relay_upstream_error(send, upstream, headers, tracker, cache_report)
    body = upstream.content
    envelope = _decode_envelope(body)
    usage = None
    if envelope is not None:
        usage = route.adapter.usage(
            {"usage": envelope.usage, "meta_info": envelope.meta_info, "prefix_cache": envelope.prefix_cache}
        )
        if tracker.span is not None:
            tracker.span.response.read_body(envelope.id, envelope.model, envelope.choices)
        explain = tracker.explain
        if explain is not None and isinstance(envelope.prefix_cache, dict):
            explain.prefix_cache = envelope.prefix_cache
            if not explain.client_wants_chain and "hash_chain" in envelope.prefix_cache:
                body = body_without_hash_chain(body)
    outcome = Outcome(upstream.status_code)
    tracker.answered(Answered(outcome, usage=usage, cache_report=cache_report))
    content_type = received.get("content-type")
    type_header = (b"content-type", content_type.encode("latin-1")) if content_type else JSON_CONTENT_TYPE
    await send_response(send, upstream.status_code, body, [*headers, type_header])
    if tracker.explain is not None:
        tracker.explain.answer = PlainCapture(body)  # decoded once the request is finished
    return outcome


async def forward_stream(
    client: httpx.AsyncClient,
    route: Route,
    endpoint: str,
    payload: bytes,
    tracker: RequestTracker,
    send: Send,
    *,
    client_wants_usage: bool,
    start_perf: float,
) -> Outcome:
    tracker.sending_upstream()
    try:
        upstream = await client.send(with_trace_context(route.request(endpoint, payload), tracker.span), stream=True)
    except httpx.HTTPError as exc:
        raise map_transport_error(exc, route) from None
    try:
        received = header_map(upstream.headers)
        headers = _response_headers(route, received, tracker)
        cache_report = _match_report(tracker, route, upstream, received)
        if upstream.status_code >= 400:
            try:
                await upstream.aread()
            except httpx.HTTPError as exc:
                raise map_transport_error(exc, route) from None
            return await _relay_upstream_error(send, upstream, headers, tracker, cache_report)
        explain = tracker.explain
        relay = SSERelay(
            route.adapter,
            forward_usage=client_wants_usage,
            start_perf=start_perf,
            forward_hash_chain=explain is None or explain.client_wants_chain,
        )
        try:
            await send(
                {"type": "http.response.start", "status": upstream.status_code, "headers": SSE_HEADERS + headers}
            )
            capture = StreamCapture() if explain is not None else None
            if explain is not None:
                explain.answer = capture
            return await _pump(upstream, relay, send, route, tracker, cache_report, capture)
        finally:
            # Also on cancellation (client gone): whatever was learnt so far goes into the record.
            if tracker.answer is None:
                tracker.answered(Answered(None, relay.usage, cache_report, relay.ttft_ms))
            if tracker.span is not None:
                relay.response.copy_to(tracker.span.response)
            if explain is not None:
                explain.prefix_cache = relay.prefix_cache
    finally:
        await upstream.aclose()


async def _pump(
    upstream: httpx.Response,
    relay: SSERelay,
    send: Send,
    route: Route,
    tracker: RequestTracker,
    cache_report: CacheReport,
    capture: StreamCapture | None,
) -> Outcome:
    """Relay the stream. The client's response ends as soon as `[DONE]` has gone out (what follows upstream is
    only the end of the chunked body, read so the connection can be reused). After the first byte went out,
    upstream failures become a final SSE error event. The answered stage is set just before the last byte goes
    out. The bytes sent go to `capture` (when given) after they went out."""

    def answered(outcome: Outcome) -> Outcome:
        tracker.answered(Answered(outcome, relay.usage, cache_report, relay.ttft_ms))
        return outcome

    finished = False
    outcome: Outcome | None = None
    try:
        async for chunk in upstream.aiter_raw():
            if finished:
                continue
            out = relay.feed(chunk)
            if relay.saw_done:
                finished = True
                outcome = answered(Outcome(upstream.status_code, relay.error_type))
                tail = out + relay.flush()
                await send({"type": "http.response.body", "body": tail, "more_body": False})
                if capture is not None:
                    capture.add(tail)
            elif out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
                if capture is not None:
                    capture.add(out)
    except httpx.HTTPError as exc:
        if outcome is not None:
            return outcome
        error = map_transport_error(exc, route)
        log.warning("upstream stream from %s broke: %s", route.name, error.message)
        outcome = answered(Outcome(error.status_code, error.error_type))
        tail = relay.flush() + b"data: " + error.body() + b"\n\n"
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        return outcome
    if outcome is None:
        outcome = answered(Outcome(upstream.status_code, relay.error_type))
        await send({"type": "http.response.body", "body": relay.flush(), "more_body": False})
    return outcome
