"""The Litestar application: hot completions endpoints as raw ASGI handlers, the rest as ordinary handlers.

`create_app(config, storage)` wires everything; the lifespan opens the shared upstream client, starts the record
writer (after migrating the schema) and the key refresher, and closes them in reverse order.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

import httpx
import msgspec
from litestar import Litestar, Request, Response, asgi, get

from gateway.advisor.sampler import AdviceSampler
from gateway.anthropic.handler import CountTokens, MessagesProxy
from gateway.auth import KeySnapshot, KeyStore
from gateway.config import GatewayConfig
from gateway.conversations.tracker import ConversationTracker
from gateway.edge_errors import exception_handlers
from gateway.engine_context import EngineContextPoller
from gateway.explain.explainer import Explainer
from gateway.explain.uplift import UpliftChecker
from gateway.http_client import make_http_client
from gateway.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from gateway.metrics import RECORD_COUNTERS, GatewayMetrics
from gateway.models_api import list_models
from gateway.openapi import openapi_document
from gateway.parsing import CHAT, COMPLETIONS
from gateway.proxy import CompletionProxy
from gateway.record_keys import RecordHasher
from gateway.record_sinks import RecordSink
from gateway.recording import Recorder
from gateway.replicas.health_view import replica_health, upstreams_without_replicas
from gateway.responses.handler import ResponseResource, ResponsesProxy
from gateway.responses.store import ResponseStore
from gateway.routing import Router
from gateway.runtime import Runtime
from gateway.conversations_api import make_conversation_handlers
from gateway.stats_api import make_stats_handler
from gateway.telemetry.setup import start_request_spans
from gateway.tenancy import SaltDeriver, load_or_create_secret

log = logging.getLogger(__name__)


class Storage(Protocol):
    """What the app needs from the database layer (`gateway.storage.DatabaseStorage` in production)."""

    sink: RecordSink

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def load_keys(self) -> KeySnapshot: ...

    def verify_key(self, plaintext: str, entries: Any) -> Any: ...

    async def stats(
        self, since: Any, until: Any, bucket: str, group_by: str | None, tenant: str | None
    ) -> list[Any]: ...

    async def conversations(self, since: Any, until: Any, tenant: str | None, limit: int) -> list[Any]: ...

    async def conversation(self, conversation_id: str, tenant: str | None) -> Any | None: ...


def create_app(config: GatewayConfig, storage: Storage, *, freeze_gc_after_start: bool = False) -> Litestar:
    """Build the gateway app. Nothing touches the network or the database until the app starts.

    `freeze_gc_after_start` (for a gateway that owns its process) moves everything allocated during start-up
    (modules, the ORM, the schema migration) out of the cyclic garbage collector's reach: otherwise a full
    collection walks all of it and stalls the event loop for a hundred milliseconds or more.
    """
    secret = config.server_secret or load_or_create_secret(config.secret_file)
    metrics = GatewayMetrics()
    metrics.watch_recorder(storage.sink.counters)
    keys = KeyStore(
        storage.load_keys,
        storage.verify_key,
        config.key_refresh_interval_s,
        open_mode=config.open_mode,
        max_staleness_s=config.max_key_staleness_s,
        save_snapshot=getattr(storage, "save_key_snapshot", None),
        read_saved_snapshot=getattr(storage, "read_saved_key_snapshot", None),
    )
    metrics.open_mode.set(1 if config.open_mode else 0)

    def on_keys(snapshot: KeySnapshot) -> None:
        metrics.keys_loaded.set(len(snapshot.entries))

    keys.on_change = on_keys
    hasher = RecordHasher(secret)
    recorder = Recorder(storage.sink, metrics, hasher=hasher)
    runtime = Runtime(
        config=config,
        client=httpx.AsyncClient(),  # replaced by the pooled client when the app starts
        keys=keys,
        salts=SaltDeriver(secret),
        router=Router(config),
        recorder=recorder,
        metrics=metrics,
        spans=start_request_spans(config, metrics.registry),
    )
    metrics.replicas.watch(lambda: runtime.router.replica_sets.values())
    uplift = UpliftChecker(lambda: runtime.client, recorder.record)
    conversations = ConversationTracker(hasher.key_for)
    runtime.returned_calls = conversations.returned
    explainer = Explainer(uplift, conversations=conversations)
    advisor = AdviceSampler(lambda: runtime.client, fleet_key=hasher.fleet_key())
    recorder.compose(explainer=explainer, uplift=uplift, advisor=advisor)
    engine_context = EngineContextPoller(lambda: runtime.client, storage, config.upstreams)

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        runtime.client = make_http_client(config)
        await storage.start()
        await runtime.router.start()
        try:
            await keys.start()
            engine_context.start()
            if freeze_gc_after_start:
                gc.collect()
                gc.freeze()
            try:
                yield
            finally:
                await engine_context.stop()
                await keys.stop()
        finally:
            try:
                await advisor.stop()  # the rule advice estimates in flight submit their records
                await explainer.stop()  # the uplift checks in flight submit their records
            finally:
                await runtime.router.stop()
                await runtime.client.aclose()
                await storage.stop()
                if runtime.spans is not None:
                    await asyncio.to_thread(runtime.spans.tracing.shutdown)  # exports what is queued

    chat = CompletionProxy(runtime, CHAT)
    completions = CompletionProxy(runtime, COMPLETIONS)

    @asgi("/v1/chat/completions", copy_scope=False)
    async def chat_completions(scope: Any, receive: Any, send: Any) -> None:
        await chat(scope, receive, send)

    @asgi("/v1/completions", copy_scope=False)
    async def legacy_completions(scope: Any, receive: Any, send: Any) -> None:
        await completions(scope, receive, send)

    messages = MessagesProxy(runtime)
    count_tokens = CountTokens(runtime)

    @asgi("/v1/messages", copy_scope=False)
    async def anthropic_messages(scope: Any, receive: Any, send: Any) -> None:
        await messages(scope, receive, send)

    @asgi("/v1/messages/count_tokens", copy_scope=False)
    async def anthropic_count_tokens(scope: Any, receive: Any, send: Any) -> None:
        await count_tokens(scope, receive, send)

    response_store = ResponseStore(config.responses, recorder.hash_key)
    responses = ResponsesProxy(runtime, response_store, runtime.baselines)
    response_resource = ResponseResource(runtime, response_store)

    # Mounted (the path below it is the response id): `POST /v1/responses` creates, `/v1/responses/{id}` reads.
    @asgi("/v1/responses", is_mount=True, copy_scope=False)
    async def openai_responses(scope: Any, receive: Any, send: Any) -> None:
        response_id = scope["path"].strip("/")
        await (response_resource(scope, receive, send, response_id) if response_id else responses(scope, receive, send))

    @get("/health", sync_to_thread=False)
    def health() -> Response[dict[str, Any]]:
        counters = storage.sink.counters()
        refused = keys.refusal_reason()
        unserved = upstreams_without_replicas(runtime.router)
        # "degraded", for `reason`: the gateway refuses every request (HTTP 503), or an upstream has no replica in
        # rotation (HTTP 503 when it is the default upstream, else 200: other upstreams still serve).
        reason = refused
        if reason is None and unserved:
            reason = f"no replica of upstream {', '.join(map(repr, unserved))} is in rotation"
        unavailable = refused is not None or config.default_upstream in unserved
        body = {
            "status": "ok" if reason is None else "degraded",
            "reason": reason,
            "open_mode": keys.open_mode,
            "api_keys": keys.num_active_keys,
            "key_snapshot_age_s": None if (age := keys.snapshot_age_s) is None else round(age, 1),
            "upstreams": [
                {"name": u.name, "kind": u.kind, "url": u.url, **replica_health(runtime.router, u.name)}
                for u in config.upstreams
            ],
            "durability": config.recorder.durability,
            # Not before the database has been reached at all (down at start-up: the migration is still retried).
            "database_available": bool(getattr(counters, "database_available", True))
            and bool(getattr(storage, "migrated", True)),
            "records": {
                name: int(getattr(counters, name, 0))
                for name in (*RECORD_COUNTERS, "pending_spill", "journaled_pending", "held", "accepted")
            },
            "rule_advice": {
                "sampled": advisor.sampled,
                "failed": advisor.failed,
                "skipped": advisor.skipped,
                "pending": advisor.pending,
                "cpu_s": round(advisor.capacity.cpu_s_total, 3),
            },
        }
        return Response(content=body, status_code=503 if unavailable else 200)

    @get("/metrics", sync_to_thread=False)
    def metrics_endpoint() -> Response[bytes]:
        return Response(content=metrics.exposition(), media_type=METRICS_CONTENT_TYPE)

    @get("/v1/models")
    async def models(request: Request[Any, Any, Any]) -> dict[str, Any]:
        await keys.authenticate_now(request.headers.get("authorization"))
        return await list_models(runtime)

    stats_handler = make_stats_handler(keys, storage)
    conversation_handlers = make_conversation_handlers(keys, storage)
    openapi_body = msgspec.json.encode(openapi_document())

    @get("/openapi.json", sync_to_thread=False)
    def openapi() -> Response[bytes]:
        return Response(content=openapi_body, media_type="application/json")

    return Litestar(
        route_handlers=[
            chat_completions,
            legacy_completions,
            anthropic_messages,
            anthropic_count_tokens,
            openai_responses,
            health,
            metrics_endpoint,
            models,
            stats_handler,
            *conversation_handlers,
            openapi,
        ],
        lifespan=[lifespan],
        exception_handlers=exception_handlers(metrics),
        openapi_config=None,
        logging_config=None,
    )
