"""Retention classes: how long an engine keeps a request's cached prefix, chosen per tenant and per request.

A tenant has a default class (`cache_retention`, absent: none is sent and the engine's own default applies) and a
ceiling (`max_cache_retention`). A client may ask for a class in the body (`cache_retention`, as the local engine takes
it); it gets at most the ceiling: a longer ask is lowered to it, never refused, and the response says which class was
applied (`x-prefixscope-cache-retention`). An unknown class is the client's error (400, param `cache_retention`).

Example (in `prefixscope.toml`)::

    [tenant_defaults]
    max_cache_retention = "1h"        # 5m | 1h | persistent (the default: no ceiling)

    [tenants.acme]
    cache_retention = "1h"            # sent when the request names no class
    max_cache_retention = "persistent"
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from db.records import RETENTION_CLASSES
from gateway.errors import BadRequest

REQUEST_FIELD = "cache_retention"  # the body field clients send and the local engine takes
HEADER_RETENTION = "x-prefixscope-cache-retention"  # the class the gateway applied, on the response
_JSON_TYPES = {bool: "boolean", dict: "object", list: "array"}


def requested_retention(body: Mapping[str, Any]) -> str | None:
    """The class a request body asks for (`cache_retention`; absent or null: None). Raises `BadRequest` (param
    `cache_retention`) for anything but a known class."""
    value = body.get(REQUEST_FIELD)
    if value is None:
        return None
    if not isinstance(value, str) or value not in RETENTION_CLASSES:
        if isinstance(value, str):
            shown = repr(value) if len(value) <= 40 else repr(value[:40]) + "..."
        else:
            shown = f"a value of JSON type {_JSON_TYPES.get(type(value), 'number')}"
        raise BadRequest(
            f"Invalid value for 'cache_retention': {shown}. Supported values are: "
            + ", ".join(f"'{name}'" for name in RETENTION_CLASSES)
            + ".",
            param=REQUEST_FIELD,
            code="invalid_value",
        )
    return value


def retention_header(retention: str | None) -> list[tuple[bytes, bytes]]:
    """The response header naming the applied class (none when no class was sent)."""
    return [] if retention is None else [(HEADER_RETENTION.encode(), retention.encode())]
