"""The engine's OpenAI-compatible HTTP API (Litestar), plus health, Prometheus metrics and the read-only cache API."""

from __future__ import annotations

import hmac
import logging
import threading
import time

from litestar import Litestar, Request, get, post
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.params import FromQuery
from litestar.response import Response, Stream

from local_engine.api.access import access_guard
from local_engine.api.access_log import AccessLoggedApp, access_record
from local_engine.cache.tiers import RETENTION_CLASSES
from local_engine.api.cache_events import cache_events
from local_engine.kv_events.tokenizer_api import tokenizer_description
from local_engine.config import ServerConfig
from local_engine.api.disconnect import cancel_on_disconnect
from local_engine.engine.engine import Engine
from local_engine.api.choices import ChoiceCollector
from local_engine.engine.types import Finished, GenerationRequest, PromptLogprobs, TokenDelta
from local_engine.errors import EngineError, Forbidden, InvalidRequest, Unauthorized
from local_engine.api.match_details import HEADER_TTFT_MS, describe_match
from local_engine.api.logprobs_format import TokenStrings
from local_engine.api.metrics import render_metrics
from local_engine.api.openapi import openapi_document
from local_engine.api.protocol import (
    CHAT,
    COMPLETIONS,
    parse_hash_chain_request,
    parse_json_body,
    parse_prompt,
    parse_request,
)
from local_engine.api.fields import optional_choice
from local_engine.api.responses import (
    ChunkWriter,
    completion_body,
    hash_chain_object,
    match_headers,
    new_response_id,
    tool_call_stream,
)
from local_engine.api.tracing import EngineSpans, RequestTrace
from prefixscope.tracing import Tracing

_MAX_TREE_NODES = 5000
log = logging.getLogger(__name__)


async def _generate(request: Request, state: State, endpoint: str) -> Response | Stream:
    """A completion, with its spans when the engine exports them (`local_engine.api.tracing`)."""
    trace = state.spans.begin(request.headers, endpoint) if state.spans is not None else None
    try:
        return await _complete(request, state, endpoint, trace)
    except Exception as exc:
        if trace is not None:
            trace.fail(getattr(exc, "error_type", type(exc).__name__), str(exc))
        raise


async def _complete(request: Request, state: State, endpoint: str, trace: RequestTrace | None) -> Response | Stream:
    engine: Engine = state.engine
    access = access_record(request.scope["state"])
    parsed = parse_request(parse_json_body(await request.body()), endpoint, engine.loaded)
    access.stream, access.prompt_tokens = parsed.stream, len(parsed.prompt_token_ids)
    if trace is not None:
        trace.submitted(parsed.model)
    handle = await engine.submit(
        GenerationRequest(parsed.prompt_token_ids, parsed.sampling, parsed.namespace, retention=parsed.retention)
    )
    report = describe_match(handle.report.result(), parsed.layout)
    access.cached_tokens = handle.report.result().matched_tokens
    headers = match_headers(report)
    response_id = access.request_id = new_response_id(endpoint)
    tools = lambda: tool_call_stream(parsed, engine.loaded.tokenizer)  # noqa: E731 - one splitter per choice
    strings = state.token_strings if parsed.sampling.logprobs is not None else None
    if not parsed.stream:
        collector = ChoiceCollector(parsed.sampling.num_sequences)
        try:
            async with cancel_on_disconnect(handle, request.receive):
                async for event in handle.stream():
                    collector.add(event)
        finally:
            handle.cancel()  # a no-op once finished; releases everything if the client went away
        for end in collector.ends:
            access.finished(end)
        choices = collector.best(parsed.sampling.n)
        headers[HEADER_TTFT_MS] = f"{choices[0].finished.timings.ttft_ms:.3f}"
        if trace is not None:
            trace.finish(choices[0].finished, report, response_id)
        body = completion_body(parsed, response_id, choices, report, tools, strings, collector.prompt, collector.ends)
        return Response(body, headers=headers)

    writer = ChunkWriter(parsed, response_id, tools, strings)

    async def events():
        ends = []
        try:
            first = writer.first()
            if first:
                yield first
            async for event in handle.stream():
                if isinstance(event, TokenDelta):
                    chunk = writer.text(event)
                    if chunk:
                        yield chunk
                elif isinstance(event, PromptLogprobs):
                    yield writer.prompt(event)
                elif isinstance(event, Finished):
                    ends.append(event)
                    access.finished(event)
                    if trace is not None:
                        trace.finish(event, report, response_id)  # the first sequence to end (`n` > 1)
                    yield writer.final(event)
            if parsed.include_usage:
                yield writer.usage(sorted(ends, key=lambda end: end.index), report)
            yield writer.done()
        except EngineError as exc:
            if trace is not None:
                trace.fail(exc.error_type, exc.message)
            yield writer.error(exc.body())
        finally:
            # Runs when the client disconnects mid-stream too: the engine then frees the request's locks and slots.
            handle.cancel()
            if trace is not None:
                trace.fail("cancelled", "the client went away")  # a no-op once the request finished

    return Stream(events(), media_type="text/event-stream", headers={**headers, "cache-control": "no-cache"})


@post("/v1/chat/completions", status_code=200)
async def chat_completions(request: Request, state: State) -> Response | Stream:
    return await _generate(request, state, CHAT)


