"""Minute buckets from the request rows for short ranges, with the rollups' arithmetic (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest

from db import queries
from db.engine import create_sync_engine_for
from db.records import RequestRecord
from db.store import store_records

from .conftest import BASE_TIME


def test_a_fresh_install_s_minutes_get_their_own_points(db_url: str, make_record: Callable[..., RequestRecord]):
    minutes = (0, 1, 1, 7, 31)
    records = [
        make_record(created_at=BASE_TIME + timedelta(minutes=m, seconds=10), prompt_tokens=100, cached_tokens=c,
                    template_tokens=3, ttft_ms=t)
        for m, c, t in zip(minutes, (0, 99, 3, 99, 50), (500.0, 20.0, 480.0, 25.0, 30.0), strict=True)
    ]
    engine = create_sync_engine_for(db_url)
    with engine.begin() as conn:
        store_records(conn, records)
    with engine.connect() as conn:
        per_minute = queries.stats(conn, BASE_TIME, BASE_TIME + timedelta(hours=1), bucket="1m")
        per_five = queries.stats(conn, BASE_TIME, BASE_TIME + timedelta(hours=1), bucket="5m", group_by="tenant")
        hourly = queries.stats(conn, BASE_TIME, BASE_TIME + timedelta(hours=1), bucket="1h")
        with pytest.raises(ValueError, match=r"at most 24 hours;"):
            queries.stats(conn, BASE_TIME, BASE_TIME + timedelta(days=2), bucket="1m")
    engine.dispose()
    assert [(row.bucket_start - BASE_TIME, row.requests) for row in per_minute] == [
        (timedelta(minutes=0), 1), (timedelta(minutes=1), 2), (timedelta(minutes=7), 1), (timedelta(minutes=31), 1)]
    second = per_minute[1]
    assert (second.requests_with_hit, second.ttft_hit_p50_ms, second.ttft_miss_p50_ms) == (1, 20.0, 480.0)
    assert [(row.bucket_start - BASE_TIME, row.requests) for row in per_five] == [
        (timedelta(minutes=0), 3), (timedelta(minutes=5), 1), (timedelta(minutes=30), 1)]
    [hour] = hourly
    assert (hour.requests, hour.requests_with_hit, hour.cached_tokens) == (5, 3, 251)
    assert sum(row.requests_with_hit for row in per_minute) == hour.requests_with_hit
