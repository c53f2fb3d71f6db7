"""`POST /v1/responses` and `GET` / `DELETE /v1/responses/{id}` as raw ASGI handlers.

POST: auth (bearer, the same key store as every endpoint) -> read body (bounded) -> parse -> route ->
- chat upstreams (local engine, vLLM, SGLang): the stored conversation of `previous_response_id` + the request,
  translated to a chat body -> the tenant's chat normalization pipeline -> salt, retention -> forward (replica sets
  included) -> translated back; the response is kept (`store`, default true) for later turns and `GET`;
- `openai` upstreams: normalized in the Responses shape, the derived `prompt_cache_key` in place of the client's, the
  provider's diagnostics asked for when the tenant's `diagnostics` is on -> passed through; the id is kept so that
  only this tenant can continue, read or delete it.
Both record `endpoint = responses`, explained as the translated chat request (so chat and Responses requests explain
each other). Errors are OpenAI-shaped.

GET returns a response kept for the caller's tenant (from memory for chat upstreams, from the upstream for `openai`
ones); DELETE forgets it (and deletes it upstream). Anything else under `/v1/responses/{id}` (`input_items`,
`cancel`) is a 400: the gateway keeps no input items and runs nothing in the background.
"""

from __future__ import annotations

import secrets
from typing import Any

import httpx
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
from gateway.auth import Principal
from gateway.body_checks import too_deep
from gateway.conversations.ids import SESSION_HEADER_BYTES, ExplicitId, explicit_id
from gateway.errors import BadRequest, GatewayError, MethodNotAllowed, NotFound
from gateway.explain.explainer import ExplainContext
from gateway.fingerprint import prefix_hash, prompt_text
from gateway.forwarding import map_transport_error
from gateway.parsing import CHAT
from gateway.provider_diagnostics import Baselines
from gateway.proxy import CompletionProxy
from gateway.recording import RequestTracker
from gateway.request_stages import Admitted, Outcome, Parsed, Prepared, Routed
from gateway.replicas.dispatch import forward_routed
from gateway.responses import RESPONSES, engine_forward, passthrough
from gateway.responses.normalize import normalize
from gateway.responses.request import ResponsesRequest, parse_responses_request
from gateway.responses.store import ResponseStore, StoredResponse
from gateway.responses.translate import history_messages, input_messages, new_id, to_chat_body
from gateway.upstreams.route import Route
from gateway.runtime import Runtime
from gateway.upstreams.base import CLIENT_SALT_FIELDS
from gateway.upstreams.prompt_cache_key import FIELD as PROMPT_CACHE_KEY
from gateway.upstreams.prompt_cache_key import derive_prompt_cache_key

_ENCODER = msgspec.json.Encoder()
_AUTHORIZATION = b"authorization"
_CONTENT_LENGTH = b"content-length"
OPENAI_KIND = "openai"


def _not_found(response_id: str, param: str | None = None) -> NotFound:
    return NotFound(f"No response with id '{response_id[:100]}' is kept for this API key.", param=param)


