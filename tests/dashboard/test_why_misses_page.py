"""Why misses page: tokens lost per reason, divergence places, examples and normalization gains, against hand sums."""

from __future__ import annotations

import json

import pytest
from dashboard_testkit import create_database
from explain_testkit import (
    BETA_TOKENS_LOST,
    GAIN_SAMPLED,
    GAIN_SHARE,
    GAIN_TOKENS,
    GAIN_WITH_GAIN,
    LOST_BY_REASON,
    REQUESTS_BY_REASON,
    TOKENS_LOST,
    explained_records,
)

from dashboard import ui


@pytest.fixture(scope="module")
def explained_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return create_database(tmp_path_factory.mktemp("explained") / "prefixscope.db", explained_records())


def metrics(app: object) -> dict[str, str]:
    return {metric.label: metric.value for metric in app.metric}  # type: ignore[attr-defined]


# The page's tables, in page order.
TABLES = ("why_misses_reasons", "why_misses_locations", "why_misses_examples")


def frame(app: object, key: str):  # -> pandas.DataFrame
    return app.dataframe[TABLES.index(key)].value  # type: ignore[attr-defined]


def test_totals_and_reason_table_match_hand_sums(run_page, explained_url) -> None:
    app = run_page("why_misses", explained_url)
    shown = metrics(app)
    assert shown["Requests explained"] == f"{sum(REQUESTS_BY_REASON.values()):,}"
    assert shown["Missed requests"] == f"{sum(REQUESTS_BY_REASON.values()) - REQUESTS_BY_REASON['hit']:,}"
    assert shown["Tokens lost"] == ui.format_tokens(TOKENS_LOST)
    assert shown["Costliest reason"] == "evicted"
    reasons = frame(app, "why_misses_reasons").set_index("reason")
    assert set(reasons.index) == set(LOST_BY_REASON)  # `hit` loses nothing and is left out
    for reason, lost in LOST_BY_REASON.items():
        assert reasons.loc[reason, "tokens lost"] == lost
        assert reasons.loc[reason, "requests"] == REQUESTS_BY_REASON[reason]
        assert reasons.loc[reason, "share of tokens lost"] == pytest.approx(lost / TOKENS_LOST)


def test_chart_stacks_tokens_lost_per_reason(run_page, explained_url) -> None:
    app = run_page("why_misses", explained_url)
    spec = json.loads(app.get("plotly_chart")[0].proto.spec)
    bars = {trace["name"]: trace for trace in spec["data"]}
    assert set(bars) == set(LOST_BY_REASON)
    assert spec["layout"]["barmode"] == "stack"
    for reason, lost in LOST_BY_REASON.items():
        assert sum(bars[reason]["y"]) == lost
    app.segmented_control[0].set_value("requests").run()
    spec = json.loads(app.get("plotly_chart")[0].proto.spec)
    assert {trace["name"]: sum(trace["y"]) for trace in spec["data"]} == {
        reason: REQUESTS_BY_REASON[reason] for reason in LOST_BY_REASON
    }


def test_divergence_locations(run_page, explained_url) -> None:
    app = run_page("why_misses", explained_url)
    rows = frame(app, "why_misses_locations").to_dict("records")
    assert sorted((row["segment"], row["characters"], row["requests"], row["tokens lost"]) for row in rows) == [
        ("system", "0-64", 1, 500),
        ("tools", "0-64", 1, 300),
        ("tools", "64-128", 1, 200),
    ]


def test_examples_per_reason_and_opening_one_on_the_requests_page(run_page, explained_url) -> None:
    app = run_page("why_misses", explained_url)
    app.selectbox(key="why_misses_example_reason").set_value("tools_changed").run()
    examples = frame(app, "why_misses_examples")
    assert list(examples["request id"]) == ["why-003", "why-002"]  # newest first
    assert list(examples["tokens lost"]) == [200, 300]
    assert list(examples["diverged at"]) == ["tools @ char 70", "tools @ char 10"]
    app.button(key="why_misses_open").click().run()
    assert not app.exception
    assert app.text_input(key="requests_detail_id").value == "why-003"
    assert any(item.value == "Request why-003" for item in app.subheader)


def test_normalization_uplift(run_page, explained_url) -> None:
    shown = metrics(run_page("why_misses", explained_url))
    assert shown["Tokens gained by normalization"] == ui.format_tokens(GAIN_TOKENS)
    assert shown["Sampled requests"] == f"{GAIN_SAMPLED:,}"
    assert shown["Sampled requests that gained"] == f"{GAIN_WITH_GAIN:,}"
    assert shown["Share of sampled prompt tokens"] == ui.format_share(GAIN_SHARE)


def test_tenant_filter(run_page, explained_url) -> None:
    app = run_page("why_misses", explained_url)
    app.sidebar.selectbox[1].set_value("beta").run()
    assert metrics(app)["Tokens lost"] == ui.format_tokens(BETA_TOKENS_LOST)
    assert set(frame(app, "why_misses_reasons")["reason"]) == {"volatile_value", "evicted", "new_prefix"}


def test_history_without_reasons_says_so(run_page, tmp_path) -> None:
    from dataclasses import replace

    from dashboard_testkit import create_database, seeded_records

    unexplained = [replace(record, miss_reason=None, divergence_segment=None) for record in seeded_records()]
    app = run_page("why_misses", create_database(tmp_path / "unexplained.db", unexplained))
    assert any("has a recorded miss reason" in info.value for info in app.info)


def test_empty_database_shows_a_message(run_page, empty_url) -> None:
    app = run_page("why_misses", empty_url)
    assert any("No requests recorded yet" in info.value for info in app.info)


def test_missing_database_warns(run_page, tmp_path) -> None:
    app = run_page("why_misses", f"sqlite:///{tmp_path / 'missing.db'}")
    assert any("does not exist" in warning.value for warning in app.warning)
