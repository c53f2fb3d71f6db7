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
from db.simulation.units import format_size, format_ttl


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


def _tier_metrics(app: object) -> tuple[str, str, str]:
    shown = metrics(app)
    return shown["Device tier hits (today's size)"], shown["Host tier hits"], shown["Both tiers"]


def test_host_tier_splits_hits_between_device_and_host(run_page, chains_url) -> None:
    app = run_page("what_if", chains_url)
    app.sidebar.number_input(key="what_if_today_capacity").set_value(8).run()
    # No host tier: everything LRU hits with two blocks is a device hit.
    assert _tier_metrics(app) == (
        ui.format_share(LRU_8_TOKENS_HIT_RATE),
        ui.format_share(0.0),
        ui.format_share(LRU_8_TOKENS_HIT_RATE),
    )
    app.sidebar.selectbox(key="what_if_host_capacity").set_value(1_000).run()
    assert not app.exception
    # Two blocks on the device, the rest demoted to a host that holds everything (worked out in explain_testkit's
    # chains): c2 hits 1, 2 on the device (8 tokens); c3 hits 1, 2 there and 3 on the host (8 + 4); after c4's two
    # new blocks, c5 finds 1, 2, 3, 5 on the host (16). Device 16, host 20: the unlimited cache's 36 of 65.
    assert _tier_metrics(app) == (
        ui.format_share(16 / 65),
        ui.format_share(20 / 65),
        ui.format_share(CEILING_HIT_RATE),
    )
    tiers_chart = json.loads(app.get("plotly_chart")[1].proto.spec)
    names = [trace["name"] for trace in tiers_chart["data"]]
    assert names[:2] == ["device (L1) hits", "device + host (1k tokens) hits"]
    device_line, total_line = tiers_chart["data"][:2]
    # The curve covers every device size up to the trace's 7 distinct blocks of 4 tokens, and the host tier adds
    # hits only while the device cannot hold everything.
    assert device_line["x"][0] == 4 and device_line["x"][-1] >= 7 * 4
    assert total_line["y"][-1] == pytest.approx(CEILING_HIT_RATE)
    assert all(total >= device for total, device in zip(total_line["y"], device_line["y"], strict=True))
    table = app.dataframe[1].value
    assert list(table["device (tokens)"]) == sorted(DEFAULT_CAPACITIES)
    assert set(table["host (tokens)"]) == {1_000}
    # The default sizes hold every block on the device: nothing is left for the host.
    assert list(table["host hit rate"]) == [0.0] * len(DEFAULT_CAPACITIES)


def test_host_tier_defaults_to_the_engine_s(run_page, chains_url, engine) -> None:
    engine_url, state = engine
    state.stats = {**state.stats, "tiers": {"host": {"enabled": True, "capacity_tokens": 12_345}}}
    app = run_page("what_if", chains_url, engine_url=engine_url)
    assert app.sidebar.selectbox(key="what_if_host_capacity").value == 12_345
    assert f"a host tier of {format_size(12_345)} tokens" in "\n".join(item.value for item in app.caption)


def test_tiers_model_reads_every_point_off_one_curve() -> None:
    from explain_testkit import CHAINS

    from dashboard.what_if_model import run_tiers
    from db.simulation import Trace, TraceRequest, simulate

    requests = [TraceRequest(10.0 * index, length, chain, 4) for index, (chain, length, _) in enumerate(CHAINS)]
    result = run_tiers(requests, 4, [8, 12, 1_000], 8, None, today_capacity_tokens=4)
    trace = Trace.from_requests(requests)
    assert list(result.points) == [simulate(trace, capacity, "lru", None, 8) for capacity in (8, 12, 1_000)]
    assert result.today == simulate(trace, 4, "lru", None, 8)
    for capacity, device_rate, total_rate in zip(
        result.curve_capacity_tokens, result.curve_device_rates, result.curve_total_rates, strict=True
    ):
        expected = simulate(trace, capacity, "lru", None, 8)
        assert (device_rate, total_rate) == (expected.device_token_hit_rate, expected.token_hit_rate)
    assert result.curve_capacity_tokens == tuple(sorted(set(result.curve_capacity_tokens)))
