"""Sending one request to a replica set: place it, forward it, and when it failed before any byte reached the
client (the replica refused the connection, reset it or timed out), take that replica out and retry once on
another. Upstreams without replicas are forwarded as they are."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from gateway.errors import UpstreamTimeout, UpstreamUnavailable
from gateway.replicas.replica_set import Placement, ReplicaSet
from gateway.request_stages import Answered, ExplainContextLike, Placed
from gateway.upstreams.route import Route

MAX_ATTEMPTS = 2
Outcome = TypeVar("Outcome")  # what `forward` answers (`gateway.request_stages.Outcome`), passed through


class _Started(Protocol):
    started: bool


class HasReplicaSets(Protocol):
    """The replica sets by upstream name (`gateway.routing.Router`)."""

    @property
    def replica_sets(self) -> Mapping[str, ReplicaSet]: ...


class PlacedRequest(Protocol):
    """What dispatch reads and tells about one request (`gateway.recording.RequestTracker`)."""

    @property
    def model(self) -> str: ...

    @property
    def answer(self) -> Answered | None: ...

    @property
    def explain(self) -> ExplainContextLike | None: ...

    def placed(self, stage: Placed) -> None: ...


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
    placement: Placement | None = None
    try:
        while True:
            placement = await replica_set.place(client, endpoint, body, namespace, tracker.model, excluded)
            explain = tracker.explain
            if explain is not None:
                explain.route = placement.route  # the uplift check asks the replica that served the request
            try:
                return await forward(placement.route)
            except (UpstreamUnavailable, UpstreamTimeout):
                replica_set.failed(placement)
                if send.started or len(excluded) + 1 >= min(MAX_ATTEMPTS, len(replica_set.replicas)):
                    raise
                excluded.append(placement.replica.url if placement.replica else "")
                replica_set.retried()
            finally:
                answer = tracker.answer
                usage = answer.usage if answer is not None else None
                replica_set.release(placement, usage.prompt_tokens if usage is not None else None)
    finally:
        if placement is not None:
            tracker.placed(Placed.of(placement, len(excluded)))  # the last replica tried is the one recorded
