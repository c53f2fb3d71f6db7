"""Queries that explain misses and feed the simulator, on a small dataset whose figures are worked out by hand."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection

from db import queries
from db.chains import RequestChain
from db.engine import create_sync_engine_for
from db.records import RequestRecord
from db.store import store_records

T0 = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)  # a Monday
DAY2 = datetime(2025, 3, 11, 9, 0, tzinfo=UTC)
SINCE, UNTIL = T0 - timedelta(days=1), T0 + timedelta(days=3)
C1 = RequestChain(16, 40, (11, 12))
C2 = RequestChain(16, 70, (11, 13, 14, 15), approximate=True)
C3 = RequestChain(64, 200, (-7, 8, 9))


def _dataset(make_record: Callable[..., RequestRecord]) -> dict[str, RequestRecord]:
    def tools(offset: int, recomputed: int) -> dict[str, Any]:
        return {"miss_reason": "tools_changed", "divergence_segment": "tools", "divergence_char_offset": offset,
                "recomputed_tokens": recomputed}  # fmt: skip

    def volatile(offset: int, recomputed: int) -> dict[str, Any]:
        return {"miss_reason": "volatile_value", "divergence_segment": "system", "divergence_char_offset": offset,
                "recomputed_tokens": recomputed}  # fmt: skip

    acme, globex = {"tenant": "acme"}, {"tenant": "globex"}
    return {
        "a1": make_record(**acme, created_at=T0 + timedelta(minutes=5), miss_reason="hit", recomputed_tokens=0,
                          prompt_tokens=1000, normalization_gain_tokens=0, chain=C1),
        "a2": make_record(**acme, created_at=T0 + timedelta(minutes=15), **tools(130, 600), prompt_tokens=1000,
                          normalization_gain_tokens=600, chain=C2),
        "a3": make_record(**acme, created_at=T0 + timedelta(minutes=70), **tools(150, 400)),
        "a4": make_record(**acme, created_at=T0 + timedelta(minutes=80), **volatile(41, 700), prompt_tokens=800,
                          normalization_gain_tokens=0),
        "g1": make_record(**globex, created_at=T0 + timedelta(minutes=30), **volatile(45, 100), chain=C3),
        "g2": make_record(**globex, created_at=DAY2, miss_reason="new_prefix", recomputed_tokens=0, prompt_tokens=500,
                          normalization_gain_tokens=50),
        "g3": make_record(**globex, created_at=T0 + timedelta(minutes=20), **tools(300, 50)),
    }  # fmt: skip


@pytest.fixture
def data(db_url: str, make_record: Callable[..., RequestRecord]) -> dict[str, RequestRecord]:
    records = _dataset(make_record)
    engine = create_sync_engine_for(db_url)
    with engine.begin() as conn:
        store_records(conn, list(records.values())[:4])
    with engine.begin() as conn:
        store_records(conn, list(records.values())[4:])
    engine.dispose()
    return records


@pytest.fixture
def conn(db_url: str, data: dict[str, RequestRecord]) -> Iterator[Connection]:
    engine = create_sync_engine_for(db_url)
    with engine.connect() as connection:
        yield connection
    engine.dispose()


def test_miss_reasons_over_time(conn: Connection) -> None:
    hourly = queries.miss_reasons_over_time(conn, SINCE, UNTIL)
    assert [(row.bucket_start, row.reason, row.requests, row.recomputed_tokens) for row in hourly] == [
        (T0, "hit", 1, 0),
        (T0, "tools_changed", 2, 650),
        (T0, "volatile_value", 1, 100),
        (T0 + timedelta(hours=1), "tools_changed", 1, 400),
        (T0 + timedelta(hours=1), "volatile_value", 1, 700),
        (DAY2, "new_prefix", 1, 0),
    ]
    daily = queries.miss_reasons_over_time(conn, SINCE, UNTIL, bucket="1d", tenant="acme")
    assert [(row.bucket_start, row.reason, row.requests, row.recomputed_tokens) for row in daily] == [
        (T0.replace(hour=0), "hit", 1, 0),
        (T0.replace(hour=0), "tools_changed", 2, 1000),
        (T0.replace(hour=0), "volatile_value", 1, 700),
    ]
    with pytest.raises(ValueError):
        queries.miss_reasons_over_time(conn, SINCE, UNTIL, bucket="5m")


def test_miss_reason_totals(conn: Connection) -> None:
    totals = queries.miss_reason_totals(conn, SINCE, UNTIL)
    assert [(row.reason, row.requests, row.recomputed_tokens) for row in totals] == [
        ("tools_changed", 3, 1050),
        ("volatile_value", 2, 800),
        ("hit", 1, 0),
        ("new_prefix", 1, 0),
    ]
    assert queries.miss_reason_totals(conn, T0 + timedelta(days=30), T0 + timedelta(days=31)) == []


def test_divergence_locations(conn: Connection) -> None:
    def located(rows: list[queries.DivergenceLocation]) -> list[tuple[Any, ...]]:
        return [(r.segment, r.char_offset_start, r.char_offset_end, r.requests, r.recomputed_tokens) for r in rows]

    assert located(queries.divergence_locations(conn, SINCE, UNTIL)) == [
        ("tools", 128, 192, 2, 1000),
        ("system", 0, 64, 2, 800),
        ("tools", 256, 320, 1, 50),
    ]
    assert located(queries.divergence_locations(conn, SINCE, UNTIL, offset_bucket_chars=256)) == [
        ("tools", 0, 256, 2, 1000),
        ("system", 0, 256, 2, 800),
        ("tools", 256, 512, 1, 50),
    ]
    assert located(queries.divergence_locations(conn, SINCE, UNTIL, tenant="globex")) == [
        ("system", 0, 64, 1, 100),
        ("tools", 256, 320, 1, 50),
    ]
    assert len(queries.divergence_locations(conn, SINCE, UNTIL, limit=1)) == 1
    for bad in (0, 100):
        with pytest.raises(ValueError):
            queries.divergence_locations(conn, SINCE, UNTIL, offset_bucket_chars=bad)


def test_miss_examples(conn: Connection, data: dict[str, RequestRecord]) -> None:
    def names(rows: list[queries.RequestRow]) -> list[str]:
        by_id = {record.request_id: name for name, record in data.items()}
        return [by_id[row.request_id] for row in rows]

    assert names(queries.miss_examples(conn, "tools_changed", SINCE, UNTIL)) == ["a3", "g3", "a2"]
    assert names(queries.miss_examples(conn, "tools_changed", SINCE, UNTIL, tenant="acme")) == ["a3", "a2"]
    assert names(queries.miss_examples(conn, "tools_changed", T0 + timedelta(minutes=16), UNTIL, limit=1)) == ["a3"]
    assert queries.miss_examples(conn, "evicted", SINCE, UNTIL) == []
    row = queries.miss_examples(conn, "volatile_value", SINCE, UNTIL, tenant="acme")[0]
    assert (row.miss_reason, row.divergence_segment, row.divergence_char_offset, row.recomputed_tokens) == (
        "volatile_value",
        "system",
        41,
        700,
    )
    assert row.normalization_gain_tokens == 0


def test_normalization_gains(conn: Connection) -> None:
    gains = queries.normalization_gains(conn, SINCE, UNTIL)
    assert (gains.sampled_requests, gains.requests_with_gain, gains.gain_tokens, gains.prompt_tokens) == (
        4,
        2,
        650,
        3300,
    )
    assert gains.mean_gain_tokens == pytest.approx(650 / 4) and gains.gain_share == pytest.approx(650 / 3300)
    acme = queries.normalization_gains(conn, SINCE, UNTIL, tenant="acme", model="m1")
    assert (acme.sampled_requests, acme.requests_with_gain, acme.gain_tokens, acme.prompt_tokens) == (3, 1, 600, 2800)
    empty = queries.normalization_gains(conn, T0 + timedelta(days=30), T0 + timedelta(days=31))
    assert empty == queries.NormalizationGains() and empty.mean_gain_tokens is None and empty.gain_share is None


def test_iter_chains_streams_in_time_order(conn: Connection, data: dict[str, RequestRecord]) -> None:
    every = list(queries.iter_chains(conn, SINCE, chunk_rows=1))
    assert every == [
        (data["a1"].created_at, "acme", C1),
        (data["a2"].created_at, "acme", C2),
        (data["g1"].created_at, "globex", C3),
    ]
    assert every[1].chain.approximate and every[2].chain.hash_ids == (-7, 8, 9)
    assert [entry.chain for entry in queries.iter_chains(conn, SINCE, tenant="acme")] == [C1, C2]
    assert [entry.chain for entry in queries.iter_chains(conn, T0 + timedelta(minutes=10))] == [C2, C3]
    assert [entry.chain for entry in queries.iter_chains(conn, SINCE, T0 + timedelta(minutes=15))] == [C1]
    created_at, tenant, chain = next(iter(queries.iter_chains(conn, SINCE)))
    assert (created_at, tenant, chain) == (T0 + timedelta(minutes=5), "acme", C1)
