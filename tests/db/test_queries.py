"""Read-side queries on a small hand-made dataset whose figures are worked out by hand below."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection

from db import queries
from db.engine import create_async_engine_for, create_sync_engine_for, run_query, sync_session_factory
from db.records import RequestRecord
from db.store import store_records
from db.tenants import ensure_tenant

T0 = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)  # a Monday
DAY2 = datetime(2025, 3, 11, 9, 0, tzinfo=UTC)
P1, P2, P3 = "a1" * 16, "b2" * 16, "c3" * 16


def _dataset(make_record: Callable[..., RequestRecord]) -> dict[str, RequestRecord]:
    acme = {"tenant": "acme", "model": "m1", "upstream": "local"}
    globex = {"tenant": "globex", "model": "m2", "upstream": "vllm"}
    return {
        "r1": make_record(
            **acme,
            created_at=T0,
            prompt_tokens=1000,
            cached_tokens=800,
            ttft_ms=20.0,
            applied_rules=("a",),
            miss_kind="hit",
            prefix_hash=P1,
        ),
        "r2": make_record(
            **acme,
            created_at=T0 + timedelta(minutes=10),
            prompt_tokens=1000,
            cached_tokens=0,
            ttft_ms=200.0,
            miss_kind="cold",
            prefix_hash=P1,
        ),
        "r3": make_record(
            **acme,
            created_at=T0 + timedelta(minutes=20),
            prompt_tokens=500,
            cached_tokens=256,
            ttft_ms=30.0,
            applied_rules=("a", "b"),
            miss_kind="partial",
            prefix_hash=P2,
        ),
        "r4": make_record(
            **globex,
            created_at=T0 + timedelta(minutes=30),
            prompt_tokens=400,
            cached_tokens=None,
            ttft_ms=100.0,
            prefix_hash=P3,
        ),
        "r5": make_record(
            **globex,
            created_at=T0 + timedelta(minutes=40),
            status_code=502,
            error_type="bad_gateway",
            prompt_tokens=None,
            cached_tokens=None,
            completion_tokens=None,
            ttft_ms=None,
        ),
        "r6": make_record(
            **acme,
            created_at=T0 + timedelta(minutes=65),
            prompt_tokens=2000,
            cached_tokens=1600,
            ttft_ms=25.0,
            applied_rules=("b",),
            miss_kind="hit",
            prefix_hash=P1,
        ),
        "r7": make_record(
            **globex,
            created_at=DAY2,
            prompt_tokens=300,
            cached_tokens=0,
            ttft_ms=150.0,
            miss_kind="evicted",
            prefix_hash=P3,
        ),
        "r8": make_record(
            **globex,
            created_at=DAY2 + timedelta(minutes=30),
            prompt_tokens=300,
            cached_tokens=100,
            ttft_ms=40.0,
            miss_kind="partial",
            prefix_hash=P3,
            prompt_text="hello",
            diverged_at_token=104,
        ),
    }


@pytest.fixture
def data(db_url: str, make_record: Callable[..., RequestRecord]) -> dict[str, RequestRecord]:
    records = _dataset(make_record)
    engine = create_sync_engine_for(db_url)
    with engine.begin() as conn:
        # Two transactions' worth, so that the rollups are also built by upserting onto existing rows.
        store_records(conn, list(records.values())[:3])
        store_records(conn, list(records.values())[3:])
        ensure_tenant(conn, "newco")
    engine.dispose()
    return records


@pytest.fixture
def conn(db_url: str, data: dict[str, RequestRecord]) -> Iterator[Connection]:
    engine = create_sync_engine_for(db_url)
    with engine.connect() as connection:
        yield connection
    engine.dispose()


SINCE, UNTIL = T0 - timedelta(days=1), T0 + timedelta(days=3)


def test_overview_totals(conn: Connection) -> None:
    result = queries.overview(conn, SINCE, UNTIL)
    assert (result.requests, result.error_requests) == (8, 1)
    assert result.prompt_tokens == 5500  # every known prompt count
    assert result.cached_tokens == 2756
    assert result.token_hit_rate == pytest.approx(2756 / 5100)  # only requests that reported cached tokens
    assert (result.requests_with_known_cache, result.requests_with_hit) == (6, 4)
    assert result.request_hit_share == pytest.approx(4 / 6)
    assert result.ttft_hit_mean_ms == pytest.approx((20 + 30 + 25 + 40) / 4)
    assert result.ttft_miss_mean_ms == pytest.approx((200 + 150) / 2)
    assert result.ttft_hit_p50_ms is not None and result.ttft_miss_p50_ms is not None
    assert 20 / 1.34 <= result.ttft_hit_p50_ms <= 30 * 1.34
    assert 150 / 1.34 <= result.ttft_miss_p50_ms <= 200 * 1.34
    assert result.miss_kinds == {"hit": 2, "partial": 2, "cold": 1, "evicted": 1}
    assert result.error_types == {"bad_gateway": 1}


def test_overview_filters_and_empty_ranges(conn: Connection) -> None:
    acme = queries.overview(conn, SINCE, UNTIL, tenant="acme", model="m1")
    assert (acme.requests, acme.prompt_tokens, acme.cached_tokens) == (4, 4500, 2656)
    assert queries.overview(conn, SINCE, UNTIL, tenant="acme", model="m2").requests == 0
    empty = queries.overview(conn, T0 + timedelta(days=30), T0 + timedelta(days=31))
    assert empty.requests == 0 and empty.token_hit_rate is None and empty.ttft_hit_p50_ms is None


def test_stats_per_day_by_tenant(conn: Connection) -> None:
    rows = queries.stats(conn, SINCE, UNTIL, bucket="1d", group_by="tenant")
    got = {(row.bucket_start, row.group): row for row in rows}
    assert list(got) == [
        (datetime(2025, 3, 10, tzinfo=UTC), "acme"),
        (datetime(2025, 3, 10, tzinfo=UTC), "globex"),
        (datetime(2025, 3, 11, tzinfo=UTC), "globex"),
    ]
    acme = got[(datetime(2025, 3, 10, tzinfo=UTC), "acme")]
    assert (acme.requests, acme.prompt_tokens, acme.cached_tokens) == (4, 4500, 2656)
    assert acme.token_hit_rate == pytest.approx(2656 / 4500)
    assert acme.request_hit_share == pytest.approx(3 / 4)
    globex_day1 = got[(datetime(2025, 3, 10, tzinfo=UTC), "globex")]
    assert (globex_day1.requests, globex_day1.error_requests) == (2, 1)
    assert globex_day1.token_hit_rate is None and globex_day1.request_hit_share is None  # nothing known
    globex_day2 = got[(datetime(2025, 3, 11, tzinfo=UTC), "globex")]
    assert globex_day2.token_hit_rate == pytest.approx(100 / 600)
    assert globex_day2.request_hit_share == pytest.approx(1 / 2)


def test_stats_hourly_weekly_and_range_edges(conn: Connection) -> None:
    hourly = queries.stats(conn, SINCE, UNTIL)
    assert [(row.bucket_start, row.requests, row.group) for row in hourly] == [
        (T0, 5, None),
        (T0 + timedelta(hours=1), 1, None),
        (DAY2, 2, None),
    ]
    weekly = queries.stats(conn, SINCE, UNTIL, bucket="1w")
    assert [(row.bucket_start, row.requests) for row in weekly] == [(T0.replace(hour=0), 8)]
    # Whole hours: since is floored to its hour, until is exclusive.
    edge = queries.stats(conn, T0 + timedelta(minutes=30), T0 + timedelta(hours=1))
    assert [(row.bucket_start, row.requests) for row in edge] == [(T0, 5)]
    by_model = queries.stats(conn, SINCE, UNTIL, bucket="1d", group_by="model", tenant="globex")
    assert {(row.group, row.requests) for row in by_model} == {("m2", 2)}
    by_upstream = queries.stats(conn, SINCE, UNTIL, bucket="1w", group_by="upstream")
    assert {(row.group, row.requests) for row in by_upstream} == {("local", 4), ("vllm", 4)}
    with pytest.raises(ValueError):
        queries.stats(conn, SINCE, UNTIL, bucket="5m")
    with pytest.raises(ValueError):
        queries.stats(conn, SINCE, UNTIL, group_by="key_id")  # type: ignore[arg-type]


def test_recent_requests_filters(conn: Connection, data: dict[str, RequestRecord]) -> None:
    def names(rows: list[queries.RequestRow]) -> list[str]:
        by_id = {record.request_id: name for name, record in data.items()}
        return [by_id[row.request_id] for row in rows]

    assert names(queries.recent_requests(conn, limit=3)) == ["r8", "r7", "r6"]
    assert names(queries.recent_requests(conn, limit=50, hit=True)) == ["r8", "r6", "r3", "r1"]
    assert names(queries.recent_requests(conn, limit=50, hit=False)) == ["r7", "r2"]
    assert names(queries.recent_requests(conn, limit=50, miss_kind="partial")) == ["r8", "r3"]
    assert names(queries.recent_requests(conn, limit=50, tenant="acme", since=T0 + timedelta(minutes=15))) == [
        "r6",
        "r3",
    ]
    assert names(queries.recent_requests(conn, limit=2, until=data["r7"].created_at)) == ["r6", "r5"]
    assert names(queries.recent_requests(conn, limit=50, prefix_hash=P3, model="m2")) == ["r8", "r7", "r4"]
    row = queries.recent_requests(conn, limit=1)[0]
    assert row.cache_hit is True and row.uncached_tokens == 200 and row.diverged_at_token == 104
    assert row.created_at == data["r8"].created_at


def test_recent_requests_list_anthropic_cache_writes(
    db_url: str, conn: Connection, make_record: Callable[..., RequestRecord]
) -> None:
    """Rows carrying the Messages API's cache writes and retention class list like any other."""
    record = make_record(
        created_at=T0 + timedelta(days=2),
        endpoint="/v1/messages",
        prompt_tokens=900,
        cached_tokens=0,
        cache_write_tokens=850,
        retention_class="1h",
    )
    engine = create_sync_engine_for(db_url)
    with engine.begin() as writer:
        store_records(writer, [record])
    engine.dispose()
    row = queries.recent_requests(conn, limit=1)[0]
    assert row.request_id == record.request_id
    assert (row.cache_write_tokens, row.retention_class) == (850, "1h")


