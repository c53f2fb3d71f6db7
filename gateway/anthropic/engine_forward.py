"""Messages requests to an upstream that speaks the OpenAI chat API (the local engine, vLLM, SGLang, OpenAI).

The request was translated (`translate.to_chat_body`); the answer is translated back: a Message for a plain request,
Anthropic's event sequence for a streamed one. Prompt-side usage is split as Anthropic reports it
(`accounting.split_usage`) from the engine's prompt and matched tokens and the breakpoint positions measured while
the upstream worked (`positions`). Without positions (an upstream without a dry-run match, or a failed one), cache
reads are the upstream's cached tokens and writes are 0; without breakpoints nothing is reported as cached.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field, replace
from typing import Any

import httpx
import msgspec

from gateway.anthropic.accounting import CachePoint, CacheUsage, no_cache, split_usage
from gateway.anthropic.errors import error_type_for_status, translate_upstream_error
from gateway.anthropic.positions import DryRunFailed
from gateway.anthropic.request import MessagesRequest
from gateway.anthropic.stream import ChunkTranslator, error_event, message_start
from gateway.anthropic.translate import matched_stop_of, message_content, stop_reason
from gateway.asgi_io import JSON_CONTENT_TYPE, Send, send_response
from gateway.chat_relay import chat_completion, read_error_body, relay_chat_stream, stream_events
from gateway.forwarding import open_upstream, upstream_error_type
from gateway.parsing import CHAT
from gateway.recording import RequestTracker
from gateway.request_stages import Answered, Outcome
from gateway.retention import retention_header
from gateway.upstreams.base import CacheReport, UsageReport
from gateway.upstreams.route import Route
from gateway.upstreams.tiers import first_tokens
from gateway.telemetry.request_span import with_trace_context

log = logging.getLogger(__name__)

_ENCODER = msgspec.json.Encoder()


@dataclass
class Exchange:
    """One Messages request on its way to a chat upstream."""

    client: httpx.AsyncClient
    route: Route
    request: MessagesRequest
    payload: bytes  # the chat body as sent
    tracker: RequestTracker
    send: Send
    message_id: str
    min_cacheable_tokens: int
    positions: asyncio.Task[list[CachePoint]] | None
    start_perf: float
    retention: str | None = None  # the retention class sent upstream (`gateway.retention`), if any
    # What the answer says so far, for the request's answered stage (set once, when the answer ends).
    cache_report: CacheReport | None = field(default=None, init=False)
    usage: UsageReport | None = field(default=None, init=False)  # as recorded: Anthropic's split of the prompt
    cache_write_tokens: int | None = field(default=None, init=False)
    ttft_ms: float | None = field(default=None, init=False)

    def answered(self, outcome: Outcome | None) -> Outcome | None:
        """Set the request's answered stage from what the answer said (None: it was cut off before its end)."""
        self.tracker.answered(
            Answered(outcome, self.usage, self.cache_report, self.ttft_ms, cache_write_tokens=self.cache_write_tokens)
        )
        return outcome

    def response_headers(self, upstream: httpx.Response) -> list[tuple[bytes, bytes]]:
        request_id = self.tracker.request_id.encode()
        headers = [(b"x-request-id", request_id), (b"request-id", request_id), *retention_header(self.retention)]
        for name in self.route.adapter.passthrough_headers:
            value = upstream.headers.get(name)
            if value is not None:
                headers.append((name.encode(), value.encode("latin-1")))
        return headers

    async def points(self) -> list[CachePoint] | None:
        if self.positions is None:
            return None
        try:
            return await self.positions
        except DryRunFailed as exc:
            log.warning("could not measure cache breakpoint positions: %s", exc)
        except Exception:  # the usage report falls back; the answer must not fail because of it
            log.exception("could not measure cache breakpoint positions")
        return None

    def cache_usage(self, usage: UsageReport, points: list[CachePoint] | None) -> CacheUsage:
        """Anthropic's prompt-side usage for what the upstream reported; also kept for the record."""
        report = self.cache_report
        prompt = usage.prompt_tokens if usage.prompt_tokens is not None else (report and report.prompt_tokens)
        matched = usage.cached_tokens if usage.cached_tokens is not None else (report and report.matched_tokens)
        prompt, matched = int(prompt or 0), int(matched or 0)
        if not self.request.breakpoints:
            split = no_cache(prompt)
        elif points is None:
            split = CacheUsage(prompt - min(matched, prompt), min(matched, prompt), 0, 0, 0)
        else:
            split = split_usage(prompt, matched, points, self.min_cacheable_tokens)
        known_prompt = usage.prompt_tokens is not None or (report is not None and report.prompt_tokens is not None)
        # The engine's tier split describes its whole match; the cache reads are its first tokens, and the record's
        # cached tokens, so the split recorded is theirs (one over the cached tokens would count as unknown). The
        # load time stays the match's.
        tiers = usage.tiers if usage.tiers is not None else (report.tiers if report is not None else None)
        self.usage = replace(
            usage,
            prompt_tokens=split.prompt_tokens if known_prompt else None,
            cached_tokens=split.cache_read_input_tokens if known_prompt else None,
            tiers=first_tokens(tiers, split.cache_read_input_tokens) if known_prompt and tiers is not None else None,
        )
        self.cache_write_tokens = split.cache_creation_input_tokens if known_prompt else None
        return split

    async def open(self, *, stream: bool) -> httpx.Response:
        request = with_trace_context(self.route.request(CHAT, self.payload), self.tracker.span)
        upstream = await open_upstream(self.client, self.route, request, self.tracker, stream)
        self.cache_report = self.route.adapter.cache_report(upstream.headers)
        return upstream

    async def relay_error(self, upstream: httpx.Response, headers: list[tuple[bytes, bytes]]) -> Outcome:
        body = upstream.content
        status, translated = translate_upstream_error(upstream.status_code, body, self.request.model)
        outcome = Outcome(status, upstream_error_type(body))
        self.answered(outcome)
        await send_response(self.send, status, translated, [*headers, JSON_CONTENT_TYPE])
        return outcome


