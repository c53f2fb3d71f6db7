"""Requests page: the filterable table and one request's detail."""

from __future__ import annotations

from dashboard_testkit import ALPHA_PROMPT_TEXT, PREFIX_ALPHA


def table(app: object):  # -> pandas.DataFrame
    return app.dataframe[0].value  # type: ignore[attr-defined]


def markdown(app: object) -> str:
    return "\n".join(item.value for item in app.markdown)  # type: ignore[attr-defined]


def test_table_lists_requests_newest_first(run_page, seeded_url, records) -> None:
    app = run_page("requests", seeded_url)
    frame = table(app)
    newest_first = [record.request_id for record in sorted(records, key=lambda r: r.created_at, reverse=True)]
    assert list(frame["request id"]) == newest_first
    assert set(frame.columns) >= {"tenant", "model", "hit/miss", "miss kind"}
    by_id = frame.set_index("request id")
    assert by_id.loc["req-001", "hit/miss"] == "hit"
    assert by_id.loc["req-005", "hit/miss"] == "miss"
    assert by_id.loc["req-005", "miss kind"] == "cold"
    assert by_id.loc["req-007", "hit/miss"] == "unknown"
    assert by_id.loc["req-008", "hit/miss"] == "error"


def test_outcome_and_miss_kind_filters(run_page, seeded_url) -> None:
    app = run_page("requests", seeded_url)
    app.segmented_control[0].set_value("Misses").run()
    assert not app.exception
    assert sorted(table(app)["request id"]) == ["req-005", "req-006"]
    app.selectbox[0].set_value("evicted").run()
    assert list(table(app)["request id"]) == ["req-006"]


def test_tenant_and_model_filters(run_page, seeded_url) -> None:
    app = run_page("requests", seeded_url)
    app.sidebar.selectbox[1].set_value("alpha").run()
    assert set(table(app)["tenant"]) == {"alpha"}
    app.sidebar.selectbox[1].set_value("All tenants").run()
    app.sidebar.selectbox[2].set_value("m-large").run()
    assert set(table(app)["model"]) == {"m-large"}


def test_the_table_says_why_and_filters_by_reason(run_page, seeded_url) -> None:
    app = run_page("requests", seeded_url)
    row = table(app).set_index("request id").loc["req-004"]
    assert (row["reason"], row["segment"], row["offset"], row["tokens lost"], row["rules"]) == (
        "system_changed", "system", 1830, 552, "canonical_tool_order")
    app.selectbox[1].set_value("system_changed").run()
    assert list(table(app)["request id"]) == ["req-004"]


def test_filters_without_matches_say_so(run_page, seeded_url) -> None:
    app = run_page("requests", seeded_url)
    app.segmented_control[0].set_value("Hits").run()
    app.selectbox[0].set_value("expired").run()
    assert any("No requests match" in info.value for info in app.info)


def test_detail_of_a_partial_hit(run_page, seeded_url) -> None:
    app = run_page("requests", seeded_url)
    app.text_input[0].set_value("req-004").run()
    assert not app.exception
    shown = {metric.label: metric.value for metric in app.metric}
    assert shown["Prompt tokens"] == "1,000"
    assert shown["Cached tokens"] == "448"
    assert shown["Computed tokens"] == "552"
    text = markdown(app)
    assert "partial hit" in text
    assert (
        "**Why:** `system_changed`; the prompt first differed from the cached prefix in `system` at character "
        "1,830 (token 448), as the engine located it; 552 prompt tokens were computed again"
    ) in text
    assert "`canonical_tool_order`" in text
    bar = app.get("plotly_chart")[0].proto.spec
    assert "cached: 448 tokens" in bar and "computed: 552 tokens" in bar


def test_detail_shows_rules_miss_kind_and_stored_prompt(run_page, seeded_url) -> None:
    app = run_page("requests", seeded_url)
    app.text_input[0].set_value("req-002").run()
    text = markdown(app)
    assert "`canonical_json_keys`, `newline_normalization`" in text
    assert "hit: the whole prompt but its last token came from the cache" in text
    assert PREFIX_ALPHA in text
    app.text_input[0].set_value("req-001").run()
    assert any(ALPHA_PROMPT_TEXT in item.value for item in app.text)


def test_detail_of_a_cold_miss_without_rules(run_page, seeded_url) -> None:
    app = run_page("requests", seeded_url)
    app.text_input[0].set_value("req-006").run()
    text = markdown(app)
    assert "miss, evicted" in text
    assert "none (the request was already canonical)" in text


def test_detail_with_unknown_tokens_says_so(run_page, seeded_url) -> None:
    app = run_page("requests", seeded_url)
    app.text_input[0].set_value("req-008").run()
    assert any("did not report token counts" in info.value for info in app.info)
    assert "upstream_error" in markdown(app)


def test_unknown_request_id_warns(run_page, seeded_url) -> None:
    app = run_page("requests", seeded_url)
    app.text_input[0].set_value("no-such-request").run()
    assert any("No request with id" in warning.value for warning in app.warning)


def test_empty_database_shows_a_message(run_page, empty_url) -> None:
    app = run_page("requests", empty_url)
    assert any("No requests recorded yet" in info.value for info in app.info)


def test_detail_splits_cached_tokens_by_tier(run_page, tmp_path) -> None:
    from dataclasses import replace

    from dashboard_testkit import create_database, seeded_records

    tiered = [
        replace(record, cached_tokens_device=400, cached_tokens_host=48, cached_tokens_disk=0, cache_load_ms=3.0,
                retention_class="1h") if record.request_id == "req-004" else record
        for record in seeded_records()
    ]
    app = run_page("requests", create_database(tmp_path / "tiers.db", tiered))
    app.text_input[0].set_value("req-004").run()
    text = markdown(app)
    assert "**Cached tokens by tier:** device 400 · host 48 · disk 0, loaded back to the device in 3 ms" in text
    assert "**Retention class:** 1h" in text
    app.text_input[0].set_value("req-001").run()
    assert "**Cached tokens by tier:** unknown (the upstream does not report tiers)" in markdown(app)
