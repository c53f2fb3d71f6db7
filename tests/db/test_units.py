"""Pure functions of `db`: URLs, time parsing, the TTFT histogram, record serialization, rollup arithmetic."""

from __future__ import annotations

import json
import math
import random
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from db import histogram
from db.chains import RequestChain
from db.config import (
    ENV_DATABASE_URL,
    async_url,
    backend_of,
    database_url_from_env,
    sqlite_path,
    sync_url,
)
from db.errors import DatabaseConfigError
from db.queries import bucket_floor
from db.records import MISS_REASONS, RequestRecord, _plain_json
from db.rollups import RollupAccumulator
from db.timeutil import floor_hour, parse_duration, parse_moment


def test_url_from_env_prefers_explicit_then_env_then_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    monkeypatch.setenv("PREFIXSCOPE_HOME", str(tmp_path / "home"))
    # The default is a file in the state directory, the same from any working directory.
    assert database_url_from_env(None) == f"sqlite+aiosqlite:///{tmp_path / 'home' / 'prefixscope.db'}"
    assert sqlite_path(database_url_from_env(None)) == tmp_path / "home" / "prefixscope.db"
    monkeypatch.setenv(ENV_DATABASE_URL, "postgresql://u@h/db")
    assert database_url_from_env(None) == "postgresql://u@h/db"
    assert database_url_from_env("sqlite:///x.db") == "sqlite:///x.db"


@pytest.mark.parametrize(
    ("url", "async_form", "sync_form"),
    [
        ("sqlite:///a.db", "sqlite+aiosqlite:///a.db", "sqlite:///a.db"),
        ("sqlite+aiosqlite:////abs/a.db", "sqlite+aiosqlite:////abs/a.db", "sqlite:////abs/a.db"),
        ("postgresql://u:p@h:5/d", "postgresql+asyncpg://u:p@h:5/d", "postgresql+psycopg://u:p@h:5/d"),
        ("postgres://u@h/d", "postgresql+asyncpg://u@h/d", "postgresql+psycopg://u@h/d"),
        ("postgresql+asyncpg://u@h/d", "postgresql+asyncpg://u@h/d", "postgresql+psycopg://u@h/d"),
        ("postgresql+psycopg://u@h/d", "postgresql+psycopg://u@h/d", "postgresql+psycopg://u@h/d"),
    ],
)
def test_urls_normalize_per_use(url: str, async_form: str, sync_form: str) -> None:
    assert async_url(url) == async_form
    assert sync_url(url) == sync_form


@pytest.mark.parametrize("url", ["mysql://u@h/d", "not a url", "oracle+cx://x"])
def test_unsupported_urls_are_rejected(url: str) -> None:
    with pytest.raises(DatabaseConfigError):
        backend_of(url)
    with pytest.raises(DatabaseConfigError):
        database_url_from_env(url)


def test_sqlite_path() -> None:
    assert sqlite_path("sqlite:///rel/a.db") == Path("rel/a.db")
    assert sqlite_path("sqlite+aiosqlite:////abs/a.db") == Path("/abs/a.db")
    assert sqlite_path("sqlite://") is None
    assert sqlite_path("sqlite:///:memory:") is None
    assert sqlite_path("postgresql://h/d") is None


def test_durations_and_moments() -> None:
    now = datetime(2025, 1, 8, 12, 30, tzinfo=UTC)
    assert parse_duration("7d") == timedelta(days=7)
    assert parse_duration("90s") == timedelta(seconds=90)
    assert parse_moment("12h", now) == now - timedelta(hours=12)
    assert parse_moment("now", now) == now
    assert parse_moment("2025-01-01T00:00:00", now) == datetime(2025, 1, 1, tzinfo=UTC)
    assert parse_moment("2025-01-01T02:00:00+02:00", now) == datetime(2025, 1, 1, tzinfo=UTC)
    with pytest.raises(ValueError):
        parse_moment("yesterday-ish", now)


