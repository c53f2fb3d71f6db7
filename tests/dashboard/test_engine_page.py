"""Engine cache page against a stand-in engine serving the cache API's exact shape."""

from __future__ import annotations

import json

from dashboard_testkit import ENGINE_TREE_NUM_NODES, ENGINE_TREE_TOTAL_TOKENS, engine_stats_payload


def metrics(app: object) -> dict[str, str]:
    return {metric.label: metric.value for metric in app.metric}  # type: ignore[attr-defined]


def chart_specs(app: object) -> list[dict]:
    return [json.loads(chart.proto.spec) for chart in app.get("plotly_chart")]  # type: ignore[attr-defined]


def test_pool_usage_and_evictions(run_page, empty_url, engine) -> None:
    app = run_page("engine", empty_url, engine_url=engine[0])
    shown = metrics(app)
    stats = engine_stats_payload()
    assert shown["Pool used"] == f"{1056 / 4096:.1%}"
    assert shown["Capacity (tokens)"] == f"{stats['capacity_tokens']:,}"
    assert shown["Evicted tokens (total)"] == "2,048"
    assert shown["Cached nodes"] == "7"
    assert shown["Expired tokens (total)"] == "128"
    assert shown["Prefill speed"] == "1,000 tok/s"
    pool = chart_specs(app)[0]
    # locked, evictable, a running request's 32 new tokens, free
    assert [trace["x"][0] for trace in pool["data"]] == [64, 960, 32, 4096 - 1056]
    assert any("eviction policy: lru" in caption.value for caption in app.caption)


def test_cache_tree_is_drawn_with_tokens_and_hits(run_page, empty_url, engine) -> None:
    app = run_page("engine", empty_url, engine_url=engine[0])
    tree = chart_specs(app)[1]["data"][0]
    assert tree["type"] == "icicle"
    assert len(tree["ids"]) == 1 + ENGINE_TREE_NUM_NODES  # plus the synthetic top node
    assert sum(tree["values"]) == ENGINE_TREE_TOTAL_TOKENS
    assert max(tree["marker"]["colors"]) == 9
    namespaces = app.dataframe[0].value.set_index("namespace")
    assert namespaces.loc["5a1t0001", "tokens"] == 512 + 128 + 64
    assert namespaces.loc["5a1t0001", "locked nodes"] == 1
    assert namespaces.loc["5a1t0002", "hits"] == 2
    assert engine[1].tree_queries[-1] == "max_nodes=1000"


def test_chart_kind_and_node_limit(run_page, empty_url, engine) -> None:
    app = run_page("engine", empty_url, engine_url=engine[0])
    app.segmented_control[0].set_value("sunburst").run()
    assert chart_specs(app)[1]["data"][0]["type"] == "sunburst"
    app.select_slider[0].set_value(250).run()
    assert engine[1].tree_queries[-1] == "max_nodes=250"


def test_truncated_tree_is_mentioned(run_page, empty_url, engine) -> None:
    engine[1].tree = dict(engine[1].tree, truncated=True)
    app = run_page("engine", empty_url, engine_url=engine[0])
    assert any("largest nodes only" in caption.value for caption in app.caption)


def test_empty_cache_says_so(run_page, empty_url, engine) -> None:
    engine[1].tree = {"namespaces": [], "truncated": False}
    app = run_page("engine", empty_url, engine_url=engine[0])
    assert any("cache is empty" in info.value for info in app.info)


def test_unreachable_engine_shows_a_warning(run_page, empty_url) -> None:
    app = run_page("engine", empty_url)
    assert any("engine is not reachable" in warning.value for warning in app.warning)
    assert not app.get("plotly_chart")


