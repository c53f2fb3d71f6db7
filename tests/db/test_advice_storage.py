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
    # "Today" is the 12 samples' own hit rate (the unsampled request does not mix in); 13 000 prompt tokens per day.
    assert agents.token_hit_rate == pytest.approx(0.1) and agents.samples == 12
    assert agents.days == pytest.approx(1.0)
    assert agents.prompt_tokens_per_day == pytest.approx(13000)
    assert [c.candidate for c in agents.candidates] == [END, AFTER]
    best = agents.candidates[0]
    assert best.samples == 12 and best.shown and best.recommended and best.moves_content
    assert best.sampled_hit_rate == pytest.approx(0.1)
    assert best.sampled_estimated_hit_rate == pytest.approx(10800 / 12120)
    assert best.estimated_hit_rate == pytest.approx(10800 / 12120)
    # Prefilled tokens per sampled prompt token: (12000 - 1200) - (12120 - 10800) = 9480 saved of 12000.
    assert best.tokens_saved_per_day == pytest.approx(13000 * 9480 / 12000)
    assert best.prefill_ms_saved_per_day == pytest.approx(13000 * 9480 / 12000 * 2400 / 10800)
    assert best.toml_lines == ("[tenants.agents]", "rules = { hoist_volatile = true }", 'hoist_placement = "end"')
    # The two placements exclude each other: only the better one is recommended, the other says what beats it.
    after = agents.candidates[1]
    assert after.shown and not after.recommended and after.outranked_by == best.title
    assert after.estimated_hit_rate == pytest.approx(8400 / 12120)
    assert agents.recommendations == (best,)

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
    titles = [info.title for info in CANDIDATES.values()]
    assert len({title.replace(",", "").replace(" ", "") for title in titles}) == len(titles)  # not near-identical
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
    assert key == ["bucket_start", "tenant", "settings_fingerprint", "candidate"]
    downgrade(empty_db_url, "0002")
    assert "hourly_advice" not in tables() and "hourly_miss_reasons" in tables()


def test_advice_rests_only_on_samples_under_the_current_settings(db_url: str, make_record: MakeRecord) -> None:
    """A tenant sampled with hoisting off (10% hit, hoisting would give 90%) then turns it on (80% hit): advice uses
    only the samples taken since, so hoist_volatile is no longer a candidate and "today" is 80%, not a mix."""
    before = [
        make_record(
            tenant="agents",
            created_at=T0 + timedelta(minutes=i),
            prompt_tokens=1000,
            cached_tokens=100,
            advice=(AdviceOutcome(END, 1000, 900, True, "off"), AdviceOutcome("newlines", 1000, 100, False, "off")),
        )
        for i in range(20)
    ]
    after = [
        make_record(
            tenant="agents",
            created_at=T0 + timedelta(hours=2, minutes=i),
            prompt_tokens=1000,
            cached_tokens=800,
            advice=(
                AdviceOutcome("hoist_placement:after_system", 1000, 750, True, "on"),
                AdviceOutcome("newlines", 1000, 800, False, "on"),
            ),
        )
        for i in range(10)
    ]
    _store(db_url, [*before, *after])
    (agents,) = _read(db_url, min_samples=10)
    assert agents.settings_fingerprint == "on" and agents.samples == 10
    assert agents.token_hit_rate == pytest.approx(0.8)
    assert {c.candidate for c in agents.candidates} == {"hoist_placement:after_system", "newlines"}
    assert agents.recommendations == ()
    newlines = next(c for c in agents.candidates if c.candidate == "newlines")
    assert newlines.samples == 10 and newlines.estimated_hit_rate == pytest.approx(0.8)
    # A worse candidate saves nothing (never a negative figure).
    worse = next(c for c in agents.candidates if c.candidate == "hoist_placement:after_system")
    assert worse.estimated_hit_rate == pytest.approx(0.75)
    assert worse.tokens_saved_per_day == 0.0 and worse.prefill_ms_saved_per_day in (None, 0.0)

    # Within one hour too: the settings of the latest sample are the current ones.
    again = [
        make_record(
            tenant="agents",
            created_at=T0 + timedelta(hours=2, minutes=30 + i),
            prompt_tokens=1000,
            cached_tokens=100,
            advice=(AdviceOutcome(END, 1000, 900, True, "off"),),
        )
        for i in range(10)
    ]
    _store(db_url, again)
    (agents,) = _read(db_url, min_samples=10)
    assert agents.settings_fingerprint == "off" and agents.samples == 30
    assert [c.candidate for c in agents.recommendations] == [END]


def test_prefill_time_uses_engine_ttft_or_the_recorded_prefill_speed(db_url: str, make_record: MakeRecord) -> None:
    """Non-streamed requests carry the engine's own TTFT; with no TTFT at all, the engine's recorded prefill speed
    turns saved tokens into time."""
    from db.engine_context import EngineContext, record_engine_context

    def records(tenant: str, ttft: float | None, source: str | None) -> list[RequestRecord]:
        return [
            make_record(
                tenant=tenant,
                created_at=T0 + timedelta(minutes=i),
                stream=False,
                prompt_tokens=1000,
                cached_tokens=0,
                ttft_ms=ttft,
                ttft_source=source,
                advice=(AdviceOutcome(END, 1000, 500, True, "f"),),
            )
            for i in range(10)
        ]

    _store(db_url, [*records("engine-ttft", 250.0, "engine"), *records("no-ttft", None, None)])
    found = {t.tenant: t.candidates[0] for t in _read(db_url)}
    # 10 000 prompt tokens per day, half of them no longer prefilled; 250 ms per 1000 prefilled tokens.
    assert found["engine-ttft"].tokens_saved_per_day == pytest.approx(5000)
    assert found["engine-ttft"].prefill_ms_saved_per_day == pytest.approx(5000 * 0.25)
    assert found["no-ttft"].prefill_ms_saved_per_day is None

    engine = create_sync_engine_for(db_url)
    with engine.begin() as conn:
        record_engine_context(conn, EngineContext("http://engine", T0, 2000.0, None, None, None, None))
    engine.dispose()
    found = {t.tenant: t.candidates[0] for t in _read(db_url)}
    assert found["no-ttft"].prefill_ms_saved_per_day == pytest.approx(5000 / 2000 * 1000)
    assert found["engine-ttft"].prefill_ms_saved_per_day == pytest.approx(5000 * 0.25)  # its own TTFT comes first