def test_request_detail_returns_the_record(conn: Connection, data: dict[str, RequestRecord]) -> None:
    assert queries.request_detail(conn, data["r8"].request_id) == data["r8"]
    assert queries.request_detail(conn, data["r5"].request_id) == data["r5"]
    assert queries.request_detail(conn, "missing") is None


def test_top_prefixes(conn: Connection) -> None:
    by_requests = queries.top_prefixes(conn, SINCE, UNTIL, limit=10)
    assert [(row.prefix_hash, row.requests, row.requests_with_hit, row.cached_tokens) for row in by_requests] == [
        (P1, 3, 2, 2400),
        (P3, 3, 1, 100),
        (P2, 1, 1, 256),
    ]
    assert by_requests[0].prompt_tokens == 4000
    assert by_requests[0].first_seen == T0 and by_requests[0].last_seen == T0 + timedelta(minutes=65)
    by_cached = queries.top_prefixes(conn, SINCE, UNTIL, limit=2, order_by="cached_tokens")
    assert [row.prefix_hash for row in by_cached] == [P1, P2]
    assert [row.prefix_hash for row in queries.top_prefixes(conn, SINCE, UNTIL, tenant="globex")] == [P3]


def test_rule_counts_and_catalog(conn: Connection) -> None:
    assert [(item.value, item.requests) for item in queries.rule_counts(conn, SINCE, UNTIL)] == [("a", 2), ("b", 2)]
    assert [(item.value, item.requests) for item in queries.rule_counts(conn, SINCE, UNTIL, tenant="acme")] == [
        ("a", 2),
        ("b", 2),
    ]
    statuses = queries.label_counts(conn, "status", SINCE, UNTIL)
    assert [(item.value, item.requests) for item in statuses] == [("200", 7), ("502", 1)]
    assert queries.tenants(conn) == ["acme", "globex", "newco"]
    assert queries.models(conn) == ["m1", "m2"]
    assert queries.upstreams(conn) == ["local", "vllm"]


