"""The engine's access log: one line per request on the logger `local_engine.access`, written when its response has
ended (a stream's last chunk sent, or the client gone).

A completion's line (INFO) carries the request id (the response's `id`), the endpoint, the HTTP status, the prompt's
tokens, how many came from the cache and how many were computed, the engine's time to first token in milliseconds,
the tokens generated (all choices together), the finish reason (several, comma-separated, when choices ended
differently), whether it streamed and the whole response's milliseconds:

    access chatcmpl-3f2a... POST /v1/chat/completions 200 prompt_tokens=2063 cached_tokens=2048 computed_tokens=15
    ttft_ms=41.2 output_tokens=16 finish_reason=length stream=false duration_ms=402.7

Every other endpoint (`/health` polls, `/metrics` scrapes, the cache views) gets a shorter line at DEBUG. Lines never
hold prompt or output text, header values or keys; the same figures ride on each record as `record.access` (a dict)
for log handlers that want fields. `--no-access-log`, or a log level above INFO, turns the lines off, as uvicorn's
access log is turned off.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass, field

from litestar import Litestar

log = logging.getLogger("local_engine.access")

GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
_STATE_KEY = "prefixscope_access"  # where a request's AccessRecord lives in its ASGI scope's state
_CLIENT_GONE = 499  # the status logged when the client left before a response started (nginx's convention)


@dataclass
class AccessRecord:
    """What a completion handler learns about its request, filled in as it goes. Token counts and the time to
    first token stay None until known (a request refused with a 400 never gets them)."""

    request_id: str = field(default_factory=lambda: "req-" + secrets.token_hex(8))
    stream: bool | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_ms: float | None = None
    output_tokens: int = 0
    finish_reasons: list[str] = field(default_factory=list)

    def finished(self, event) -> None:
        """Count one ended sequence (a `Finished` event): its tokens, cache hits, reason and time to first token."""
        self.output_tokens += event.completion_tokens
        self.prompt_tokens = event.prompt_tokens
        self.cached_tokens = event.cached_tokens
        if event.finish_reason not in self.finish_reasons:
            self.finish_reasons.append(event.finish_reason)
        if event.timings.ttft_ms and (self.ttft_ms is None or event.timings.ttft_ms < self.ttft_ms):
            self.ttft_ms = event.timings.ttft_ms


def access_record(scope_state: dict) -> AccessRecord:
    """The request's AccessRecord (created at the first call), from its scope's state (`request.scope["state"]`)."""
    record = scope_state.get(_STATE_KEY)
    if record is None:
        record = scope_state[_STATE_KEY] = AccessRecord()
    return record


def access_fields(method: str, path: str, status: int, duration_ms: float, record: AccessRecord | None) -> dict:
    """The logged fields of one request, in order; the token figures only for a completion."""
    fields = {"method": method, "path": path, "status": status}
    if path in GENERATION_PATHS:
        record = record or AccessRecord()
        computed = None
        if record.prompt_tokens is not None and record.cached_tokens is not None:
            computed = record.prompt_tokens - record.cached_tokens
        fields = {"request_id": record.request_id, **fields, "prompt_tokens": record.prompt_tokens,
                  "cached_tokens": record.cached_tokens, "computed_tokens": computed,
                  "ttft_ms": None if record.ttft_ms is None else round(record.ttft_ms, 1),
                  "output_tokens": record.output_tokens,
                  "finish_reason": ",".join(record.finish_reasons) or None,
                  "stream": None if record.stream is None else str(record.stream).lower()}
    fields["duration_ms"] = round(duration_ms, 1)
    return fields


def format_line(fields: dict) -> str:
    """`access ID METHOD PATH STATUS key=value ...` (`-` for a figure not known)."""
    head = [fields.get("request_id"), fields["method"], fields["path"], fields["status"]]
    tail = [f"{key}={'-' if value is None else value}" for key, value in fields.items()
            if key not in ("request_id", "method", "path", "status")]
    return " ".join(["access", *(str(part) for part in head if part is not None), *tail])


class AccessLoggedApp(Litestar):
    """The engine's Litestar app with the access log around every HTTP request: it sees the status the response
    started with (error responses included) and writes the line once the response has ended or the client left."""

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        started = time.perf_counter()
        status: list[int] = []

        async def send_and_watch(message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        scope.setdefault("state", {})
        try:
            await super().__call__(scope, receive, send_and_watch)
        finally:
            path = scope.get("path", "")
            level = logging.INFO if path in GENERATION_PATHS else logging.DEBUG
            if log.isEnabledFor(level):
                fields = access_fields(scope.get("method", ""), path, status[0] if status else _CLIENT_GONE,
                                       (time.perf_counter() - started) * 1000, scope["state"].get(_STATE_KEY))
                log.log(level, "%s", format_line(fields), extra={"access": fields})
