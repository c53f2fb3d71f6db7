"""The time range and row limit of the read commands and the gateway's read endpoints, validated once for both:
`prefixscope stats` and `prefixscope conversations` exit with status 2 and the message, `GET /api/stats` and
`GET /api/conversations` answer a 400 naming the parameter. Cheap to import (no SQLAlchemy)."""

from __future__ import annotations

from datetime import datetime

from db.timeutil import parse_moment, utc_now

_SHOWN_CHARS = 100  # a longer value is shown cut, with `...`


class QueryParamError(ValueError):
    """A parameter value that is not usable; `param` names the parameter (`since`, `until`, `limit`)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def time_range(
    since: str | None, until: str | None, default_since: str, now: datetime | None = None
) -> tuple[datetime, datetime]:
    """`[since, until)` as timezone-aware UTC datetimes. Each bound is a duration before `now` (`24h`, `7d`), `now` or
    an ISO 8601 timestamp; an empty or missing `since` is `default_since`, `until` is `now`. Raises `QueryParamError`
    for a value that is not a time or lies outside the calendar (`3000000d`), and when `since` is not before `until`."""
    now = now or utc_now()
    start = _moment(since or default_since, "since", now)
    end = _moment(until or "now", "until", now)
    if start >= end:
        raise QueryParamError("'since' must be earlier than 'until'.", "since")
    return start, end


def row_limit(value: str | int | None, default: int, maximum: int) -> int:
    """The number of rows asked for, `default` when `value` is None; raises `QueryParamError` unless it is a whole
    number from 1 to `maximum`."""
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= maximum:
        raise QueryParamError(f"limit must be a whole number from 1 to {maximum}.", "limit")
    return number


def _moment(text: str, name: str, now: datetime) -> datetime:
    try:
        return parse_moment(text, now)
    except ValueError as exc:
        shown = text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."
        message = str(exc) if len(text) <= _SHOWN_CHARS else f"not a usable time: {shown!r}"
        raise QueryParamError(f"{name}: {message}", name) from None