def test_bucket_floor_aligns_days_at_midnight_and_weeks_on_monday() -> None:
    moment = datetime(2025, 3, 13, 17, 45, tzinfo=timezone(timedelta(hours=2)))  # Thursday 15:45 UTC
    assert bucket_floor(moment, "1h") == datetime(2025, 3, 13, 15, tzinfo=UTC)
    assert bucket_floor(moment, "6h") == datetime(2025, 3, 13, 12, tzinfo=UTC)
    assert bucket_floor(moment, "1d") == datetime(2025, 3, 13, tzinfo=UTC)
    assert bucket_floor(moment, "1w") == datetime(2025, 3, 10, tzinfo=UTC)
    assert bucket_floor(moment, "1w").weekday() == 0
    assert bucket_floor(moment, "5m") == datetime(2025, 3, 13, 15, 45, tzinfo=UTC)
    with pytest.raises(ValueError):
        bucket_floor(moment, "7m")


def test_histogram_bins_cover_all_values_in_order() -> None:
    values = [0.0, 0.05, 0.1, 1.0, 9.99, 10.0, 250.0, 99_999.0, 100_000.0, 1e9]
    bins = [histogram.bin_of(value) for value in values]
    assert bins == sorted(bins)
    assert bins[0] == 0 and bins[-1] == histogram.NUM_BINS - 1
    for value, index in zip(values, bins, strict=True):
        lower, upper = histogram.bin_bounds(index)
        assert lower <= value and (upper is None or value < upper)


def test_histogram_quantiles_are_within_one_bin_of_exact() -> None:
    rng = random.Random(7)
    samples = sorted(rng.lognormvariate(math.log(120), 0.8) for _ in range(5000))
    counts: dict[int, int] = {}
    for value in samples:
        counts[histogram.bin_of(value)] = counts.get(histogram.bin_of(value), 0) + 1
    ratio = 10 ** (1 / histogram.BINS_PER_DECADE)
    for q in (0.5, 0.95):
        exact = samples[int(q * len(samples)) - 1]
        estimate = histogram.quantile(counts, q)
        assert estimate is not None
        assert exact / ratio <= estimate <= exact * ratio
    assert histogram.quantile({}, 0.5) is None
    assert histogram.merge([{1: 2}, {1: 3, 4: 1}]) == {1: 5, 4: 1}


_records = st.builds(
    RequestRecord,
    request_id=st.uuids().map(str),
    created_at=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)),
    tenant=st.text(min_size=1, max_size=20),
    key_id=st.none() | st.text(max_size=12),
    endpoint=st.sampled_from(["chat.completions", "completions"]),
    model=st.text(min_size=1, max_size=20),
    upstream=st.text(min_size=1, max_size=20),
    stream=st.booleans(),
    status_code=st.integers(100, 599),
    error_type=st.none() | st.text(max_size=20),
    prompt_tokens=st.none() | st.integers(0, 10**6),
    cached_tokens=st.none() | st.integers(0, 10**6),
    completion_tokens=st.none() | st.integers(0, 10**6),
    ttft_ms=st.none() | st.floats(0, 1e6),
    latency_ms=st.floats(0, 1e6),
    applied_rules=st.lists(st.text(max_size=10), max_size=4).map(tuple),
    miss_kind=st.none() | st.sampled_from(["hit", "partial", "cold", "evicted", "expired"]),
    prefix_hash=st.none() | st.text(alphabet="0123456789abcdef", max_size=32),
    prompt_text=st.none() | st.text(max_size=200),
    diverged_at_token=st.none() | st.integers(0, 10**6),
    miss_reason=st.none() | st.sampled_from(MISS_REASONS),
    divergence_segment=st.none() | st.sampled_from(["tools", "system", "messages[3]"]),
    divergence_char_offset=st.none() | st.integers(0, 10**6),
    recomputed_tokens=st.none() | st.integers(0, 10**6),
    normalization_gain_tokens=st.none() | st.integers(0, 10**6),
    chain=st.none()
    | st.builds(
        RequestChain,
        block_size=st.integers(1, 1024),
        input_length=st.integers(0, 10**6),
        hash_ids=st.lists(st.integers(-(2**63), 2**63 - 1), max_size=20).map(tuple),
        approximate=st.booleans(),
    ),
)