class ResponsesProxy(CompletionProxy):
    """`POST /v1/responses`."""

    def __init__(self, runtime: Runtime, store: ResponseStore, baselines: Baselines) -> None:
        super().__init__(runtime, RESPONSES)
        self._store = store
        self._baselines = baselines

    async def _handle(
        self, scope: dict[str, Any], receive: Receive, send: Any, tracker: RequestTracker, start_perf: float
    ) -> Outcome:
        if scope["method"] != "POST":
            raise MethodNotAllowed(f"Method {scope['method']} is not allowed here; use POST.")
        runtime = self._runtime
        headers = header_values(scope, _AUTHORIZATION, _CONTENT_LENGTH, SESSION_HEADER_BYTES)
        principal = runtime.keys.authenticate(headers.get(_AUTHORIZATION))
        tracker.admitted(Admitted(principal.tenant, principal.key_id))
        raw = await read_body(receive, runtime.config.max_body_bytes, headers.get(_CONTENT_LENGTH))
        request = parse_responses_request(raw)
        tracker.parsed(Parsed(request.model, request.stream))
        route = runtime.router.route(request.model)
        tracker.routed(Routed(route.name))
        given = explicit_id(headers.get(SESSION_HEADER_BYTES), request.body)
        try:
            if route.adapter.kind == OPENAI_KIND:
                return await self._passthrough(request, principal, route, receive, send, tracker, start_perf, given)
            return await self._to_chat(request, principal, route, receive, send, tracker, start_perf, given)
        except RecursionError:
            raise too_deep(request.body) from None

    def _previous(self, tenant: str, request: ResponsesRequest, route: Route) -> StoredResponse | None:
        """The tenant's stored response that `previous_response_id` names (404 when unknown, expired or another
        tenant's; 400 when it was answered by an upstream of the other kind)."""
        if request.previous_response_id is None:
            return None
        entry = self._store.get(tenant, request.previous_response_id)
        if entry is None:
            raise _not_found(request.previous_response_id, "previous_response_id")
        held_upstream = entry.response is None
        if held_upstream != (route.adapter.kind == OPENAI_KIND):
            raise BadRequest(
                f"previous_response_id: the response {request.previous_response_id[:100]!r} was answered by the "
                f"upstream {entry.upstream!r}, which keeps its conversation apart from the upstream {route.name!r} "
                f"that serves model {request.model!r}",
                param="previous_response_id",
            )
        return entry

    async def _to_chat(
        self,
        request: ResponsesRequest,
        principal: Principal,
        route: Route,
        receive: Receive,
        send: Any,
        tracker: RequestTracker,
        start_perf: float,
        given: ExplicitId | None,
    ) -> Outcome:
        runtime = self._runtime
        tenant = principal.tenant
        previous = self._previous(tenant, request, route)
        history = previous.history if previous is not None else []
        chat_body = to_chat_body(request.body, history, stream=request.stream)
        normalized = runtime.pipeline_for(tenant).apply(chat_body)
        settings = runtime.config.tenant_settings(tenant)
        salt = runtime.salts.salt_for(tenant)
        body = route.adapter.apply_salt(normalized.request, salt)
        retention = settings.retention.effective(request.retention_class) if route.adapter.retention_field else None
        route.adapter.apply_retention(body, retention)
        if request.stream:
            body["stream_options"] = {"include_usage": True}
        if settings.hash_chain:
            route.adapter.ask_for_hash_chain(body, settings.hash_block_size)
        tracker.prepared(
            Prepared(
                applied_rules=normalized.applied_rules,
                prefix_hash=prefix_hash(CHAT, normalized.request, runtime.recorder.hash_key(tenant)),
                prompt_text=prompt_text(CHAT, normalized.request) if settings.store_prompt_text else None,
                namespace_label=runtime.salts.label_for(tenant) if route.adapter.salt_field is not None else None,
                retention_class=retention,
                explain=ExplainContext(
                    settings, CHAT, tenant, normalized.request, chat_body, salt, route, False, explicit_id=given
                ),
            )
        )
        payload = _ENCODER.encode(body)
        response_id = new_id("resp")
        conversation = history + input_messages(request.body["input"])

        def on_complete(response: dict[str, Any]) -> None:
            if request.store:
                kept = StoredResponse(tenant, route.name, response, conversation + history_messages(response["output"]))
                self._store.put(tenant, response_id, kept)

        def forward(target: Route) -> Any:
            exchange = engine_forward.Exchange(
                runtime.client, target, request.body, payload, tracker, send, response_id, start_perf, retention,
                on_complete,
            )
            return (engine_forward.forward_stream if request.stream else engine_forward.forward_plain)(exchange)

        work = forward_routed(runtime.router, runtime.client, route, CHAT, body, salt, tracker, send, forward)
        return await run_until_disconnect(work, receive)

    async def _passthrough(
        self,
        request: ResponsesRequest,
        principal: Principal,
        route: Route,
        receive: Receive,
        send: Any,
        tracker: RequestTracker,
        start_perf: float,
        given: ExplicitId | None,
    ) -> Outcome:
        runtime = self._runtime
        tenant = principal.tenant
        self._previous(tenant, request, route)  # the id must be this tenant's
        settings = runtime.config.tenant_settings(tenant)
        normalized, applied_rules = normalize(request.body, settings)
        salt = runtime.salts.salt_for(tenant)
        body = {k: v for k, v in normalized.items() if k not in CLIENT_SALT_FIELDS and k != "cache_retention"}
        body[PROMPT_CACHE_KEY] = derive_prompt_cache_key(salt, normalized)
        record_key = runtime.recorder.hash_key(tenant)
        prefix = prefix_hash(RESPONSES, normalized, record_key)
        try:
            chat_view = to_chat_body(normalized, [], stream=False)
            raw_view = to_chat_body(request.body, [], stream=False)
        except BadRequest:
            chat_view = raw_view = None  # built-in tools or other items: recorded, not explained
        explain = None
        if chat_view is not None and raw_view is not None:
            explain = ExplainContext(settings, CHAT, tenant, chat_view, raw_view, salt, route, False, explicit_id=given)
        tracker.prepared(
            Prepared(
                applied_rules=applied_rules,
                prefix_hash=prefix,
                prompt_text=prompt_text(RESPONSES, normalized) if settings.store_prompt_text else None,
                explain=explain,
            )
        )
        if settings.diagnostics:
            baseline = request.previous_response_id or self._baselines.latest(tenant, route.name, prefix)
            _ask_for_diagnostics(body, baseline)
        payload = _ENCODER.encode(body)

        def on_answer(response: dict[str, Any]) -> None:
            response_id = response.get("id")
            if not isinstance(response_id, str) or not response_id:
                return
            self._baselines.update(tenant, route.name, prefix, response_id)
            if response.get("store", request.store) is not False:
                self._store.put(tenant, response_id, StoredResponse(tenant, route.name))

        if request.stream:
            work = passthrough.forward_stream(runtime.client, route, payload, tracker, send, start_perf, on_answer)
        else:
            work = passthrough.forward_plain(runtime.client, route, payload, tracker, send, on_answer)
        return await run_until_disconnect(work, receive)


