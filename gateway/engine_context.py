"""Recording each local engine's context with the history: its measured prefill speed and cache settings.

A background task asks every `local_engine` upstream for `GET /v1/cache` (aggregate statistics, read with the upstream's API key) once at
start-up and then every `interval_s`, and hands the answer to the storage, which records it per upstream
(`db.engine_context`). A failed poll is logged at debug level and retried on the next round; nothing here touches
the request path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import httpx

from gateway.config import UpstreamConfig

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 60.0
FIRST_POLL_DELAY_S = 2.0


class ContextStore(Protocol):
    async def record_engine_context(self, upstream: str, stats: dict[str, Any]) -> None: ...


class EngineContextPoller:
    """Polls the local engines' cache stats and records them; `start` / `stop` from the app's lifespan."""

    def __init__(
        self,
        client: Callable[[], httpx.AsyncClient],
        store: ContextStore,
        upstreams: Sequence[UpstreamConfig],
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        self._client = client
        self._store = store
        self._upstreams = [u for u in upstreams if u.kind == "local_engine"]
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self.recorded = 0

    def start(self) -> None:
        if self._upstreams and hasattr(self._store, "record_engine_context"):
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def poll_once(self) -> None:
        for upstream in self._upstreams:
            try:
                headers = {"authorization": f"Bearer {upstream.api_key}"} if upstream.api_key else None
                response = await self._client().get(
                    upstream.url.rstrip("/") + "/v1/cache", headers=headers, timeout=10.0
                )
                stats = response.json() if response.status_code == 200 else None
                if isinstance(stats, dict):
                    await self._store.record_engine_context(upstream.name, stats)
                    self.recorded += 1
            except Exception as exc:  # noqa: BLE001 - a missing context must never disturb the gateway
                log.debug("could not record the engine context of %s: %s", upstream.name, exc)

    async def _run(self) -> None:
        await asyncio.sleep(FIRST_POLL_DELAY_S)
        while True:
            await self.poll_once()
            await asyncio.sleep(self._interval_s)
