"""The engine's spans for one completion: a server span with a child per phase (queue, prefill, decode).

When a W3C `traceparent` header arrives (the gateway sends its request span's), the engine's server span is its
child, so the application's, the gateway's and the engine's spans form one trace. Span names and GenAI attributes
follow the OpenTelemetry GenAI semantic conventions (`gen_ai.operation.name`, `gen_ai.provider.name` =
`prefixscope`, request and response model, response id, finish reasons, input, output and cached input tokens).

- `queue`: submission to admission (`vllm:request_queue_time_seconds`);
- `prefill`: admission to the first token, with the prompt's cached and computed tokens, the cached tokens per
  tier and the time spent loading host and disk KV back to the device;
- `decode`: first token to finish, with the output tokens and decode steps.

The phase spans are written when the request ends, from the engine's own timings (`RequestTimings`), placed on the
wall clock from the moment the request was submitted: nothing is added to the worker thread's steps. Export is the
batch processor's (`prefixscope.tracing`). Prompt text never goes into an engine span.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes import error_attributes
from opentelemetry.trace import SpanKind, Status, StatusCode

from local_engine.engine.types import Finished
from local_engine.api.match_details import MatchDetails
from local_engine.api.protocol import CHAT
from prefixscope.tracing import HEADER_GETTER, PROPAGATOR, Tracing

PROVIDER = "prefixscope"
SERVICE_NAME = "prefixscope-engine"
_MS = 1_000_000  # nanoseconds


class RequestTrace:
    """One request's spans, written when it ends (`finish` or `fail`; only the first call counts)."""

    __slots__ = ("_spans", "_parent", "_endpoint", "_arrived_ns", "_submitted_ns", "model", "_ended")

    def __init__(self, spans: EngineSpans, parent: Any, endpoint: str) -> None:
        self._spans = spans
        self._parent = parent
        self._endpoint = endpoint
        self._arrived_ns = time.time_ns()
        self._submitted_ns: int | None = None
        self.model: str | None = None  # the model the request named
        self._ended = False

    def submitted(self, model: str) -> None:
        """The request was parsed and goes to the engine's queue now."""
        self.model = model
        self._submitted_ns = time.time_ns()

    def finish(self, finished: Finished, report: MatchDetails, response_id: str) -> None:
        if self._ended:
            return
        self._ended = True
        end_ns = time.time_ns()
        server = self._server_span()
        timings = finished.timings
        server.set_attributes({
            gen_ai.GEN_AI_RESPONSE_MODEL: self._spans.model_id,
            gen_ai.GEN_AI_RESPONSE_ID: response_id,
            gen_ai.GEN_AI_RESPONSE_FINISH_REASONS: (finished.finish_reason,),
            gen_ai.GEN_AI_USAGE_INPUT_TOKENS: finished.prompt_tokens,
            gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: finished.completion_tokens,
            gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: finished.cached_tokens,
            **_match_attributes(report),
        })
        tracer, context = self._spans.tracer, trace.set_span_in_context(server)
        submitted = self._submitted_ns if self._submitted_ns is not None else self._arrived_ns
        admitted = submitted + int(timings.queued_ms * _MS)
        first_token = submitted + int(timings.ttft_ms * _MS) if timings.ttft_ms else None
        tracer.start_span("queue", context=context, start_time=submitted).end(end_time=admitted)
        prefill = tracer.start_span("prefill", context=context, start_time=admitted, attributes={
            "prefixscope.prefill.cached_tokens": report.matched_tokens,
            "prefixscope.prefill.computed_tokens": report.prompt_tokens - report.matched_tokens,
            **_tier_attributes(report),
        })
        prefill.end(end_time=first_token if first_token is not None else end_ns)
        if first_token is not None:
            decode = tracer.start_span("decode", context=context, start_time=first_token, attributes={
                gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: finished.completion_tokens,
                "prefixscope.decode.steps": timings.num_decode_steps,
            })
            decode.end(end_time=max(first_token, first_token + int(timings.decode_ms * _MS)))
        server.end(end_time=end_ns)

    def fail(self, error_type: str, message: str = "") -> None:
        if self._ended:
            return
        self._ended = True
        server = self._server_span()
        server.set_attribute(error_attributes.ERROR_TYPE, error_type)
        server.set_status(Status(StatusCode.ERROR, message or error_type))
        server.end()

    def _server_span(self) -> trace.Span:
        operation = _operation(self._endpoint)
        name = f"{operation} {self.model}" if self.model else operation
        return self._spans.tracer.start_span(
            name,
            context=self._parent,
            kind=SpanKind.SERVER,
            start_time=self._arrived_ns,
            attributes={
                gen_ai.GEN_AI_OPERATION_NAME: operation,
                gen_ai.GEN_AI_PROVIDER_NAME: PROVIDER,
                **({gen_ai.GEN_AI_REQUEST_MODEL: self.model} if self.model else {}),
            },
        )


class EngineSpans:
    """Starts a `RequestTrace` per completion request; `model_id` is the served model (`gen_ai.response.model`)."""

    def __init__(self, tracing: Tracing, model_id: str) -> None:
        self.tracing = tracing
        self.tracer = tracing.tracer
        self.model_id = model_id

    def begin(self, headers: Mapping[str, str], endpoint: str) -> RequestTrace:
        """A trace for a request that just arrived with these HTTP headers (names lower case)."""
        parent = None
        traceparent = headers.get("traceparent")
        if traceparent:
            carrier = {"traceparent": traceparent}
            tracestate = headers.get("tracestate")
            if tracestate:
                carrier["tracestate"] = tracestate
            parent = PROPAGATOR.extract(carrier, getter=HEADER_GETTER)
        return RequestTrace(self, parent, endpoint)


def _operation(endpoint: str) -> str:
    return (gen_ai.GenAiOperationNameValues.CHAT if endpoint == CHAT
            else gen_ai.GenAiOperationNameValues.TEXT_COMPLETION).value


def _match_attributes(report: MatchDetails) -> dict[str, Any]:
    attributes: dict[str, Any] = {"prefixscope.cache.miss_kind": report.miss_kind.value}
    if report.template_tokens is not None:
        attributes["prefixscope.cache.template_tokens"] = report.template_tokens
    if report.divergence is not None:
        attributes["prefixscope.divergence.segment"] = report.divergence.segment
        attributes["prefixscope.divergence.char_offset"] = report.divergence.char_offset
    return attributes


def _tier_attributes(report: MatchDetails) -> dict[str, Any]:
    tiers = report.tiers
    return {
        "prefixscope.cache.tier.device_tokens": tiers.device,
        "prefixscope.cache.tier.host_tokens": tiers.host,
        "prefixscope.cache.tier.disk_tokens": tiers.disk,
        "prefixscope.cache.load_ms": report.load_ms,
    }
