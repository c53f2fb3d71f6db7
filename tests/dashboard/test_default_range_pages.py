"""Every page opened directly (a bookmark, a reload) picks its default range from the data's span, as the overview
does: a fresh install's minutes are not drawn on a 7-day axis."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from dashboard_testkit import closed_port_url, create_database, seeded_records

from dashboard import settings as names

APP_SCRIPT = "dashboard/app.py"


@pytest.mark.parametrize("page", ["requests", "prefixes", "why_misses", "advice", "what_if", "cost"])
def test_a_page_opened_directly_defaults_to_a_range_that_fits_the_data(page, tmp_path, monkeypatch) -> None:
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    now = datetime.now(UTC)
    fresh = [
        replace(record, created_at=now - timedelta(minutes=5 + index))
        for index, record in enumerate(seeded_records()[:4])
    ]
    monkeypatch.setenv(names.ENV_DATABASE_URL, create_database(tmp_path / "fresh.db", fresh))
    monkeypatch.setenv(names.ENV_ENGINE_URL, closed_port_url())
    monkeypatch.setenv(names.ENV_ENGINE_TIMEOUT_S, "2")
    script = Path(__file__).resolve().parents[2] / APP_SCRIPT
    app = AppTest.from_file(str(script), default_timeout=60)
    app.switch_page(f"views/{page}.py").run()  # the first run is this page: nothing remembered from the overview
    assert not app.exception, [item.message for item in app.exception]
    (time_range,) = [box for box in app.sidebar.selectbox if box.label == "Time range"]
    assert time_range.value in ("Last hour", "Last 6 hours")