def test_namespaces_are_named_by_tenant_from_the_database(run_page, engine, tmp_path) -> None:
    from dataclasses import replace

    from dashboard_testkit import create_database, seeded_records

    named = [replace(seeded_records()[0], request_id="ns-1", tenant="acme", namespace_label="5a1t0001")]
    url = create_database(tmp_path / "named.db", named)
    app = run_page("engine", url, engine_url=engine[0])
    namespaces = app.dataframe[0].value.set_index("namespace")
    assert namespaces.loc["5a1t0001", "tenant"] == "acme"
    assert namespaces.loc["5a1t0002", "tenant"] == "unknown (no request recorded under it)"
    labels = chart_specs(app)[1]["data"][0]["labels"]
    assert "tenant acme" in labels and "ns 5a1t0002" in labels
    assert not any("/v1/cache/tenants" in query for query in engine[1].tree_queries)


def _tier(enabled: bool, capacity: int, cached: int, evictable: int, **counters: float) -> dict:
    values = {
        "enabled": enabled, "capacity_tokens": capacity, "cached_tokens": cached, "free_tokens": capacity - cached,
        "evictable_tokens": evictable, "protected_tokens": cached - evictable, "capacity_bytes": capacity * 1024,
        "hit_tokens_total": 0, "loads_total": 0, "load_tokens_total": 0, "load_ms_total": 0.0,
        "demoted_tokens_total": 0, "dropped_tokens_total": 0, "corrupt_files_total": 0,
    }
    return values | counters


def tiers_payload() -> dict:
    """Device and host tiers on, disk off, in the shape of `/v1/cache` `tiers`."""
    return {
        "device": _tier(True, 4096, 1024, 960, hit_tokens_total=5000, demoted_tokens_total=3000),
        "host": _tier(True, 16384, 3000, 3000, hit_tokens_total=1200, loads_total=4, load_tokens_total=1200,
                      load_ms_total=10.0, dropped_tokens_total=500),
        "disk": _tier(False, 0, 0, 0),
    }


def test_each_tier_s_occupancy_and_counters(run_page, empty_url, engine) -> None:
    engine[1].stats = dict(engine_stats_payload(), tiers=tiers_payload())
    app = run_page("engine", empty_url, engine_url=engine[0])
    shown = metrics(app)
    assert shown["Device tier used"] == "25.0%"
    assert shown["Host tier used"] == f"{3000 / 16384:.1%}"
    assert shown["Disk tier used"] == "off"
    occupancy = chart_specs(app)[1]
    assert occupancy["data"][0]["y"] == ["device", "host"]  # enabled tiers only
    # locked, evictable, free per tier
    assert [trace["x"] for trace in occupancy["data"]] == [[64, 0], [960, 3000], [3072, 13384]]
    assert chart_specs(app)[2]["data"][0]["type"] == "icicle"  # the tree still follows
    table = app.dataframe[0].value.set_index("tier")
    assert list(table.index) == ["device", "host", "disk"]
    assert table.loc["host", "capacity"] == "16.00 MiB"
    assert (table.loc["host", "loads"], table.loc["host", "tokens loaded"], table.loc["host", "mean load"]) == (
        4, 1200, "2 ms")
    assert (table.loc["device", "hit tokens"], table.loc["device", "demoted tokens"]) == (5000, 3000)
    assert table.loc["host", "dropped tokens"] == 500 and table.loc["disk", "capacity"] == "-"
    assert not bool(table.loc["disk", "enabled"])


def test_an_engine_without_tiers_is_shown_without_them(run_page, empty_url, engine) -> None:
    app = run_page("engine", empty_url, engine_url=engine[0])  # the stand-in's default answer has no `tiers`
    assert any("does not report cache tiers" in caption.value for caption in app.caption)
    assert not any(label.endswith("tier used") for label in metrics(app))
    assert len(chart_specs(app)) == 2  # the pool and the tree only


def test_a_malformed_tiers_object_is_reported_not_drawn(run_page, empty_url, engine) -> None:
    engine[1].stats = dict(engine_stats_payload(), tiers=["device"])
    app = run_page("engine", empty_url, engine_url=engine[0])
    assert any("'tiers' is not an object" in warning.value for warning in app.warning)
