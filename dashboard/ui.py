"""Widgets and messages every page shares: settings, the sidebar filters, and how failures are shown.

A failure to reach the database or the engine is shown as a one-line message and stops the page; no page ever shows
a traceback for a condition an operator can cause (wrong URL, schema not created yet, engine not started).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, NoReturn, TypeVar

import streamlit as st

from dashboard.settings import DashboardSettings, SettingsError, settings_from_env

T = TypeVar("T")

ALL_TENANTS = "All tenants"
ALL_MODELS = "All models"
CUSTOM_RANGE = "Custom dates"
RANGE_CHOICES: dict[str, timedelta] = {
    "Last hour": timedelta(hours=1),
    "Last 6 hours": timedelta(hours=6),
    "Last 24 hours": timedelta(hours=24),
    "Last 7 days": timedelta(days=7),
    "Last 30 days": timedelta(days=30),
    "Last 90 days": timedelta(days=90),
}
DEFAULT_RANGE = "Last 7 days"
EARLIEST_DATE = date(2000, 1, 1)
# Sidebar choices live under these keys (not the widgets' own), so they survive switching to a page without them.
_STATE_PREFIX = "prefixscope_filter_"


@dataclass(frozen=True)
class Filters:
    """The sidebar's choice: a half-open UTC range [since, until), optional tenant and model."""

    since: datetime
    until: datetime
    label: str
    tenant: str | None
    model: str | None
    # Set for "last N hours/days" choices: the range then moves with the clock on every refresh.
    window: timedelta | None = None

    @property
    def span(self) -> timedelta:
        return self.until - self.since

    def refreshed(self, now: datetime | None = None) -> Filters:
        """The same choice at `now`: a relative range slides forward, fixed dates stay."""
        if self.window is None:
            return self
        until = ceil_minute(now or datetime.now(UTC))
        return replace(self, since=until - self.window, until=until)


def load_settings() -> DashboardSettings:
    """The dashboard's settings, or a stop with the reason when the environment is wrong."""
    try:
        return settings_from_env()
    except (SettingsError, ValueError) as exc:
        st.error(f"The dashboard is misconfigured: {exc}")
        st.stop()
        raise  # unreachable: st.stop() raises; keeps type checkers content


def stop_with_info(message: str) -> NoReturn:
    st.info(message)
    st.stop()


def stop_with_warning(message: str) -> NoReturn:
    st.warning(message)
    st.stop()


def ceil_minute(moment: datetime) -> datetime:
    """The next whole minute at or after `moment`: a stable `until` so cached queries are reused within a minute."""
    floored = moment.replace(second=0, microsecond=0)
    return floored if floored == moment else floored + timedelta(minutes=1)


def _remembered(name: str, default: Any) -> Any:
    return st.session_state.get(_STATE_PREFIX + name, default)


def _remember(name: str, value: Any) -> None:
    st.session_state[_STATE_PREFIX + name] = value


def _select(label: str, name: str, options: Sequence[str], default: str) -> str:
    remembered = _remembered(name, default)
    index = list(options).index(remembered) if remembered in options else list(options).index(default)
    value = st.sidebar.selectbox(label, options, index=index, key=f"{_STATE_PREFIX}{name}_widget")
    _remember(name, value)
    return value


def default_range(first_seen: datetime | None, now: datetime) -> str:
    """The shortest listed range that covers the data since `first_seen` (at most the last 30 days), so a fresh
    install opens on its own minutes rather than a nearly empty week; `DEFAULT_RANGE` without data."""
    if first_seen is None:
        return DEFAULT_RANGE
    span = now - first_seen
    for label, window in RANGE_CHOICES.items():
        if span <= window or window >= timedelta(days=30):
            return label
    return DEFAULT_RANGE


