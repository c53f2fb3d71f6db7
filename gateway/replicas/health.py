"""Health checks of one replica: `GET /health` every `health_interval_s`; a replica that fails it (or a request) is
taken out, and put back when it answers again, with its approximate index cleared (a restarted engine holds nothing)
and its KV-event index rebuilt from a replay (`gateway.replicas.event_subscriber`)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from gateway.replicas.replica_set import Replica

log = logging.getLogger(__name__)


async def check_health(client: httpx.AsyncClient, replica: Replica) -> bool:
    try:
        response = await client.get(replica.health_url, headers=replica.auth_headers)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


async def health_loop(client: httpx.AsyncClient, replica: Replica, interval_s: float) -> None:
    while True:
        healthy = await check_health(client, replica)
        if healthy and not replica.healthy:
            log.info("replica %s is back", replica.url)
            replica.mark_healthy()
        elif not healthy and replica.healthy:
            log.warning("replica %s failed its health check; taken out", replica.url)
            replica.mark_unhealthy()
        await asyncio.sleep(interval_s)
