"""`POST /v1/messages` and `POST /v1/messages/count_tokens` as raw ASGI handlers.

auth (`x-api-key` or `Authorization: Bearer`, through the same key store as every endpoint) -> read body (bounded)
-> parse and validate -> normalize (Anthropic's shape) -> route -> translate to the chat API and forward (local
engine and OpenAI-compatible upstreams) or pass through (`anthropic` upstreams) -> record. Errors leave in Anthropic's
shape. The record is the same as for chat requests (endpoint `messages`, cached tokens = cache reads) plus the cache
writes and the retention class; the miss explanation compares the translated chat request with the tenant's history,
so chat and Messages requests explain each other.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import replace
from typing import Any

import httpx
import msgspec

from gateway.anthropic import MESSAGES, engine_forward, passthrough
from gateway.anthropic.answer_capture import MessageAnswerCapture
from gateway.anthropic.errors import body_for_gateway_error, model_not_found_message
from gateway.anthropic.normalize import normalize
from gateway.anthropic.positions import DryRunFailed, breakpoint_positions, dry_run
from gateway.anthropic.request import MessagesRequest, parse_messages_request, too_deep
from gateway.anthropic.translate import ChatStyle, restores_calls, to_chat_body
from gateway.asgi_io import (
    JSON_CONTENT_TYPE,
    Receive,
    Send,
    header_values,
    read_body,
    run_until_disconnect,
    send_response,
)
from gateway.auth import Principal, credentials
from gateway.conversations.ids import SESSION_HEADER_BYTES, explicit_id
from gateway.errors import BadRequest, GatewayError, MethodNotAllowed, NotFound, Unauthorized, UpstreamUnavailable
from gateway.explain.explainer import ExplainContext
from gateway.fingerprint import prefix_hash, prompt_text
from gateway.forwarding import map_transport_error
from gateway.parsing import CHAT
from gateway.proxy import CompletionProxy
from gateway.recording import RequestTracker
from gateway.request_stages import Admitted, Outcome, Parsed, Prepared, Routed
from gateway.runtime import Runtime
from gateway.upstreams.base import CLIENT_SALT_FIELDS
from gateway.upstreams.route import Route

_ENCODER = msgspec.json.Encoder()
_AUTHORIZATION = b"authorization"
_X_API_KEY = b"x-api-key"
_CONTENT_LENGTH = b"content-length"
_VERSION = b"anthropic-version"
_BETA = b"anthropic-beta"
_ARGUMENTS_RULE = "tool_call_arguments_key_order"
_HEADERS = (_AUTHORIZATION, _X_API_KEY, _CONTENT_LENGTH, _VERSION, _BETA, SESSION_HEADER_BYTES)
ANTHROPIC_KIND = "anthropic"


async def authenticate(runtime: Runtime, headers: dict[bytes, str]) -> Principal:
    """The caller, from `x-api-key` (Anthropic's header) or else `Authorization: Bearer`."""
    given = credentials(headers.get(_AUTHORIZATION), headers.get(_X_API_KEY))
    try:
        return await runtime.keys.authenticate_now(given)
    except Unauthorized:
        if given:
            raise
        raise Unauthorized("You didn't provide an API key. Send it in the x-api-key header.") from None


def check_chat_upstream(body: dict[str, Any], route: Route) -> None:
    """Refuse what a chat upstream cannot honour: a final assistant message (Anthropic's prefill; the chat API starts a
    new assistant turn instead) and extended thinking."""
    last = len(body["messages"]) - 1
    if body["messages"][last]["role"] == "assistant":
        raise BadRequest(
            f"messages[{last}]: a final assistant message (a prefill to continue) is not supported on the "
            f"upstream {route.name!r}, whose chat API starts a new assistant turn",
            param=f"messages[{last}]",
        )
    thinking = body.get("thinking")
    if thinking is not None and not (isinstance(thinking, dict) and thinking.get("type") == "disabled"):
        raise BadRequest(
            f"thinking: extended thinking is not supported on the upstream {route.name!r}", param="thinking"
        )


def chat_style(runtime: Runtime, tenant: str) -> ChatStyle:
    """How the tenant's Messages requests are written as chat bodies (`translate.ChatStyle`): tool keys sorted with
    `tool_schema_key_order`, re-sent tool calls written as returned with `tool_call_arguments_key_order`."""
    rules = runtime.config.tenant_settings(tenant).rules
    returned = runtime.returned_calls
    lookup = returned.lookup_for(tenant) if returned is not None and _ARGUMENTS_RULE in rules else None
    return ChatStyle("tool_schema_key_order" in rules, lookup)


def _passthrough_body(body: dict[str, Any]) -> bytes:
    return _ENCODER.encode({k: v for k, v in body.items() if k not in CLIENT_SALT_FIELDS})


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved, so an unawaited failure is not logged as lost


class MessagesProxy(CompletionProxy):
    """`POST /v1/messages`."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime, MESSAGES)

    def error_body(self, exc: GatewayError) -> bytes:
        return body_for_gateway_error(exc)

    async def _handle(
        self, scope: dict[str, Any], receive: Receive, send: Any, tracker: RequestTracker, start_perf: float
    ) -> Outcome:
        if scope["method"] != "POST":
            raise MethodNotAllowed(f"Method {scope['method']} is not allowed here; use POST.")
        runtime = self._runtime
        headers = header_values(scope, *_HEADERS)
        principal = await authenticate(runtime, headers)
        tracker.admitted(Admitted(principal.tenant, principal.key_id))
        raw = await read_body(receive, runtime.config.max_body_bytes, headers.get(_CONTENT_LENGTH))
        request = parse_messages_request(raw)
        tracker.parsed(Parsed(request.model, request.stream, retention_class=request.retention_class))
        route = runtime.router.route(request.model)
        tracker.routed(Routed(route.name))
        try:
            return await self._forward(request, principal, route, headers, receive, send, tracker, start_perf)
        except RecursionError:
            # Deeply nested values (a tool schema, a tool input) that parsed but are too deep to normalize or encode.
            raise too_deep() from None

    async def _forward(
        self,
        request: MessagesRequest,
        principal: Principal,
        route: Route,
        headers: dict[bytes, str],
        receive: Receive,
        send: Send,
        tracker: RequestTracker,
        start_perf: float,
    ) -> Outcome:
        runtime = self._runtime
        settings = runtime.config.tenant_settings(principal.tenant)
        normalized_body, applied_rules = normalize(request.body, settings)
        normalized = replace(request, body=normalized_body)
        passthrough_route = route.adapter.kind == ANTHROPIC_KIND
        if not passthrough_route:
            check_chat_upstream(normalized_body, route)
        style = chat_style(runtime, principal.tenant)
        if not passthrough_route and restores_calls(normalized_body, style):
            applied_rules = (*applied_rules, _ARGUMENTS_RULE)  # last in `ALL_RULES` order, as in the chat pipeline
        else:
            style = replace(style, returned=None)  # nothing to write back (or an upstream that gets the Messages body)
        chat_body = to_chat_body(normalized_body, stream=request.stream, style=style)
        salt = runtime.salts.salt_for(principal.tenant)
        raw_chat = to_chat_body(request.body, stream=request.stream, style=replace(style, returned=None))
        # The breakpoints' class (or the tenant's default), lowered to the tenant's maximum, goes to upstreams that
        # take one and is recorded as sent; for the others the record keeps the class the breakpoints asked for.
        retention = (
            settings.retention.effective(request.retention_class)
            if not passthrough_route and route.adapter.retention_field
            else None
        )
        tracker.prepared(
            Prepared(
                applied_rules=applied_rules,
                prefix_hash=prefix_hash(CHAT, chat_body, runtime.recorder.hash_key(principal.tenant)),
                prompt_text=prompt_text(CHAT, chat_body) if settings.store_prompt_text else None,
                retention_class=retention,
                explain=ExplainContext(
                    settings, CHAT, principal.tenant, chat_body, raw_chat, salt, route, False,
                    explicit_id=explicit_id(headers.get(SESSION_HEADER_BYTES), request.body),
                ),
            )
        )

        if passthrough_route:
            if tracker.explain is not None:  # the answer, as sent, for the conversation tracker
                tracker.explain.answer = MessageAnswerCapture(style)
            upstream_headers = passthrough.upstream_headers(route.upstream, headers.get(_VERSION), headers.get(_BETA))
            upstream_body = normalized_body
            asked = settings.diagnostics or "diagnostics" in normalized_body
            if settings.diagnostics and "diagnostics" not in normalized_body:
                # The provider's own cache diagnosis, compared with the tenant's latest message on this prefix.
                baseline = runtime.baselines.latest(principal.tenant, route.name, tracker.prefix_hash)
                upstream_body = {**normalized_body, "diagnostics": {"previous_message_id": baseline}}
            upstream_request = passthrough.upstream_request(
                route, "messages", _passthrough_body(upstream_body), upstream_headers
            )
            diagnosed = passthrough.DiagnosisBaseline(
                runtime.baselines, principal.tenant, route.name, tracker.prefix_hash, asked
            )
            if request.stream:
                work = passthrough.forward_stream(
                    runtime.client, route, upstream_request, tracker, send, start_perf, diagnosed
                )
            else:
                work = passthrough.forward_plain(runtime.client, route, upstream_request, tracker, send, diagnosed)
            return await run_until_disconnect(work, receive)

        positions = None
        if normalized.breakpoints and route.adapter.supports_dry_run_match:
            positions = asyncio.ensure_future(
                breakpoint_positions(
                    runtime.client, route, normalized_body, chat_body, normalized.breakpoints, salt, style
                )
            )
            positions.add_done_callback(_retrieve)
        try:
            exchange = self._exchange(
                route, normalized, chat_body, salt, retention, tracker, send, positions, start_perf
            )
            forward = engine_forward.forward_stream if request.stream else engine_forward.forward_plain
            return await run_until_disconnect(forward(exchange), receive)
        finally:
            if positions is not None and not positions.done():
                positions.cancel()

    def _exchange(
        self,
        route: Route,
        request: MessagesRequest,
        chat_body: dict[str, Any],
        salt: str,
        retention: str | None,
        tracker: RequestTracker,
        send: Send,
        positions: asyncio.Task[Any] | None,
        start_perf: float,
    ) -> engine_forward.Exchange:
        runtime = self._runtime
        settings = runtime.config.tenant_settings(tracker.tenant)
        body = route.adapter.apply_salt(chat_body, salt)
        route.adapter.apply_retention(body, retention)
        if route.adapter.kind == "openai":
            body.pop("top_k", None)  # OpenAI's chat API has no top_k (vLLM and SGLang take it)
        if request.stream:
            body["stream_options"] = {"include_usage": True}
        if settings.hash_chain:
            route.adapter.ask_for_hash_chain(body, settings.hash_block_size)
        return engine_forward.Exchange(
            client=runtime.client,
            route=route,
            request=request,
            payload=_ENCODER.encode(body),
            tracker=tracker,
            send=send,
            message_id="msg_" + secrets.token_hex(12),
            min_cacheable_tokens=runtime.config.messages.min_cacheable_for(request.model),
            positions=positions,
            start_perf=start_perf,
            retention=retention,
        )


class CountTokens:
    """`POST /v1/messages/count_tokens`: the prompt's tokens as the upstream counts them (`{"input_tokens": N}`). The
    local engine counts with a dry-run match; `anthropic` upstreams answer themselves; other kinds cannot count.
    Not recorded as a request (nothing is generated); errors are counted in the metrics."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        request_id = "req_" + secrets.token_hex(12)
        ids = [(b"x-request-id", request_id.encode()), (b"request-id", request_id.encode())]
        try:
            try:
                status, body, content_type = await self._count(scope, receive)
            except RecursionError:
                raise too_deep() from None
        except GatewayError as exc:
            self._runtime.metrics.count_error(exc.error_type)
            await send_response(send, exc.status_code, body_for_gateway_error(exc), [*ids, JSON_CONTENT_TYPE])
            return
        await send_response(send, status, body, [*ids, content_type])

    async def _count(self, scope: dict[str, Any], receive: Receive) -> tuple[int, bytes, tuple[bytes, bytes]]:
        if scope["method"] != "POST":
            raise MethodNotAllowed(f"Method {scope['method']} is not allowed here; use POST.")
        runtime = self._runtime
        headers = header_values(scope, *_HEADERS)
        principal = await authenticate(runtime, headers)
        raw = await read_body(receive, runtime.config.max_body_bytes, headers.get(_CONTENT_LENGTH))
        request = parse_messages_request(raw, count_only=True)
        route = runtime.router.route(request.model)
        body, _ = normalize(request.body, runtime.config.tenant_settings(principal.tenant))
        if route.adapter.kind == ANTHROPIC_KIND:
            upstream_headers = passthrough.upstream_headers(route.upstream, headers.get(_VERSION), headers.get(_BETA))
            upstream_request = passthrough.upstream_request(
                route, "messages/count_tokens", _passthrough_body(body), upstream_headers
            )
            try:
                upstream = await runtime.client.send(upstream_request)
            except httpx.HTTPError as exc:
                raise map_transport_error(exc, route) from None
            content_type = upstream.headers.get("content-type", "application/json").encode("latin-1")
            return upstream.status_code, upstream.content, (b"content-type", content_type)
        if not route.adapter.supports_dry_run_match:
            raise BadRequest(
                f"count_tokens needs an upstream that can count tokens (kind local_engine or anthropic); the "
                f"upstream {route.name!r} for model {request.model!r} is of kind {route.adapter.kind!r}",
                param="model",
            )
        chat_body = to_chat_body(body, stream=False, style=chat_style(runtime, principal.tenant))
        salt = runtime.salts.salt_for(principal.tenant)
        try:
            answer = await dry_run(runtime.client, route, chat_body, salt, chain=False)
        except DryRunFailed as exc:
            raise _count_error(exc, route, request.model) from None
        return 200, _ENCODER.encode({"input_tokens": answer["prompt_tokens"]}), JSON_CONTENT_TYPE


def _count_error(exc: DryRunFailed, route: Route, model: str) -> GatewayError:
    """A failed count: a model the engine does not serve is Anthropic's 404 (`model: <name>`); the engine's 400 (a
    request it refuses) stays a client error; an unreachable engine, an engine error or an unusable answer is the
    upstream's fault (502/504, `api_error` in Anthropic's shape)."""
    if exc.transport is not None:
        return map_transport_error(exc.transport, route)
    if exc.upstream_code == "model_not_found":
        return NotFound(model_not_found_message(model), param="model")
    if exc.status == 400:
        return BadRequest(f"The upstream {route.name!r} refused to count this request: {exc.upstream_message or exc}")
    return UpstreamUnavailable(f"The upstream {route.name!r} could not count this request: {exc}")
