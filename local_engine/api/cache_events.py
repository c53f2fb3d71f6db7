"""`GET /v1/cache/events` (cursor poll) and `GET /v1/cache/events/snapshot` (resync): the prefix cache's block
events for cache-aware routers (see `local_engine.cache.events` for the format)."""

from __future__ import annotations

from litestar import get
from litestar.datastructures import State
from litestar.params import FromQuery

from local_engine.cache.events import CacheEventLog
from local_engine.errors import EngineError, InvalidRequest

_MAX_EVENTS = 5000


class NotFound(EngineError):
    status_code = 404
    error_type = "not_found_error"


def _event_log(state: State) -> CacheEventLog:
    events = getattr(state.engine.cache, "events", None)
    if events is None:
        raise NotFound("this engine runs without a prefix cache, so it publishes no cache events")
    return events


@get("/v1/cache/events")
async def cache_events(state: State, after: FromQuery[int] = 0, limit: FromQuery[int] = 1000) -> dict:
    """Events with `seq > after` (at most `limit`, up to 5000); `gap: true` means resync from the snapshot."""
    if after < 0:
        raise InvalidRequest("after must be a non-negative sequence number", param="after")
    if limit <= 0:
        raise InvalidRequest("limit must be positive", param="limit")
    return _event_log(state).since(after, min(limit, _MAX_EVENTS))


@get("/v1/cache/events/snapshot")
async def cache_events_snapshot(state: State) -> dict:
    """Every block held now, per namespace, with the sequence number it is current as of."""
    return _event_log(state).snapshot()
