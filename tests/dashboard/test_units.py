"""Unit tests of the dashboard's pure parts: tree flattening, prices, settings, the engine client, wording."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from dashboard_testkit import (
    ENGINE_TREE_NUM_NODES,
    ENGINE_TREE_TOTAL_TOKENS,
    closed_port_url,
    engine_stats_payload,
    engine_tree_payload,
)

from dashboard import prices, ui
from dashboard.cache_tree import ROOT_ID, flatten_tree
from dashboard.engine_client import EngineUnavailable, fetch_cache_stats, fetch_cache_tree
from dashboard.explain import describe_miss_kind
from dashboard.loaders import bucket_for_span
from dashboard.settings import (
    DEFAULT_ENGINE_URL,
    ENV_DATABASE_URL,
    ENV_ENGINE_URL,
    ENV_PRICE_FILE,
    ENV_REFRESH_S,
    DashboardSettings,
    SettingsError,
    settings_from_env,
    settings_to_env,
)


def test_flatten_tree_parents_sizes_and_totals() -> None:
    flat, summaries = flatten_tree(engine_tree_payload()["namespaces"])
    assert len(flat) == 1 + ENGINE_TREE_NUM_NODES
    assert flat.ids[0] == ROOT_ID and flat.parents[0] == ""
    assert len(set(flat.ids)) == len(flat.ids)  # node ids repeat across namespaces; flattened ids must not
    assert all(parent in flat.ids for parent in flat.parents[1:])
    position = {node_id: index for index, node_id in enumerate(flat.ids)}
    for index in range(1, len(flat)):
        children = [i for i, parent in enumerate(flat.parents) if parent == flat.ids[index]]
        assert flat.subtree_tokens[index] == flat.num_tokens[index] + sum(flat.subtree_tokens[i] for i in children)
    assert flat.subtree_tokens[position[ROOT_ID]] == ENGINE_TREE_TOTAL_TOKENS
    assert [(s.num_nodes, s.num_tokens, s.hit_count, s.num_locked) for s in summaries] == [
        (4, 704, 14, 1),
        (3, 320, 2, 0),
    ]


def test_flatten_deep_tree_without_recursion() -> None:
    depth = 5000
    node: dict = {"id": depth, "num_tokens": 1, "hit_count": 0, "children": []}
    for node_id in range(depth - 1, -1, -1):
        node = {"id": node_id, "num_tokens": 1, "hit_count": 1, "children": [node]}
    flat, summaries = flatten_tree([{"namespace": "deep", "root": node}])
    assert summaries[0].num_tokens == depth + 1
    assert flat.subtree_tokens[1] == depth + 1


def test_flatten_tolerates_missing_fields() -> None:
    flat, summaries = flatten_tree([{"namespace": "n", "root": {"id": 0, "children": [{"id": 1}]}}])
    assert flat.num_tokens == [0, 0, 0]
    assert summaries[0].num_nodes == 2


def test_savings_formula() -> None:
    table = prices.PriceTable(
        as_of=date(2025, 1, 1),
        source="test",
        prices={"a": prices.ModelPrice(2.0, 0.5, 2.5), prices.FALLBACK_MODEL: prices.ModelPrice(1.0, 0.1, 1.0)},
    )
    usage = [
        prices.ModelUsage("a", prompt_tokens=1_000_000, cached_tokens=600_000),
        prices.ModelUsage("other", prompt_tokens=2_000_000, cached_tokens=1_000_000),
    ]
    first, second = prices.compute_savings(usage, table)
    assert first.cost_without_cache_usd == pytest.approx(2.0)
    assert first.cost_with_cache_usd == pytest.approx(0.6 * 0.5 + 0.4 * 2.5)
    assert first.saved_usd == pytest.approx(2.0 - 1.3)
    assert second.priced_as == prices.FALLBACK_MODEL
    assert second.saved_usd == pytest.approx(1.0 * (1.0 - 0.1))
    without_fallback = prices.PriceTable(date(2025, 1, 1), "t", {"a": prices.ModelPrice(1, 1, 1)})
    assert prices.compute_savings(usage[1:], without_fallback)[0].saved_usd is None


def test_price_table_round_trips_through_files_and_rows(tmp_path: Path) -> None:
    data = prices.price_table_to_dict(prices.DEFAULT_PRICE_TABLE)
    path = tmp_path / "prices.json"
    import json

    path.write_text(json.dumps(data))
    assert prices.load_price_table(path) == prices.DEFAULT_PRICE_TABLE
    rows = prices.price_rows(prices.DEFAULT_PRICE_TABLE)
    rebuilt = prices.price_table_from_rows(
        [*rows, {"model": "", "input": None}], prices.DEFAULT_PRICE_TABLE.as_of, prices.DEFAULT_PRICE_TABLE.source
    )
    assert rebuilt == prices.DEFAULT_PRICE_TABLE


def test_price_toml_defaults_cache_write_to_input(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('as_of = "2026-02-01"\n[models.x]\ninput = 3\ncached_input = 0.3\n')
    table = prices.load_price_table(path)
    assert table.as_of == date(2026, 2, 1)
    assert table.prices["x"] == prices.ModelPrice(3.0, 0.3, 3.0)


@pytest.mark.parametrize(
    "data",
    [
        {"models": {"x": {"input": 1, "cached_input": 1}}},
        {"as_of": "yesterday", "models": {"x": {"input": 1, "cached_input": 1}}},
        {"as_of": "2026-01-01", "models": {}},
        {"as_of": "2026-01-01", "models": {"x": {"input": 1}}},
        {"as_of": "2026-01-01", "models": {"x": {"input": -1, "cached_input": 0}}},
    ],
)
def test_bad_price_tables_are_rejected(data: dict) -> None:
    with pytest.raises(prices.PriceTableError):
        prices.price_table_from_dict(data)


def test_settings_from_env_and_back() -> None:
    settings = settings_from_env({ENV_DATABASE_URL: "sqlite:///x.db", ENV_REFRESH_S: "5", ENV_PRICE_FILE: "p.toml"})
    assert settings.database_url == "sqlite:///x.db"
    assert settings.engine_url == DEFAULT_ENGINE_URL
    assert settings.refresh_s == 5.0
    assert settings.price_file == Path("p.toml")
    assert settings_from_env(settings_to_env(settings)) == settings


def test_settings_fall_back_to_dbs_url(monkeypatch: pytest.MonkeyPatch) -> None:
    from db.config import ENV_DATABASE_URL as DB_ENV

    monkeypatch.setenv(DB_ENV, "sqlite:///from-db-env.db")
    assert settings_from_env({ENV_ENGINE_URL: "http://e:1/"}) == DashboardSettings(
        database_url="sqlite:///from-db-env.db", engine_url="http://e:1"
    )


@pytest.mark.parametrize("value", ["soon", "0", "-3"])
def test_bad_settings_are_rejected(value: str) -> None:
    with pytest.raises(SettingsError):
        settings_from_env({ENV_DATABASE_URL: "sqlite:///x.db", ENV_REFRESH_S: value})


def test_engine_client_reads_the_cache_api(engine) -> None:
    url, state = engine
    stats = fetch_cache_stats(url, timeout_s=5)
    assert stats.capacity_tokens == engine_stats_payload()["capacity_tokens"]
    assert (stats.used_tokens, stats.free_tokens, stats.in_flight_tokens) == (1056, 3040, 32)
    state.stats = {"capacity_tokens": 100, "used_tokens": 40, "evictable_tokens": 30, "protected_tokens": 10}
    assert fetch_cache_stats(url, timeout_s=5).free_tokens == 60
    state.stats = engine_stats_payload()
    assert stats.prefill_tokens_per_s == 1000.0
    state.stats = engine_stats_payload(prefill_tokens_per_s=None)
    assert fetch_cache_stats(url, timeout_s=5).prefill_tokens_per_s is None
    tree = fetch_cache_tree(url, max_nodes=50, timeout_s=5)
    assert len(tree.namespaces) == 2 and tree.truncated is False
    assert state.tree_queries[-1] == "max_nodes=50"


def test_engine_client_turns_failures_into_engine_unavailable(engine) -> None:
    with pytest.raises(EngineUnavailable, match="cannot reach"):
        fetch_cache_stats(closed_port_url(), timeout_s=2)
    url, state = engine
    state.tree = {"nodes": []}
    with pytest.raises(EngineUnavailable, match="namespaces"):
        fetch_cache_tree(url, max_nodes=10, timeout_s=5)
    with pytest.raises(EngineUnavailable, match="404"):
        fetch_cache_stats(url + "/nope", timeout_s=5)


def test_miss_kind_wording() -> None:
    assert describe_miss_kind("hit").startswith("hit")
    assert "token 12" in describe_miss_kind("partial", 12)
    assert "expired" in describe_miss_kind("expired")
    assert describe_miss_kind(None).startswith("unknown")


def test_chart_buckets_follow_the_span() -> None:
    assert bucket_for_span(timedelta(hours=24)) == "1h"
    assert bucket_for_span(timedelta(days=7)) == "4h"
    assert bucket_for_span(timedelta(days=90)) == "1d"
    assert bucket_for_span(timedelta(days=400)) == "1w"


def test_relative_ranges_slide_and_fixed_ones_stay() -> None:
    now = datetime(2026, 5, 1, 12, 0, 30, tzinfo=UTC)
    relative = ui.Filters(now, now, "Last hour", None, None, window=timedelta(hours=1)).refreshed(now)
    assert relative.until == datetime(2026, 5, 1, 12, 1, tzinfo=UTC)
    assert relative.span == timedelta(hours=1)
    fixed = ui.Filters(now - timedelta(days=1), now, "dates", None, None)
    assert fixed.refreshed(now + timedelta(days=3)) == fixed


def test_formatting() -> None:
    assert ui.format_share(None) == "n/a" and ui.format_share(0.3935) == "39.4%"
    assert (
        ui.format_tokens(3148) == "3.15k" and ui.format_tokens(15_830_000) == "15.83M" and ui.format_tokens(12) == "12"
    )
    assert ui.format_ms(43.2) == "43 ms" and ui.format_ms(2690) == "2.69 s"
    assert ui.format_seconds(3.148) == "3.1 s" and ui.format_seconds(1584) == "26.4 min"
    assert ui.format_usd(1234.5) == "$1,234.50" and ui.format_usd(0.000236) == "$0.0002" and ui.format_usd(0) == "$0.00"
