"""`GET /api/stats`: request history from the database, scoped to what the caller may see.

Query parameters: `since` and `until` (a duration before now such as `24h`, `now`, or an ISO timestamp),
`bucket` (`1h`, `1d`, ...), `group_by` (`tenant`, `model` or `upstream`) and `tenant`, each at most once. The key
comes in `Authorization: Bearer` or `x-api-key`. Admin keys see every
tenant (optionally one, with `tenant=`); a tenant key sees only its own tenant, and asking for another is a 403.
In open mode (no key exists yet) the caller is treated as an admin, as every request is.
This endpoint awaits the database; it is not on the request path.

The answer: `data`, one object per bucket (and group) with the history's figures, among them `tiers` (cached tokens
by the tier that served them: `device`, `host`, `disk`, and `unknown` for upstreams that do not report tiers; the four
add up to `cached_tokens`), the cache load time (`cache_load_ms_total`, `cache_load_ms_mean`) and
`requests_by_retention`; and `totals`, those figures summed over every row (`db.queries.tier_totals`).
"""

from __future__ import annotations

from typing import Any, Protocol

import msgspec
from litestar import Request, Response, get

from gateway.api_params import authorization, readable_tenant, short_text, single, time_range
from gateway.auth import KeyStore
from gateway.errors import BadRequest, ServiceUnavailable

GROUP_BY = ("tenant", "model", "upstream")


class StatsSource(Protocol):
    async def stats(
        self, since: Any, until: Any, bucket: str, group_by: str | None, tenant: str | None
    ) -> list[Any]: ...


def make_stats_handler(keys: KeyStore, source: StatsSource) -> Any:
    from db.queries.results import CacheFigures
    from db.queries.tiers import tier_totals

    @get("/api/stats")
    async def stats(request: Request[Any, Any, Any]) -> Response[bytes]:
        principal = await keys.authenticate_now(authorization(request.headers))
        params = request.query_params
        since, until = time_range(params)
        for name in ("bucket", "group_by"):
            value = single(params, name)
            if value is not None:
                short_text(value, name, 200)
        bucket = single(params, "bucket") or "1h"
        group_by = single(params, "group_by") or None
        if group_by is not None and group_by not in GROUP_BY:
            raise BadRequest(f"group_by must be one of {', '.join(GROUP_BY)}.", param="group_by")
        tenant = readable_tenant(principal, single(params, "tenant") or None, "statistics")
        try:
            rows = await source.stats(since, until, bucket, group_by, tenant)
        except ValueError as exc:  # unknown bucket and the like
            raise BadRequest(str(exc), param="bucket") from None
        except Exception as exc:
            raise ServiceUnavailable(f"The database could not be queried: {type(exc).__name__}.") from None
        body = {
            "since": since,
            "until": until,
            "bucket": bucket,
            "group_by": group_by,
            "tenant": tenant,
            # A source that answers something else than history rows (a test double) has no totals to fold.
            "totals": msgspec.to_builtins(tier_totals(rows)) if all(isinstance(row, CacheFigures) for row in rows)
            else None,
            "data": msgspec.to_builtins(rows),
        }
        return Response(content=msgspec.json.encode(body), media_type="application/json")

    return stats