def time_range_picker(now: datetime | None = None, default: str = DEFAULT_RANGE) -> tuple[datetime, datetime, str]:
    """Sidebar time-range choice as `(since, until, label)` in UTC."""
    current = now or datetime.now(UTC)
    choice = _select("Time range", "range", [*RANGE_CHOICES, CUSTOM_RANGE], default)
    if choice != CUSTOM_RANGE:
        until = ceil_minute(current)
        return until - RANGE_CHOICES[choice], until, choice
    today = current.date()
    start_default, end_default = _remembered("dates", (today - timedelta(days=6), today))
    picked = st.sidebar.date_input(
        "From / to (UTC, inclusive)",
        value=(start_default, end_default),
        min_value=EARLIEST_DATE,
        max_value=today + timedelta(days=1),
        key=f"{_STATE_PREFIX}dates_widget",
    )
    dates = list(picked) if isinstance(picked, tuple | list) else [picked]
    start: date = dates[0] if dates else start_default
    end: date = dates[1] if len(dates) > 1 else start
    _remember("dates", (start, end))
    since = datetime.combine(start, time(0), tzinfo=UTC)
    until = datetime.combine(end + timedelta(days=1), time(0), tzinfo=UTC)
    return since, until, f"{start.isoformat()} to {end.isoformat()}"


def sidebar_filters(
    tenants: Sequence[str],
    models: Sequence[str],
    *,
    with_model: bool = True,
    now: datetime | None = None,
    first_seen: datetime | None = None,
) -> Filters:
    """Render the time-range, tenant and (optionally) model pickers in the sidebar; the range defaults to one that
    fits the data since `first_seen`."""
    st.sidebar.header("Filters")
    since, until, label = time_range_picker(now, default_range(first_seen, now or datetime.now(UTC)))
    tenant = _select("Tenant", "tenant", [ALL_TENANTS, *tenants], ALL_TENANTS)
    model = _select("Model", "model", [ALL_MODELS, *models], ALL_MODELS) if with_model else ALL_MODELS
    return Filters(
        window=RANGE_CHOICES.get(label),
        since=since,
        until=until,
        label=label,
        tenant=None if tenant == ALL_TENANTS else tenant,
        model=None if model == ALL_MODELS else model,
    )


def read_database(call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`call(*args, **kwargs)`, or a warning and a stop when the database cannot answer.

    Pages wrap every database read in this, so a wrong URL, a schema that was never created or a server that is down
    reads as a message instead of a traceback.
    """
    from sqlalchemy.exc import SQLAlchemyError

    from db.errors import DatabaseError

    try:
        return call(*args, **kwargs)
    except (SQLAlchemyError, DatabaseError, OSError) as exc:
        reason = (str(getattr(exc, "orig", None) or exc).splitlines() or [exc.__class__.__name__])[0]
        hint = ""
        if "no such table" in reason or "does not exist" in reason:
            hint = " The schema has not been created yet: run `prefixscope db upgrade` first."
        st.warning(f"Cannot read the database: {reason[:300]}.{hint}")
        st.stop()
        raise  # unreachable: st.stop() raises


def count_of(count: int, noun: str) -> str:
    """`1 request`, `2 requests`: a count with its noun (the last word takes the plural `s`), thousands separated."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


_BUCKET_WORDS = {"1m": "1-minute", "5m": "5-minute", "15m": "15-minute", "1h": "hourly", "1d": "daily", "1w": "weekly"}


def bucket_words(bucket: str) -> str:
    """How a chart's bucket reads in a caption: `5-minute buckets`, `hourly buckets`, `4h buckets`."""
    return f"{_BUCKET_WORDS.get(bucket, bucket)} buckets"


def format_share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def format_tokens(value: float | None) -> str:
    if value is None:
        return "n/a"
    for threshold, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= threshold:
            return f"{value / threshold:.2f}{suffix}"
    return f"{value:,.0f}"


def format_bytes(value: float | None) -> str:
    """Binary units (a KV pool is sized in GiB): `512 B`, `1.50 KiB`, `2.00 GiB`."""
    if value is None:
        return "n/a"
    for threshold, suffix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(value) >= threshold:
            return f"{value / threshold:.2f} {suffix}"
    return f"{value:,.0f} B"


def format_ms(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value / 1000:.2f} s" if value >= 1000 else f"{value:.0f} ms"


def format_seconds(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value >= 3600:
        return f"{value / 3600:.1f} h"
    if value >= 60:
        return f"{value / 60:.1f} min"
    return f"{value:.1f} s"


def format_usd(value: float | None) -> str:
    if value is None:
        return "n/a"
    # Small deployments save fractions of a cent per hour; show them rather than "$0.00".
    return f"${value:,.2f}" if abs(value) >= 1 or value == 0 else f"${value:.4f}"