async def forward_plain(exchange: Exchange) -> Outcome:
    upstream = await exchange.open(stream=False)
    headers = exchange.response_headers(upstream)
    if upstream.status_code >= 400:
        return await exchange.relay_error(upstream, headers)
    payload, choice = chat_completion(exchange, upstream)
    usage = exchange.route.adapter.usage(payload)
    split = exchange.cache_usage(usage, await exchange.points())
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    reason, sequence = stop_reason(
        choice.get("finish_reason"), matched_stop_of(choice), exchange.request.body.get("stop_sequences")
    )
    body = {
        "id": exchange.message_id,
        "type": "message",
        "role": "assistant",
        "model": exchange.request.model,
        "content": message_content(message),
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": split.as_dict(usage.completion_tokens or 0),
    }
    if exchange.tracker.span is not None:
        exchange.tracker.span.response.read_message(exchange.message_id, exchange.request.model, reason)
    outcome = Outcome(upstream.status_code)
    exchange.answered(outcome)
    await send_response(exchange.send, 200, _ENCODER.encode(body), [*headers, JSON_CONTENT_TYPE])
    return outcome


def _stream_start_usage(exchange: Exchange, points: list[CachePoint] | None) -> dict[str, Any]:
    """The prompt-side usage for `message_start`, from the match headers (zeros when the upstream sends none)."""
    report = exchange.cache_report
    usage = UsageReport(
        prompt_tokens=report.prompt_tokens if report is not None else None,
        cached_tokens=report.matched_tokens if report is not None else None,
    )
    return exchange.cache_usage(usage, points).as_dict()


async def forward_stream(exchange: Exchange) -> Outcome:
    upstream = await exchange.open(stream=True)
    try:
        headers = exchange.response_headers(upstream)
        if upstream.status_code >= 400:
            await read_error_body(exchange, upstream)
            return await exchange.relay_error(upstream, headers)
        points = await exchange.points()
        start = message_start(exchange.message_id, exchange.request.model, _stream_start_usage(exchange, points))
        return await stream_events(exchange, headers, start, lambda: _pump(exchange, upstream, points))
    finally:
        await upstream.aclose()


async def _pump(exchange: Exchange, upstream: httpx.Response, points: list[CachePoint] | None) -> Outcome:
    translator = ChunkTranslator(exchange.request.body.get("stop_sequences"))
    end = await relay_chat_stream(exchange, upstream, translator, _error_ending)
    if end.failure is not None:
        return end.failure
    usage = end.usage
    split = exchange.cache_usage(usage or UsageReport(), points)
    final = split.as_dict((usage.completion_tokens if usage else None) or 0)
    final.pop("cache_creation")
    if exchange.tracker.span is not None:
        stops = exchange.request.body.get("stop_sequences")
        reason, _ = stop_reason(translator.finish_reason, translator.matched_stop, stops)
        exchange.tracker.span.response.read_message(exchange.message_id, exchange.request.model, reason)
    outcome = Outcome(upstream.status_code)
    exchange.answered(outcome)
    await exchange.send({"type": "http.response.body", "body": translator.finish(final), "more_body": False})
    return outcome


def _error_ending(message: str, error_type: str, status_code: int) -> bytes:
    """Anthropic's `error` event; its type follows the status (a mid-stream error chunk under 200 counts as 500)."""
    return error_event(message, error_type_for_status(status_code if status_code >= 400 else 500))
