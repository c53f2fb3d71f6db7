"""What-if page: one line per policy x TTL from the recorded chains, today's setting from the engine or the sidebar."""

from __future__ import annotations

import json

import pytest
from dashboard_testkit import create_database
from explain_testkit import (
    CEILING_HIT_RATE,
    LRU_8_TOKENS_HIT_RATE,
    NUM_APPROXIMATE,
    NUM_CHAINS,
    explained_records,
)

from dashboard import ui
from dashboard.what_if_model import DEFAULT_CAPACITIES, DEFAULT_POLICIES, DEFAULT_TTLS
from db.simulation.units import format_ttl


@pytest.fixture(scope="module")
def chains_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return create_database(tmp_path_factory.mktemp("chains") / "prefixscope.db", explained_records())


def metrics(app: object) -> dict[str, str]:
    return {metric.label: metric.value for metric in app.metric}  # type: ignore[attr-defined]


def markdown(app: object) -> str:
    return "\n".join(item.value for item in app.markdown)  # type: ignore[attr-defined]


def figure(app: object) -> dict:
    return json.loads(app.get("plotly_chart")[0].proto.spec)  # type: ignore[attr-defined]


def test_one_series_per_policy_and_ttl_and_the_ceiling_when_everything_fits(run_page, chains_url) -> None:
    app = run_page("what_if", chains_url)
    table = app.dataframe[0].value
    assert len(table) == len(DEFAULT_CAPACITIES) * len(DEFAULT_POLICIES) * len(DEFAULT_TTLS)
    series = table.groupby(["policy", "TTL"])
    assert set(series.groups) == {(policy, format_ttl(ttl)) for policy in DEFAULT_POLICIES for ttl in DEFAULT_TTLS}
    # The chains hold 7 distinct blocks of 4 tokens: even the smallest default cache holds them all, and no TTL
    # (the trace spans 40 s) drops any, so every repeated block hits.
    largest = table[table["capacity (tokens)"] == max(DEFAULT_CAPACITIES)]
    assert list(largest["token hit rate"]) == pytest.approx([CEILING_HIT_RATE] * len(largest))
    lines = [trace for trace in figure(app)["data"] if trace.get("mode") == "lines+markers"]
    assert len(lines) == len(DEFAULT_POLICIES) * len(DEFAULT_TTLS)
    assert all(trace["x"] == sorted(DEFAULT_CAPACITIES) for trace in lines)
    assert figure(app)["layout"]["xaxis"]["type"] == "log"
    shown = metrics(app)
    assert shown["Unlimited cache, no TTL"] == ui.format_share(CEILING_HIT_RATE)
    assert shown["Chains replayed"] == f"{NUM_CHAINS:,}"
    assert shown["Blocks"] == "16"
    assert shown["Approximate chains"] == ui.format_share(NUM_APPROXIMATE / NUM_CHAINS)


def test_fewer_choices_mean_fewer_series(run_page, chains_url) -> None:
    app = run_page("what_if", chains_url)
    app.sidebar.multiselect(key="what_if_policies").set_value(["lru"]).run()
    app.sidebar.multiselect(key="what_if_ttls").set_value(["none", "5m"]).run()
    table = app.dataframe[0].value
    assert set(table.groupby(["policy", "TTL"]).groups) == {("lru", "none"), ("lru", "5m")}
    app.sidebar.multiselect(key="what_if_ttls").set_value([]).run()
    assert any("Pick at least one" in info.value for info in app.info)


def test_todays_setting_comes_from_the_engine(run_page, chains_url, engine) -> None:
    engine_url, state = engine
    state.stats = {**state.stats, "ttl_s": 300.0, "page_size": 8}
    app = run_page("what_if", chains_url, engine_url=engine_url)
    text = markdown(app)
    assert f"from the engine at {engine_url}" in text
    assert "4,096 tokens, lru, TTL 5m, page size 8" in text
    assert app.sidebar.selectbox(key="what_if_page_size").value == 8
    assert not [item for item in app.sidebar.number_input if item.key == "what_if_today_capacity"]
    star = next(trace for trace in figure(app)["data"] if trace.get("mode") == "markers")
    assert star["x"] == [4096]


def test_unreachable_engine_falls_back_to_the_sidebar(run_page, chains_url) -> None:
    app = run_page("what_if", chains_url)
    text = markdown(app)
    assert "entered in the sidebar, because the engine is not reachable" in text
    app.sidebar.number_input(key="what_if_today_capacity").set_value(8).run()
    assert not app.exception
    # Two blocks of LRU, worked out by hand in explain_testkit.
    assert metrics(app)["Today's setting, simulated"] == ui.format_share(LRU_8_TOKENS_HIT_RATE)
    assert "8 tokens, lru, TTL none, page size 4" in markdown(app)


def test_history_without_chains_says_so(run_page, seeded_url) -> None:
    app = run_page("what_if", seeded_url)
    assert any("No block hash chains recorded" in info.value for info in app.info)


def test_empty_database_shows_a_message(run_page, empty_url) -> None:
    app = run_page("what_if", empty_url)
    assert any("No requests recorded yet" in info.value for info in app.info)


def test_todays_setting_comes_from_the_database_s_own_context(run_page, engine, tmp_path) -> None:
    from datetime import UTC, datetime

    from db.engine import create_sync_engine_for
    from db.engine_context import context_from_stats, record_engine_context

    url = create_database(tmp_path / "context.db", explained_records())
    engine_db = create_sync_engine_for(url)
    with engine_db.begin() as conn:
        stats = {"capacity_tokens": 2048, "eviction": "fifo", "ttl_s": 300, "page_size": 8}
        record_engine_context(conn, context_from_stats("local", stats, datetime(2026, 11, 30, 9, tzinfo=UTC)))
    engine_db.dispose()
    app = run_page("what_if", url, engine_url=engine[0])  # the live engine says 4,096 tokens and lru
    text = markdown(app)
    assert "recorded with this database (engine `local`" in text
    assert "2,048 tokens, fifo, TTL 5m, page size 8" in text