def test_queries_take_a_session_too(db_url: str, data: dict[str, RequestRecord]) -> None:
    engine = create_sync_engine_for(db_url)
    try:
        with sync_session_factory(engine)() as session:
            assert queries.overview(session, SINCE, UNTIL).requests == 8
            assert len(queries.stats(session, SINCE, UNTIL, bucket="1d")) == 2
    finally:
        engine.dispose()


async def test_queries_run_from_async_code(db_url: str, data: dict[str, RequestRecord]) -> None:
    engine = create_async_engine_for(db_url)
    try:
        rows = await run_query(engine, queries.stats, since=SINCE, until=UNTIL, bucket="1d", group_by="tenant")
        assert sum(row.requests for row in rows) == 8
        async with engine.connect() as conn:
            overview = await conn.run_sync(queries.overview, SINCE, UNTIL)
        assert overview.requests_with_hit == 4
    finally:
        await engine.dispose()


def test_top_prefixes_counts_whole_hours_of_the_rollup(conn: Connection) -> None:
    # Since is floored to its hour (as in every rollup query): r1 at 12:00 counts from 12:59 on as well.
    late_start = queries.top_prefixes(conn, T0 + timedelta(minutes=59), T0 + timedelta(hours=2))
    assert [(row.prefix_hash, row.requests) for row in late_start] == [(P1, 3), (P2, 1), (P3, 1)]
    next_hour = queries.top_prefixes(conn, T0 + timedelta(hours=1), T0 + timedelta(hours=2))
    assert [(row.prefix_hash, row.requests, row.first_seen) for row in next_hour] == [
        (P1, 1, T0 + timedelta(minutes=65))
    ]
    assert queries.top_prefixes(conn, SINCE, UNTIL, limit=0) == []
    with pytest.raises(ValueError):
        queries.top_prefixes(conn, SINCE, UNTIL, order_by="prompt_tokens")  # type: ignore[arg-type]


