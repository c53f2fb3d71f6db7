"""`GET /v1/cache/events?after=SEQ`: the KV-event stream's retained batches over HTTP, a view of exactly what the
ZeroMQ publisher sends (`local_engine.kv_events`), for looking at it with curl; routers subscribe over ZeroMQ."""

from __future__ import annotations

from litestar import get
from litestar.datastructures import State
from litestar.params import FromQuery

from local_engine.errors import EngineError, InvalidRequest
from local_engine.kv_events.publisher import KvEventPublisher

_MAX_BATCHES = 1000


class NotFound(EngineError):
    status_code = 404
    error_type = "not_found_error"


def _publisher(state: State) -> KvEventPublisher:
    publisher = getattr(state.engine, "kv_events", None)
    if publisher is None:
        raise NotFound("this engine runs without a prefix cache, so it publishes no cache events")
    return publisher


@get("/v1/cache/events")
async def cache_events(state: State, after: FromQuery[int] = -1, limit: FromQuery[int] = 100) -> dict:
    """Batches with `seq > after` (at most `limit`, up to 1000), each `{seq, ts, events}` with the events in the
    wire's array form; `gap: true` when some batch after `after` is no longer retained."""
    if after < -1:
        raise InvalidRequest("after must be a sequence number (-1: from the first retained batch)", param="after")
    if limit <= 0:
        raise InvalidRequest("limit must be positive", param="limit")
    return _publisher(state).since(after, min(limit, _MAX_BATCHES))
