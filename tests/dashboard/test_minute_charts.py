"""Every page that charts a range of up to six hours charts it in minute buckets (`bucket_for_span`), so a request
made at 13:57 is drawn at 13:57, not at the start of its hour."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from dashboard_testkit import _record, create_database

from db.queries.minutes import minute_floor
from db.timeutil import utc_now


def _chart_times(app) -> set[datetime]:
    times: set[datetime] = set()
    for chart in app.get("plotly_chart"):
        for trace in json.loads(chart.proto.spec)["data"]:
            for x in trace.get("x", []) or []:
                if isinstance(x, str) and x[:2] == "20":
                    times.add(datetime.fromisoformat(x).replace(tzinfo=UTC))
    return times


@pytest.fixture(scope="module")
def recent_url(tmp_path_factory) -> tuple[str, list[datetime]]:
    now = utc_now()
    moments = [now - timedelta(minutes=47, seconds=10), now - timedelta(minutes=13, seconds=10)]
    records = [
        _record(
            index,
            moment,
            cached_tokens=0,
            miss_reason="system_changed",
            miss_kind="partial",
            recomputed_tokens=900,
            divergence_segment="system",
            divergence_char_offset=12,
            replica="http://127.0.0.1:8001",
            routing_policy="cache_aware",
            predicted_match_tokens=0,
            routing_index_source="precise",
        )
        for index, moment in enumerate(moments)
    ]
    return create_database(tmp_path_factory.mktemp("minutes") / "recent.db", records), moments


@pytest.mark.parametrize("page", ["overview", "why_misses", "replicas"])
def test_a_short_range_is_charted_by_the_minute(run_page, recent_url, page) -> None:
    url, moments = recent_url
    app = run_page(page, url)
    times = _chart_times(app)
    assert times, f"the {page} page drew no time series"
    # Where a request may be drawn: its minute, or its five minutes on a wider range (a request in an hour's first
    # minutes is drawn at the hour itself, rightly).
    drawn_at = {moment: {minute_floor(moment, "1m"), minute_floor(moment, "5m")} for moment in moments}
    anywhere = set().union(*drawn_at.values())
    for moment, minute_points in drawn_at.items():
        assert times & minute_points, (page, moment, sorted(times))
        hour = moment.replace(minute=0, second=0, microsecond=0)
        if hour not in anywhere:
            assert hour not in times, f"{page} charts {moment:%H:%M} at the start of its hour"