def _ask_for_diagnostics(body: dict[str, Any], baseline: str | None) -> None:
    """Name the response to compare with in `prompt_cache_options.comparison_response_id`, unless the client did."""
    if baseline is None:
        return
    options = body.get("prompt_cache_options")
    if isinstance(options, dict) and options.get("comparison_response_id") is not None:
        return
    kept = options if isinstance(options, dict) else {}
    body["prompt_cache_options"] = {**kept, "comparison_response_id": baseline}


class ResponseResource:
    """`GET` and `DELETE /v1/responses/{id}` (see the module docstring). Not recorded as requests (nothing is
    generated); errors are counted in the metrics."""

    def __init__(self, runtime: Runtime, store: ResponseStore) -> None:
        self._runtime = runtime
        self._store = store

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send, path: str) -> None:
        """Answer for `path`, the part of the URL after `/v1/responses/`."""
        request_id = "req_" + secrets.token_hex(12)
        ids = [(b"x-request-id", request_id.encode())]
        try:
            status, body, content_type = await self._answer(scope, path)
        except GatewayError as exc:
            self._runtime.metrics.count_error(exc.error_type)
            await send_response(send, exc.status_code, exc.body(), [*ids, JSON_CONTENT_TYPE])
            return
        await send_response(send, status, body, [*ids, content_type])

    async def _answer(self, scope: dict[str, Any], path: str) -> tuple[int, bytes, tuple[bytes, bytes]]:
        runtime = self._runtime
        principal = runtime.keys.authenticate(header_values(scope, _AUTHORIZATION).get(_AUTHORIZATION))
        response_id, _, rest = path.partition("/")
        if rest:
            raise BadRequest(
                f"/v1/responses/{{id}}/{rest[:40]} is not served: the gateway keeps no input items and runs no "
                "background responses.",
            )
        if scope["method"] not in ("GET", "DELETE"):
            raise MethodNotAllowed(f"Method {scope['method']} is not allowed here; use GET or DELETE.")
        entry = self._store.get(principal.tenant, response_id)
        if entry is None:
            raise _not_found(response_id)
        if entry.response is None:  # held by an OpenAI upstream
            route = runtime.router.routes.get(entry.upstream)
            if route is None:
                raise _not_found(response_id)
            try:
                upstream = await runtime.client.send(
                    passthrough.upstream_request(route, f"responses/{response_id}", scope["method"])
                )
            except httpx.HTTPError as exc:
                raise map_transport_error(exc, route) from None
            if scope["method"] == "DELETE" and upstream.status_code < 400:
                self._store.delete(principal.tenant, response_id)
            content_type = upstream.headers.get("content-type", "application/json").encode("latin-1")
            return upstream.status_code, upstream.content, (b"content-type", content_type)
        if scope["method"] == "DELETE":
            self._store.delete(principal.tenant, response_id)
            deleted = {"id": response_id, "object": "response.deleted", "deleted": True}
            return 200, _ENCODER.encode(deleted), JSON_CONTENT_TYPE
        return 200, _ENCODER.encode(entry.response), JSON_CONTENT_TYPE
