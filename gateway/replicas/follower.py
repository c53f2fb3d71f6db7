"""Background upkeep of one replica: its health checks and, for engines that publish them, its cache events.

Health: `GET /health` every `health_interval_s`; a replica that fails it (or a request) is taken out, and put back
when it answers again, with its approximate index cleared (a restarted engine holds nothing) and its event cursor
dropped (the follower resyncs).

Events: a cursor poll of `GET /v1/cache/events?after=SEQ`; a gap (events lost from the engine's window) or a new
epoch (the engine restarted) triggers a resync from `GET /v1/cache/events/snapshot`. An engine that answers 404
publishes nothing; it is asked again now and then.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from gateway.replicas.replica_set import Replica

log = logging.getLogger(__name__)

_EVENT_PAGE = 1000
_NO_EVENTS_RETRY_S = 30.0


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


async def resync(client: httpx.AsyncClient, replica: Replica) -> bool:
    """Rebuild the precise index from the engine's snapshot. False when the engine publishes no events."""
    response = await client.get(replica.snapshot_url, headers=replica.auth_headers)
    if response.status_code == 404:
        replica.publishes_events = False
        return False
    response.raise_for_status()
    snapshot = response.json()
    replica.precise.reset({str(ns): hashes for ns, hashes in snapshot["namespaces"].items()})
    replica.event_epoch = str(snapshot["epoch"])
    replica.event_cursor = int(snapshot["seq"])
    replica.event_block_size = int(snapshot["block_size"])
    replica.publishes_events = True
    replica.events_synced = True
    replica.resyncs += 1
    return True


async def poll_once(client: httpx.AsyncClient, replica: Replica) -> int:
    """Apply the next page of events; returns how many were applied (a gap or a new epoch unsyncs the replica)."""
    response = await client.get(
        replica.events_url, params={"after": replica.event_cursor, "limit": _EVENT_PAGE}, headers=replica.auth_headers
    )
    response.raise_for_status()
    page = response.json()
    if page.get("gap") or page.get("epoch") != replica.event_epoch:
        replica.events_synced = False
        replica.gaps += 1
        return 0
    events = page.get("events") or []
    for event in events:
        replica.precise.apply(event)
        replica.event_cursor = int(event["seq"])
    return len(events)


async def event_loop(client: httpx.AsyncClient, replica: Replica, poll_interval_s: float) -> None:
    while True:
        try:
            if not replica.healthy:
                await asyncio.sleep(poll_interval_s)
                continue
            if not replica.events_synced and not await resync(client, replica):
                await asyncio.sleep(_NO_EVENTS_RETRY_S)
                continue
            if await poll_once(client, replica) < _EVENT_PAGE:
                await asyncio.sleep(poll_interval_s)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            log.debug("cache events of %s: %s", replica.url, exc)
            replica.events_synced = False
            await asyncio.sleep(poll_interval_s * 5)