@post("/v1/completions", status_code=200)
async def completions(request: Request, state: State) -> Response | Stream:
    return await _generate(request, state, COMPLETIONS)


@get("/v1/models")
async def models(state: State) -> dict:
    loaded = state.engine.loaded
    return {
        "object": "list",
        "data": [
            {
                "id": loaded.model_id,
                "object": "model",
                "created": state.started_at,
                "owned_by": "prefixscope",
                "max_model_len": loaded.context_window_tokens,
            }
        ],
    }


@get("/openapi.json", sync_to_thread=False)
def openapi(state: State) -> dict:
    """This API's OpenAPI 3.1 description (request bodies included)."""
    return state.openapi


@get("/health")
async def health(state: State) -> Response:
    """200 `ok` once the engine is ready (warmed up and started: local_engine.engine.warm_up), 503 `starting`
    before."""
    engine: Engine = state.engine
    ready = state.ready is None or state.ready.is_set()
    body = {
        "status": "ok" if ready else "starting",
        "model": engine.loaded.model_id,
        "device": str(engine.loaded.device),
        "prefix_cache": engine.config.prefix_cache,
    }
    return Response(body, status_code=200 if ready else 503)


@get("/metrics", media_type="text/plain; version=0.0.4")
async def metrics(state: State) -> bytes:
    return render_metrics(state.engine, state.spans.tracing if state.spans is not None else None)


@get("/v1/cache")
async def cache_stats(state: State) -> dict:
    return state.engine.cache_stats()


@get("/v1/cache/tree")
async def cache_tree(state: State, max_nodes: FromQuery[int] = 500) -> dict:
    if max_nodes <= 0:
        raise InvalidRequest("max_nodes must be positive", param="max_nodes")
    return state.engine.tree_snapshot(min(max_nodes, _MAX_TREE_NODES))


@post("/v1/cache/match", status_code=200)
async def cache_match(request: Request, state: State) -> dict:
    """Dry run: how much of this chat or completions request would come from cache. Nothing is locked or changed."""
    engine: Engine = state.engine
    body = parse_json_body(await request.body())
    endpoint = CHAT if body.get("messages") is not None else COMPLETIONS
    optional_choice(body, "cache_retention", RETENTION_CLASSES)  # the same request a completion would accept
    _, (token_ids, layout), namespace = parse_prompt(body, endpoint, engine.loaded)
    block_size = parse_hash_chain_request(body)
    result = describe_match(engine.dry_run_match(namespace, token_ids), layout).as_dict()
    if block_size:
        result["hash_chain"] = hash_chain_object(namespace, token_ids, block_size)
    return result


@post("/v1/cache/flush", status_code=200)
async def cache_flush(request: Request, state: State) -> dict:
    admin_token = state.server_config.admin_token
    if not admin_token:
        raise Forbidden("flushing is disabled: start the engine with --admin-token")
    supplied = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    if not hmac.compare_digest(supplied.encode(), admin_token.encode()):
        raise Unauthorized("a valid admin token is required to flush the cache")
    return {"flushed_tokens": state.engine.flush_cache()}


def _engine_error(request: Request, exc: EngineError) -> Response:
    return Response(exc.body(), status_code=exc.status_code)


def _http_error(request: Request, exc: HTTPException) -> Response:
    error_type = "invalid_request_error" if exc.status_code < 500 else "internal_error"
    if exc.status_code == 413:
        message = "the request body is too large"
    elif exc.status_code == 404:
        message = f"no route for {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    # Litestar's validation errors (a query parameter of the wrong type) say which parameter in `extra`.
    extra = exc.extra if isinstance(exc.extra, list) else []
    param = next((str(item["key"]) for item in extra if isinstance(item, dict) and item.get("key")), None)
    body = {"error": {"message": message, "type": error_type, "param": param, "code": None}}
    return Response(body, status_code=exc.status_code)


def _unexpected_error(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return _engine_error(request, EngineError(f"internal error: {type(exc).__name__}: {exc}"))


def create_app(engine: Engine, config: ServerConfig, ready: threading.Event | None = None,
               access_log: bool = True) -> Litestar:
    """The ASGI app; the caller starts and stops the engine. With `config.trace_export` it exports spans, and
    exports what is queued when the app stops. `ready`: `/health` says 503 `starting` until it is set (None: ready
    at once). `access_log`: one line per request on `local_engine.access` (local_engine.api.access_log)."""
    spans = None
    if config.trace_export is not None:
        spans = EngineSpans(Tracing(config.trace_export), engine.loaded.model_id)
    return (AccessLoggedApp if access_log else Litestar)(
        route_handlers=[chat_completions, completions, models, health, metrics, cache_stats, cache_tree, cache_match,
                        cache_flush, openapi, cache_events, tokenizer_description],
        state=State({"engine": engine, "server_config": config, "started_at": int(time.time()),
                     "openapi": openapi_document(), "token_strings": TokenStrings(engine.loaded.tokenizer),
                     "spans": spans, "ready": ready}),
        openapi_config=None,
        exception_handlers={EngineError: _engine_error, HTTPException: _http_error, Exception: _unexpected_error},
        guards=[access_guard(config.api_key, config.admin_token)],
        request_max_body_size=config.max_body_bytes,
        debug=False,
    )
