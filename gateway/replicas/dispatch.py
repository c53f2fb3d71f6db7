"""Sending one request to a replica set: place it, forward it, and when it failed before any byte reached the
client (the replica refused the connection, reset it or timed out), take that replica out and retry once on
another. Upstreams without replicas are forwarded as they are."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from gateway.errors import UpstreamTimeout, UpstreamUnavailable
from gateway.replicas.replica_set import Placement, ReplicaSet
from gateway.upstreams.base import UsageReport
from gateway.upstreams.route import Route

MAX_ATTEMPTS = 2
Outcome = TypeVar("Outcome")  # what `forward` answers (`gateway.recording.Outcome`), passed through


class _Started(Protocol):
    started: bool


class HasReplicaSets(Protocol):
    """The replica sets by upstream name (`gateway.routing.Router`)."""

    @property
    def replica_sets(self) -> Mapping[str, ReplicaSet]: ...


class PlacedRequest(Protocol):
    """What dispatch reads and tells about one request (`gateway.recording.RequestTracker`)."""

    model: str
    usage: UsageReport | None
    failovers: int

    def placed(self, placement: Placement) -> None: ...


async def forward_routed(
    router: HasReplicaSets,
    client: Any,
    route: Route,
    endpoint: str,
    body: dict[str, Any],
    namespace: str,
    tracker: PlacedRequest,
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
