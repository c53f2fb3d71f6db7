"""The completions endpoints as raw ASGI handlers: the gateway's hot path.

auth (in memory) -> read body (bounded) -> parse -> normalize -> salt -> route -> forward or stream -> record.
Nothing here awaits the database; the record goes to the writer's queue.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable
from typing import Any

import msgspec

from gateway.asgi_io import (
    JSON_CONTENT_TYPE,
    Receive,
    Send,
    header_values,
    read_body,
    run_until_disconnect,
    send_response,
)
from gateway.body_checks import too_deep
from gateway.conversations.ids import SESSION_HEADER_BYTES, explicit_id
from gateway.errors import ClientDisconnected, GatewayError, MethodNotAllowed, error_body
from gateway.explain.explainer import ExplainContext
from gateway.fingerprint import prefix_hash, prompt_text
from gateway.forwarding import forward_plain, forward_stream
from gateway.parsing import parse_request
from gateway.recording import RequestTracker
from gateway.replicas.dispatch import forward_routed
from gateway.request_stages import Admitted, Outcome, Parsed, Prepared, Routed
from gateway.runtime import Runtime
from gateway.upstreams.route import Route

log = logging.getLogger(__name__)

_ENCODER = msgspec.json.Encoder()
_AUTHORIZATION = b"authorization"
_CONTENT_LENGTH = b"content-length"


class _TrackedSend:
    """Wraps ASGI `send` to know whether the response has started (then errors can no longer change it) and
    whether it is complete."""

    __slots__ = ("_send", "started", "complete")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False
        self.complete = False

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        elif not message.get("more_body", False):
            self.complete = True
        await self._send(message)


class CompletionProxy:
    """`POST /v1/chat/completions` or `POST /v1/completions`."""

    def __init__(self, runtime: Runtime, endpoint: str) -> None:
        self._runtime = runtime
        self._endpoint = endpoint

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        start_perf = time.perf_counter()
        runtime = self._runtime
        request_id = "req_" + secrets.token_hex(12)
        span = runtime.spans.start(scope, self._endpoint) if runtime.spans is not None else None
        tracker = RequestTracker(runtime.recorder, request_id, self._endpoint, start_perf, span=span)
        tracked_send = _TrackedSend(send)
        try:
            outcome = await self._handle(scope, receive, tracked_send, tracker, start_perf)
            tracker.finish(outcome.status_code, outcome.error_type)
        except ClientDisconnected as exc:
            answer = tracker.answer
            outcome = None if answer is None else answer.outcome
            if tracked_send.complete and outcome is not None:
                # The client had its whole response (say, a stream up to [DONE]) and left before we were done.
                tracker.finish(outcome.status_code, outcome.error_type)
            else:
                tracker.finish(exc.status_code, exc.error_type)
        except GatewayError as exc:
            if not tracked_send.started:
                headers = [(b"x-request-id", request_id.encode()), JSON_CONTENT_TYPE]
                await send_response(send, exc.status_code, self.error_body(exc), headers)
            tracker.finish(exc.status_code, exc.error_type)
        except BaseException as exc:
            # Unexpected failures and cancellation (server shutdown) are recorded too, then re-raised or answered.
            tracker.finish(500, "internal_error" if isinstance(exc, Exception) else "cancelled")
            if not isinstance(exc, Exception):
                raise
            log.exception("unexpected error in %s", self._endpoint)
            if not tracked_send.started:
                body = self.error_body(GatewayError("The gateway hit an internal error."))
                await send_response(send, 500, body, [(b"x-request-id", request_id.encode()), JSON_CONTENT_TYPE])

    def error_body(self, exc: GatewayError) -> bytes:
        """The body of an error response in this endpoint's protocol (OpenAI's shape here)."""
        return error_body(exc.message, exc.error_type, exc.param, exc.code)

    async def _handle(
        self, scope: dict[str, Any], receive: Receive, send: _TrackedSend, tracker: RequestTracker, start_perf: float
    ) -> Outcome:
        if scope["method"] != "POST":
            raise MethodNotAllowed(f"Method {scope['method']} is not allowed here; use POST.")
        runtime = self._runtime
        headers = header_values(scope, _AUTHORIZATION, _CONTENT_LENGTH, SESSION_HEADER_BYTES)
        principal = await runtime.keys.authenticate_now(headers.get(_AUTHORIZATION))
        tracker.admitted(Admitted(principal.tenant, principal.key_id))
        raw = await read_body(receive, runtime.config.max_body_bytes, headers.get(_CONTENT_LENGTH))
        parsed = parse_request(self._endpoint, raw)
        tracker.parsed(Parsed(parsed.model, parsed.stream))
        route = runtime.router.route(parsed.model)
        tracker.routed(Routed(route.name))

        try:
            normalized = runtime.pipeline_for(principal.tenant).apply(parsed.body)
        except RecursionError:
            raise too_deep(parsed.body) from None
        settings = runtime.config.tenant_settings(principal.tenant)
        salt = runtime.salts.salt_for(principal.tenant)
        body = route.adapter.apply_salt(normalized.request, salt)
        # The class asked for (or the tenant's default), lowered to the tenant's maximum; sent only to upstreams
        # that take one, and recorded as sent.
        retention = settings.retention.effective(parsed.cache_retention)
        if route.adapter.retention_field is None:
            retention = None
        route.adapter.apply_retention(body, retention)
        if parsed.stream:
            # Ask for usage on the client's behalf; the relay drops that chunk again if the client did not ask.
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        # The engine's hash chain comes back in the response (removed again there if the client did not ask).
        client_wants_chain = parsed.body.get("return_hash_chain") is True
        if settings.hash_chain:
            route.adapter.ask_for_hash_chain(body, settings.hash_block_size)
        record_key = runtime.recorder.hash_key(principal.tenant)
        tracker.prepared(
            Prepared(
                applied_rules=normalized.applied_rules,
                prefix_hash=prefix_hash(self._endpoint, normalized.request, record_key),
                prompt_text=prompt_text(self._endpoint, normalized.request) if settings.store_prompt_text else None,
                namespace_label=(
                    runtime.salts.label_for(principal.tenant) if route.adapter.salt_field is not None else None
                ),
                retention_class=retention,
                explain=ExplainContext(
                    settings, self._endpoint, principal.tenant, normalized.request, parsed.body, salt, route,
                    client_wants_chain, explicit_id=explicit_id(headers.get(SESSION_HEADER_BYTES), parsed.body),
                ),
            )
        )
        payload = _ENCODER.encode(body)

        def forward(target: Route) -> Awaitable[Outcome]:
            if parsed.stream:
                return forward_stream(
                    runtime.client,
                    target,
                    self._endpoint,
                    payload,
                    tracker,
                    send,
                    client_wants_usage=parsed.client_wants_usage,
                    start_perf=start_perf,
                )
            return forward_plain(runtime.client, target, self._endpoint, payload, tracker, send)

        work = forward_routed(runtime.router, runtime.client, route, self._endpoint, body, salt, tracker, send, forward)
        return await run_until_disconnect(work, receive)
