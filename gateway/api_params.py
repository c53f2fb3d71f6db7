"""Query parameters shared by the gateway's read endpoints (`/api/stats`, `/api/conversations`): the time range and
the tenant a key may read. Each refuses a bad value with a 400 (or 403) naming the parameter."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gateway.auth import Principal, credentials
from gateway.errors import BadRequest, Forbidden


def time_range(params: Any, default_since: str = "24h") -> tuple[datetime, datetime]:
    """`since` (default `default_since` before now) and `until` (default now): a duration before now such as `24h`,
    `now`, or an ISO timestamp; `since` must come first (`db.query_params.time_range`, as the CLI validates them)."""
    from db.query_params import QueryParamError
    from db.query_params import time_range as parse_range

    try:
        return parse_range(single(params, "since"), single(params, "until"), default_since)
    except QueryParamError as exc:
        raise BadRequest(str(exc), param=exc.param) from None


def row_limit(params: Any, default: int, maximum: int) -> int:
    """`limit`: a whole number from 1 to `maximum` (`default` when absent; `db.query_params.row_limit`)."""
    from db.query_params import QueryParamError
    from db.query_params import row_limit as parse_limit

    try:
        return parse_limit(single(params, "limit"), default, maximum)
    except QueryParamError as exc:
        raise BadRequest(str(exc), param=exc.param) from None


def single(params: Any, name: str) -> str | None:
    """The one value of query parameter `name` (None when absent); given more than once, a 400 naming it."""
    values = params.getall(name, []) if hasattr(params, "getall") else ([params[name]] if name in params else [])
    if len(values) > 1:
        raise BadRequest(f"{name} must be given at most once.", param=name)
    return values[0] if values else None


def authorization(headers: Any) -> str | None:
    """The credentials to authenticate (`gateway.auth.credentials`): `x-api-key` (Anthropic's header), else
    `Authorization`."""
    return credentials(headers.get("authorization"), headers.get("x-api-key"))


def readable_tenant(principal: Principal, asked: str | None, what: str) -> str | None:
    """The tenant the caller may read `what` of: an admin's choice (None: every tenant), a tenant key's own (naming
    another is a 403)."""
    if asked is not None:
        short_text(asked, "tenant", 200)
    if principal.is_admin:
        return asked
    if asked is not None and asked != principal.tenant:
        raise Forbidden(f"This key may only read its own tenant's {what}.", param="tenant")
    return principal.tenant


def short_text(value: str, name: str, max_chars: int) -> None:
    """Refuse a value over `max_chars` characters or holding NUL."""
    if "\x00" in value or len(value) > max_chars:
        raise BadRequest(f"{name} must be at most {max_chars} characters, without NUL.", param=name)
