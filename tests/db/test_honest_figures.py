"""Figures a user can trust: a hit reuses more than the template's opening, and TTFT percentiles stay within what was
observed (real SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest

from db import histogram, queries
from db.engine import create_sync_engine_for
from db.records import RequestRecord, is_hit
from db.store import store_records

from .conftest import BASE_TIME

SINCE, UNTIL = BASE_TIME - timedelta(hours=1), BASE_TIME + timedelta(hours=2)


def _store(db_url: str, records: list[RequestRecord]) -> None:
    engine = create_sync_engine_for(db_url)
    with engine.begin() as conn:
        store_records(conn, records)
    engine.dispose()


def test_is_hit_needs_more_than_the_template_opening() -> None:
    assert (is_hit(None, 3), is_hit(0, None), is_hit(3, 3), is_hit(4, 3), is_hit(14, None)) == (
        None, False, False, True, True)


def test_matching_only_the_template_opening_is_not_a_hit(db_url: str, make_record: Callable[..., RequestRecord]):
    records = [
        make_record(created_at=BASE_TIME, prompt_tokens=560, cached_tokens=3, template_tokens=3, prefix_hash="p",
                    ttft_ms=900.0),
        make_record(created_at=BASE_TIME, prompt_tokens=560, cached_tokens=14, template_tokens=14, prefix_hash="p",
                    ttft_ms=800.0),
        make_record(created_at=BASE_TIME, prompt_tokens=560, cached_tokens=559, template_tokens=3, prefix_hash="p",
                    ttft_ms=40.0),
    ]
    _store(db_url, records)
    engine = create_sync_engine_for(db_url)
    with engine.connect() as conn:
        overview = queries.overview(conn, SINCE, UNTIL)
        assert (overview.requests_with_known_cache, overview.requests_with_hit) == (3, 1)
        assert overview.request_hit_share == pytest.approx(1 / 3)
        assert overview.ttft_hit_mean_ms == pytest.approx(40.0)
        assert overview.ttft_miss_mean_ms == pytest.approx(850.0)
        hits = queries.recent_requests(conn, hit=True)
        misses = queries.recent_requests(conn, hit=False)
        assert [row.cached_tokens for row in hits] == [559]
        assert sorted(row.cached_tokens for row in misses) == [3, 14]
        assert [row.cache_hit for row in misses] == [False, False]
        [prefix] = queries.top_prefixes(conn, SINCE, UNTIL)
        assert (prefix.requests, prefix.requests_with_hit) == (3, 1)
    engine.dispose()


def test_percentiles_stay_within_the_observed_values(db_url: str, make_record: Callable[..., RequestRecord]):
    """Two samples of 99.8 and 105.9 ms (either side of the 100 ms bin edge): interpolating between the edges of
    105.9's bin gave a p95 of about 130 ms; clamped to what the bins saw, it is 105.9."""
    unclamped = histogram.quantile({histogram.bin_of(99.8): 1, histogram.bin_of(105.9): 1}, 0.95)
    assert unclamped == pytest.approx(100 * 10 ** (0.9 / 8))  # what the figures showed before
    _store(db_url, [make_record(created_at=BASE_TIME, cached_tokens=0, ttft_ms=value) for value in (105.9, 99.8)])
    engine = create_sync_engine_for(db_url)
    with engine.connect() as conn:
        overview = queries.overview(conn, SINCE, UNTIL)
    engine.dispose()
    assert (overview.ttft_miss_p50_ms, overview.ttft_miss_p95_ms) == (pytest.approx(99.8), pytest.approx(105.9))
    assert overview.ttft_ranges_ms["miss_p95"] == (pytest.approx(105.9), pytest.approx(105.9))
    assert overview.ttft_ranges_ms["p50"] == (pytest.approx(99.8), pytest.approx(99.8))


def test_a_single_sample_is_its_own_percentile() -> None:
    index = histogram.bin_of(250.0)
    assert histogram.quantile({index: 1}, 0.95, {index: (250.0, 250.0)}) == 250.0
    assert histogram.quantile_range({index: 1}, 0.5, {}) == histogram.bin_bounds(index)
