"""The Conversations page and a conversation's waterfall in a real headless Chromium, against the database's own
figures (`db.queries.conversations` read from the database the dashboard serves)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import test_browser as browser
from dashboard_testkit import create_database
from sqlalchemy import create_engine

from dashboard import ui
from dashboard.charts_conversations import ledger_parts
from db.queries.conversations import conversation, conversation_totals
from db.timeutil import utc_now
from tests.conversation_samples import conversation_records

WATERFALL_TRACES = """() => {
    const plot = [...document.querySelectorAll('.js-plotly-plot')]
        .find(node => JSON.stringify(node.layout.title).includes('per turn'));
    return plot.data.map(trace => ({name: trace.name, type: trace.type, x: trace.x, y: trace.y}));
}"""


@pytest.fixture(scope="module")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("conversations-browser") / "prefixscope.db"
    return create_database(path, conversation_records(utc_now() - timedelta(hours=2)))


@pytest.fixture(scope="module")
def page(database_url: str, engine_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    chromium = browser._require_browser()
    from playwright.sync_api import sync_playwright

    log_dir = tmp_path_factory.mktemp("conversations-browser-log")
    with browser._served_dashboard(database_url, engine_server[0], log_dir) as url, sync_playwright() as playwright:
        chromium_browser = playwright.chromium.launch(
            executable_path=chromium, args=browser.CHROMIUM_ARGS, headless=True
        )
        try:
            tab = chromium_browser.new_page(viewport={"width": 1400, "height": 1200})
            tab.set_default_timeout(3 * browser.PAGE_TIMEOUT_MS)  # a loaded machine starts Streamlit slowly
            tab.dashboard_url = url  # type: ignore[attr-defined]
            yield tab
        finally:
            chromium_browser.close()


def _database_figures(url: str, conversation_id: str, tenant: str | None = None):
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            since = utc_now() - timedelta(days=30)
            return conversation_totals(conn, since, utc_now()), conversation(conn, conversation_id, tenant)
    finally:
        engine.dispose()


def _rate(value: float | None) -> str:
    return "-" if value is None else ui.format_share(value)


def test_conversations_page_and_waterfall_show_the_databases_figures(
    page, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    totals, worst = _database_figures(database_url, "conv-a")
    page.goto(f"{page.dashboard_url}/conversations")  # type: ignore[attr-defined]
    assert browser._metric_value(page, "Conversations") == f"{totals.conversations:,}"
    assert browser._metric_value(page, "Turns") == f"{totals.turns:,}"
    assert browser._metric_value(page, "Token hit rate") == _rate(totals.token_hit_rate)
    assert browser._metric_value(page, "Eligible hit rate") == _rate(totals.eligible_hit_rate)
    assert browser._metric_value(page, "Tokens lost") == f"{totals.lost_tokens:,}"
    assert browser._metric_value(page, "Conversation tokens lost") == f"{worst.summary.lost_tokens:,}"
    page.locator(".js-plotly-plot").first.wait_for()  # type: ignore[attr-defined]
    browser._wait_until_rendered(page)
    assert page.locator('[data-testid="stException"]').count() == 0  # type: ignore[attr-defined]
    traces = {trace["name"]: trace for trace in page.evaluate(WATERFALL_TRACES)}  # type: ignore[attr-defined]
    for position, turn in enumerate(worst.turns):
        drawn = {name: trace["y"][position] for name, trace in traces.items()
                 if trace["type"] == "bar" and trace["y"][position]}
        assert drawn == ledger_parts(turn)
        assert sum(drawn.values()) == turn.prompt_tokens
    rewritten = [f"turn {turn.turn_index}" for turn in worst.turns if turn.answer_rewrite]
    assert traces["answer rewritten"]["x"] == rewritten
    assert traces["replica changed"]["x"] == [f"turn {turn.turn_index}" for turn in worst.turns
                                              if turn.replica_changed]
    assert traces["idle past TTL"]["x"] == [f"turn {turn.turn_index}" for turn in worst.turns
                                            if turn.idle_beyond_ttl]
    screenshot = tmp_path_factory.mktemp("screens") / "conversations.png"
    page.screenshot(path=str(screenshot), full_page=True)  # type: ignore[attr-defined]
    assert screenshot.stat().st_size > 10_000
    print(f"screenshot: {screenshot}")


def test_a_linked_conversation_with_unknown_counts_reads_dashes(page, database_url: str) -> None:
    _, unknown = _database_figures(database_url, "conv-c", "beta")
    page.goto(f"{page.dashboard_url}/conversations?conversation=conv-c&tenant=beta")  # type: ignore[attr-defined]
    page.get_by_text("Conversation conv-c").first.wait_for()  # type: ignore[attr-defined]
    assert unknown.summary.eligible_hit_rate is None and unknown.summary.lost_tokens is None
    assert browser._metric_value(page, "Conversation eligible hit rate") == "-"
    assert browser._metric_value(page, "Conversation tokens lost") == "-"
    browser._wait_until_rendered(page)
    traces = page.evaluate(WATERFALL_TRACES)  # type: ignore[attr-defined]
    assert [(trace["name"], trace["y"]) for trace in traces] == [("unknown", [300, 300])]
