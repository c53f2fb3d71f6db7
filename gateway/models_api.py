"""`GET /v1/models`: the union of every upstream's model list, plus the models routed by name in the config."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.errors import UpstreamUnavailable
from gateway.runtime import Runtime
from gateway.upstreams.route import Route


async def _fetch(runtime: Runtime, route: Route) -> list[dict[str, Any]]:
    response = await runtime.client.get(
        f"{route.upstream.api_base}/models", headers=route.headers, timeout=route.timeout
    )
    response.raise_for_status()
    data = response.json().get("data", [])
    return [item for item in data if isinstance(item, dict) and isinstance(item.get("id"), str)]


async def list_models(runtime: Runtime) -> dict[str, Any]:
    routes = list(runtime.router.routes.values())
    results = await asyncio.gather(*(_fetch(runtime, route) for route in routes), return_exceptions=True)
    seen: dict[str, dict[str, Any]] = {}
    failures = []
    for route, result in zip(routes, results, strict=True):
        if isinstance(result, BaseException):
            failures.append(f"{route.name}: {type(result).__name__}")
            continue
        for item in result:
            seen.setdefault(item["id"], item)
    if failures and not seen:
        raise UpstreamUnavailable("No upstream answered /v1/models (" + ", ".join(failures) + ").")
    for model in runtime.config.routes:
        seen.setdefault(model, {"id": model, "object": "model", "created": 0, "owned_by": "prefixscope"})
    return {"object": "list", "data": list(seen.values())}
