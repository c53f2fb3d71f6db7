"""Query parameters shared by the gateway's read endpoints (`/api/stats`, `/api/conversations`): the time range and
the tenant a key may read. Each refuses a bad value with a 400 (or 403) naming the parameter."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gateway.auth import Principal
from gateway.errors import BadRequest, Forbidden


def time_range(params: Any, default_since: str = "24h") -> tuple[datetime, datetime]:
    """`since` (default `default_since` before now) and `until` (default now): a duration before now such as `24h`,
    `now`, or an ISO timestamp; `since` must come first."""
    from db.timeutil import parse_moment, utc_now

    now = utc_now()
    since = _moment(parse_moment, params, "since", default_since, now)
    until = _moment(parse_moment, params, "until", "now", now)
    if since >= until:
        raise BadRequest("'since' must be earlier than 'until'.", param="since")
    return since, until


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


def _moment(parse_moment: Any, params: Any, name: str, default: str, now: Any) -> Any:
    """A query parameter as a time; a value that is not one, or lies outside the calendar, is a 400 naming it."""
    text = params.get(name) or default
    try:
        return parse_moment(text, now)
    except (ValueError, OverflowError) as exc:
        shown = text if len(text) <= 100 else text[:100] + "..."
        message = str(exc) if isinstance(exc, ValueError) and len(text) <= 100 else f"not a usable time: {shown!r}"
        raise BadRequest(f"{name}: {message}", param=name) from None
