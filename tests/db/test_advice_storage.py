"""Rule advice storage: estimates ride on request records into `hourly_advice` (once per stored request, through the
spill file too) and `db.queries.advice` turns them into per-tenant advice; figures worked out by hand."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from db.advice import CANDIDATES, SEMANTIC_RULES, AdviceOutcome, candidate_info
from db.engine import create_sync_engine_for
from db.models import HourlyAdvice, table_of
from db.queries.advice import advice
from db.records import RequestRecord
from db.store import store_records

MakeRecord = Callable[..., RequestRecord]
T0 = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)
END = "hoist_volatile:end"
AFTER = "hoist_volatile:after_system"


def _agents(make_record: MakeRecord, count: int) -> list[RequestRecord]:
    """`count` requests of 1000 prompt tokens (100 cached, 200 ms TTFT) with two hoisting estimates each."""
    return [
        make_record(
            tenant="agents",
            created_at=T0 + timedelta(minutes=i),
            prompt_tokens=1000,
            cached_tokens=100,
            ttft_ms=200.0,
            advice=(AdviceOutcome(END, 1010, 900, True), AdviceOutcome(AFTER, 1010, 700, True)),
        )
        for i in range(count)
    ]


def _read(url: str, **kwargs) -> list:  # type: ignore[no-untyped-def]
    engine = create_sync_engine_for(url)
    try:
        with engine.connect() as conn:
            return advice(conn, T0 - timedelta(hours=1), T0 + timedelta(hours=23), **kwargs)
    finally:
        engine.dispose()


def _store(url: str, records: list[RequestRecord]) -> None:
    engine = create_sync_engine_for(url)
    try:
        with engine.begin() as conn:
            store_records(conn, records)
    finally:
        engine.dispose()


def test_advice_rollup_and_query_match_hand_sums(db_url: str, make_record: MakeRecord) -> None:
    records = _agents(make_record, 12)
    steady = [
        make_record(
            tenant="steady",
            created_at=T0,
            prompt_tokens=500,
            cached_tokens=400,
            ttft_ms=None,
            advice=(AdviceOutcome(END, 500, 400, False),),
        )
        for _ in range(3)
    ]
    plain = make_record(tenant="agents", created_at=T0, prompt_tokens=1000, cached_tokens=0)
    _store(db_url, [*records, *steady, plain])
    _store(db_url, records[:4])  # a replay: already stored, not counted again

    engine = create_sync_engine_for(db_url)
    with engine.connect() as conn:
        query = select(table_of(HourlyAdvice)).where(HourlyAdvice.tenant == "agents")
        rows = {row.candidate: row for row in conn.execute(query)}
    engine.dispose()
    assert set(rows) == {END, AFTER}
    end = rows[END]
    assert (end.samples, end.changed_samples, end.prompt_tokens, end.cached_tokens) == (12, 12, 12000, 1200)
    assert (end.candidate_prompt_tokens, end.candidate_cached_tokens) == (12120, 10800)
    assert (end.ttft_ms_sum, end.ttft_prefilled_tokens) == (2400.0, 12 * 900)

    agents, steady_advice = _read(db_url, min_samples=10)
    assert agents.tenant == "agents" and steady_advice.tenant == "steady"
    # 13 requests over the range: 12 x (1000, 100) and one (1000, 0); 24 hours in the range.
    assert agents.token_hit_rate == pytest.approx(1200 / 13000)
    assert agents.days == pytest.approx(1.0)
    assert agents.prompt_tokens_per_day == pytest.approx(13000)
    assert [c.candidate for c in agents.candidates] == [END, AFTER]
    best = agents.candidates[0]
    assert best.samples == 12 and best.shown and best.recommended and best.moves_content
    assert best.sampled_hit_rate == pytest.approx(0.1)
    assert best.sampled_estimated_hit_rate == pytest.approx(10800 / 12120)
    assert best.estimated_hit_rate == pytest.approx(1200 / 13000 + 10800 / 12120 - 0.1)
    # Prefilled tokens per sampled prompt token: (12000 - 1200) - (12120 - 10800) = 9480 saved of 12000.
    assert best.tokens_saved_per_day == pytest.approx(13000 * 9480 / 12000)
    assert best.prefill_ms_saved_per_day == pytest.approx(13000 * 9480 / 12000 * 2400 / 10800)
    assert best.toml_lines == ("[tenants.agents]", "rules = { hoist_volatile = true }", 'hoist_placement = "end"')
    assert agents.recommendations == agents.candidates

    (quiet,) = steady_advice.candidates
    assert quiet.samples == 3 and not quiet.shown and not quiet.recommended
    assert quiet.prefill_ms_saved_per_day is None  # no TTFT known
    (steady_low,) = _read(db_url, tenant="steady", min_samples=3)
    assert steady_low.candidates[0].shown and not steady_low.candidates[0].recommended
    assert steady_low.candidates[0].estimated_hit_rate == pytest.approx(0.8)


def test_no_advice_in_range_is_an_empty_list(db_url: str, make_record: MakeRecord) -> None:
    _store(db_url, [make_record(created_at=T0)])
    assert _read(db_url) == []


def test_advice_survives_the_spill_file_format(make_record: MakeRecord) -> None:
    (original,) = _agents(make_record, 1)
    assert RequestRecord.from_json(original.to_json()) == original
    assert RequestRecord.from_json(make_record().to_json()).advice == ()


def test_candidate_catalog() -> None:
    assert set(CANDIDATES) == {
        *SEMANTIC_RULES,
        "default_rules",
        AFTER,
        END,
        "hoist_placement:after_system",
        "hoist_placement:end",
    }
    assert not CANDIDATES["newlines"].moves_content and CANDIDATES[END].moves_content
    assert CANDIDATES["hoist_placement:end"].toml_lines("my team") == ['[tenants."my team"]', 'hoist_placement = "end"']
    assert CANDIDATES["default_rules"].toml_lines("acme")[1] == (
        "rules = { newlines = true, tool_schema_key_order = true, tool_order = true, "
        "tool_call_arguments_key_order = true }"
    )
    assert candidate_info("future_rule").moves_content


def test_migration_0003_adds_and_removes_the_advice_rollup(empty_db_url: str) -> None:
    from sqlalchemy import inspect

    from db.migrate import downgrade, upgrade

    def tables() -> set[str]:
        engine = create_sync_engine_for(empty_db_url)
        try:
            return set(inspect(engine).get_table_names())
        finally:
            engine.dispose()

    upgrade(empty_db_url, "0003")
    assert "hourly_advice" in tables()
    engine = create_sync_engine_for(empty_db_url)
    try:
        key = inspect(engine).get_pk_constraint("hourly_advice")["constrained_columns"]
    finally:
        engine.dispose()
    assert key == ["bucket_start", "tenant", "candidate"]
    downgrade(empty_db_url, "0002")
    assert "hourly_advice" not in tables() and "hourly_miss_reasons" in tables()
