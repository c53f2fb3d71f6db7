"""UTC time helpers shared by the models, the rollups and the queries."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def utc_now() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(UTC)


def as_utc(moment: datetime) -> datetime:
    """`moment` in UTC; a naive datetime is taken to be UTC already (that is how SQLite hands them back)."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def iso_utc(moment: datetime) -> str:
    """RFC 3339 in UTC with a `Z` suffix (`2026-01-01T00:00:00Z`, microseconds when non-zero): the form msgspec
    writes, so `prefixscope stats --json` and `GET /api/stats` print the same timestamps."""
    return as_utc(moment).isoformat().replace("+00:00", "Z")


def floor_hour(moment: datetime) -> datetime:
    """The start of the UTC hour that contains `moment`."""
    return as_utc(moment).replace(minute=0, second=0, microsecond=0)


def floor_day(moment: datetime) -> datetime:
    """The start of the UTC day that contains `moment`."""
    return as_utc(moment).replace(hour=0, minute=0, second=0, microsecond=0)


def parse_duration(text: str) -> timedelta:
    """`"90s"`, `"30m"`, `"12h"`, `"7d"`, `"2w"` as a timedelta; raises ValueError otherwise (OverflowError for one
    longer than a timedelta holds)."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"not a duration: {text!r} (expected e.g. 30m, 12h, 7d, 2w)")
    return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()])


def parse_moment(text: str, now: datetime | None = None) -> datetime:
    """A point in time: a duration means "that long before now" (`"7d"`), otherwise an ISO 8601 timestamp.

    A timestamp without a zone is taken as UTC.
    Raises ValueError for text that is neither, and for a time outside the calendar (`3000000d`, `1e309h`).
    """
    reference = now or utc_now()
    try:
        duration = parse_duration(text)
    except ValueError:
        duration = None
    except OverflowError:
        raise ValueError(f"out of range: {text!r} reaches before the year 1") from None
    if duration is not None:
        try:
            return reference - duration
        except OverflowError:
            raise ValueError(f"out of range: {text!r} reaches before the year 1") from None
    if text.strip().lower() == "now":
        return reference
    try:
        return as_utc(datetime.fromisoformat(text.strip()))
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"not a time: {text!r} (expected a duration such as 7d, 'now' or an ISO timestamp)") from exc


def observed_days(span: timedelta) -> float:
    """The days a per-day figure divides by: a range of a day or more counts as its nearest whole number of days (a
    `--since 1d` range widened to whole hours is 1 day, not 1.04), a shorter one as its fraction of a day, at least
    one hour (a per-day figure from it is an extrapolation, which reports must say)."""
    days = span / timedelta(days=1)
    return float(round(days)) if days >= 1 else max(days, 1 / 24)
