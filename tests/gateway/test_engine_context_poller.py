"""The gateway records each local engine's context (prefill speed and cache settings) in the background."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from gateway.config import UpstreamConfig
from gateway.engine_context import EngineContextPoller

STATS = {"capacity_tokens": 4096, "page_size": 1, "eviction": "lru", "ttl_s": None, "prefill_tokens_per_s": 950.0}


class Store:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, dict[str, Any]]] = []

    async def record_engine_context(self, upstream: str, stats: dict[str, Any]) -> None:
        self.recorded.append((upstream, stats))


def test_local_engines_are_polled_and_others_are_not():
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        if request.url.host == "down":
            return httpx.Response(503)
        return httpx.Response(200, json=STATS)

    upstreams = (
        UpstreamConfig(name="engine", url="http://engine:8001", kind="local_engine"),
        UpstreamConfig(name="broken", url="http://down:8001", kind="local_engine"),
        UpstreamConfig(name="hosted", url="http://api.example", kind="openai"),
    )
    store = Store()

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            await EngineContextPoller(lambda: client, store, upstreams).poll_once()

    asyncio.run(scenario())
    assert asked == ["http://engine:8001/v1/cache", "http://down:8001/v1/cache"]
    assert store.recorded == [("engine", STATS)]