# No deadline: the suite runs beside others on small machines, and this asserts behaviour, not speed.
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_records)
def test_record_json_round_trip_is_lossless_and_one_line(item: RequestRecord) -> None:
    line = item.to_json()
    assert "\n" not in line
    line.encode("ascii")  # any text survives, lone surrogates included
    assert RequestRecord.from_json(line) == item


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_records)
def test_record_json_is_the_json_the_standard_library_writes(item: RequestRecord) -> None:
    data = json.loads(item.to_json())
    fast = _plain_json(data)
    if fast is not None:  # else to_json wrote json.dumps's text itself
        assert fast.isascii() and "\n" not in fast
        assert json.loads(fast) == json.loads(json.dumps(data, separators=(",", ":"))) == data
        assert list(json.loads(fast)) == list(data)  # the fields in their order


def test_record_json_keeps_non_finite_floats_and_any_text(make_record) -> None:  # type: ignore[no-untyped-def]
    item = make_record(latency_ms=math.inf, ttft_ms=math.nan, prompt_text="caf\u00e9 \ud800 \u2028")
    line = item.to_json()
    assert line.isascii() and "Infinity" in line and "NaN" in line
    again = RequestRecord.from_json(line)
    assert again.latency_ms == math.inf and math.isnan(again.ttft_ms) and again.prompt_text == item.prompt_text


def test_from_json_ignores_unknown_fields(make_record) -> None:  # type: ignore[no-untyped-def]
    item = make_record()
    line = item.to_json()[:-1] + ',"added_later":1}'
    assert RequestRecord.from_json(line) == item


def test_rollup_accumulator_sums_by_hour_and_key(make_record) -> None:  # type: ignore[no-untyped-def]
    base = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)
    accumulator = RollupAccumulator().add_all(
        [
            make_record(
                created_at=base,
                prompt_tokens=100,
                cached_tokens=80,
                ttft_ms=10.0,
                applied_rules=("a", "a", "b"),
                miss_kind="hit",
            ),
            make_record(
                created_at=base + timedelta(minutes=59),
                prompt_tokens=100,
                cached_tokens=0,
                ttft_ms=90.0,
                miss_kind="cold",
            ),
            make_record(
                created_at=base + timedelta(minutes=30),
                prompt_tokens=None,
                cached_tokens=None,
                ttft_ms=None,
                status_code=502,
                error_type="bad_gateway",
            ),
            make_record(created_at=base + timedelta(hours=1), prompt_tokens=50, cached_tokens=None),
        ]
    )
    rows = {row["bucket_start"]: row for row in accumulator.rollup_rows()}
    first = rows[floor_hour(base)]
    assert first["requests"] == 3 and first["error_requests"] == 1
    assert first["prompt_tokens"] == 200 and first["cached_tokens"] == 80
    assert first["requests_with_known_cache"] == 2 and first["requests_with_hit"] == 1
    assert first["ttft_hit_count"] == 1 and first["ttft_miss_count"] == 1
    second = rows[floor_hour(base) + timedelta(hours=1)]
    assert second["prompt_tokens"] == 50 and second["cache_known_prompt_tokens"] == 0
    labels = {
        (row["dimension"], row["value"]): row["requests"]
        for row in accumulator.label_rows()
        if row["bucket_start"] == floor_hour(base)
    }
    assert labels[("rule", "a")] == 1  # listed twice, still one request
    assert labels[("miss_kind", "hit")] == 1 and labels[("error_type", "bad_gateway")] == 1
    assert labels[("status", "502")] == 1
    states = {row["cache_state"] for row in accumulator.ttft_bin_rows()}
    assert states == {"hit", "miss", "unknown"}