def test_prefix_labels_come_from_the_newest_stored_prompt(
    db_url: str, conn: Connection, make_record: Callable[..., RequestRecord]
) -> None:
    assert queries.prefix_labels(conn, [P1, P2, P3, "unknown"]) == {P3: "hello"}
    assert queries.prefix_labels(conn, []) == {}
    engine = create_sync_engine_for(db_url)
    with engine.begin() as writer:
        store_records(
            writer,
            [
                make_record(prefix_hash=P1, created_at=T0 + timedelta(minutes=1), prompt_text="older prompt"),
                make_record(
                    prefix_hash=P1, created_at=T0 + timedelta(minutes=2), prompt_text="You are\n  a " + "x" * 90
                ),
                make_record(prefix_hash=P1, created_at=T0 + timedelta(minutes=3)),  # newest, but no text kept
            ],
        )
    engine.dispose()
    labels = queries.prefix_labels(conn, [P1, P1, P3])
    assert labels[P3] == "hello"
    assert labels[P1] == "You are a " + "x" * 49 + "…" and len(labels[P1]) == 60
    assert queries.prefix_labels(conn, [P1], max_chars=7) == {P1: "You ar…"}


def test_totals_by_group_in_one_pass(conn: Connection) -> None:
    by_tenant = {row.group: row for row in queries.totals_by(conn, SINCE, UNTIL)}
    assert list(by_tenant) == ["acme", "globex"]
    acme, globex = by_tenant["acme"], by_tenant["globex"]
    assert (acme.requests, acme.prompt_tokens, acme.cached_tokens, acme.requests_with_hit) == (4, 4500, 2656, 3)
    assert acme.token_hit_rate == pytest.approx(2656 / 4500)
    assert acme.ttft_hit_mean_ms == pytest.approx(25.0) and acme.ttft_hit_p50_ms is not None
    assert (globex.requests, globex.error_requests, globex.prompt_tokens, globex.cached_tokens) == (4, 1, 1000, 100)
    assert globex.request_hit_share == pytest.approx(1 / 2)
    by_model = queries.totals_by(conn, SINCE, UNTIL, group_by="model", tenant="globex", quantiles=False)
    assert [(row.group, row.requests, row.prompt_tokens) for row in by_model] == [("m2", 4, 1000)]
    assert by_model[0].ttft_p50_ms is None and by_model[0].ttft_miss_mean_ms == pytest.approx(150.0)
    by_upstream = queries.totals_by(conn, SINCE, UNTIL, group_by="upstream")
    assert [(row.group, row.requests) for row in by_upstream] == [("local", 4), ("vllm", 4)]
    assert queries.totals_by(conn, T0 + timedelta(days=30), T0 + timedelta(days=31)) == []
    with pytest.raises(ValueError):
        queries.totals_by(conn, SINCE, UNTIL, group_by="key_id")  # type: ignore[arg-type]
