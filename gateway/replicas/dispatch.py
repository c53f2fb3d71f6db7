"""Sending one request to a replica set: place it, forward it, and when it failed before any byte reached the
client (the replica refused the connection, reset it or timed out), take that replica out and retry once on
another. Upstreams without replicas are forwarded as they are."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from gateway.errors import UpstreamTimeout, UpstreamUnavailable
from gateway.recording import Outcome, RequestTracker
from gateway.routing import Route, Router

MAX_ATTEMPTS = 2


class _Started(Protocol):
    started: bool


async def forward_routed(
    router: Router,
    client: Any,
    route: Route,
    endpoint: str,
    body: dict[str, Any],
    namespace: str,
    tracker: RequestTracker,
    send: _Started,
    forward: Callable[[Route], Awaitable[Outcome]],
) -> Outcome:
    replica_set = router.replica_sets.get(route.name)
    if replica_set is None:
        return await forward(route)
    excluded: list[str] = []
    while True:
        placement = await replica_set.place(client, endpoint, body, namespace, tracker.model, excluded)
        tracker.placed(placement)
        try:
            return await forward(placement.route)
        except (UpstreamUnavailable, UpstreamTimeout):
            replica_set.failed(placement)
            if send.started or len(excluded) + 1 >= min(MAX_ATTEMPTS, len(replica_set.replicas)):
                raise
            excluded.append(placement.replica.url if placement.replica else "")
            tracker.failovers += 1
            replica_set.retried()
        finally:
            usage = tracker.usage
            replica_set.release(placement, usage.prompt_tokens if usage is not None else None)
