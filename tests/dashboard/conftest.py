"""Fixtures for the dashboard tests: seeded and empty databases, a stand-in engine, and AppTest runners."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from dashboard_testkit import (  # noqa: E402
    FakeEngineState,
    closed_port_url,
    create_database,
    fake_engine,
    seeded_records,
)

from db.records import RequestRecord  # noqa: E402

APP_SCRIPT = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
PAGE_TIMEOUT_S = 60


@pytest.fixture(autouse=True)
def _fresh_streamlit_caches() -> Iterator[None]:
    """Each test starts with empty Streamlit caches (they are process-wide)."""
    import streamlit as st

    st.cache_data.clear()
    st.cache_resource.clear()
    yield
    st.cache_data.clear()
    st.cache_resource.clear()


@pytest.fixture(scope="session")
def records() -> list[RequestRecord]:
    return seeded_records()


@pytest.fixture(scope="session")
def seeded_url(tmp_path_factory: pytest.TempPathFactory, records: list[RequestRecord]) -> str:
    return create_database(tmp_path_factory.mktemp("seeded") / "prefixscope.db", records)


@pytest.fixture(scope="session")
def empty_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Migrated, no requests."""
    return create_database(tmp_path_factory.mktemp("empty") / "prefixscope.db", [])


@pytest.fixture(scope="session")
def engine_server() -> Iterator[tuple[str, FakeEngineState]]:
    with fake_engine() as served:
        yield served


@pytest.fixture
def engine(engine_server: tuple[str, FakeEngineState]) -> tuple[str, FakeEngineState]:
    """The stand-in engine with its default answers restored for this test."""
    url, state = engine_server
    fresh = FakeEngineState()
    state.stats, state.tree, state.tree_queries = fresh.stats, fresh.tree, fresh.tree_queries
    return url, state


PageRunner = Callable[..., "object"]


@pytest.fixture
def run_page(monkeypatch: pytest.MonkeyPatch) -> Callable[..., object]:
    """`run_page(page, database_url=..., engine_url=..., **env)`: the dashboard on that page, after one run.

    `page` is a view name (`overview`, `requests`, ...). Settings travel through the environment, as with
    `prefixscope dashboard`. The engine URL defaults to a closed port.
    """
    from streamlit.testing.v1 import AppTest

    from dashboard import settings as names

    def run(page: str, database_url: str, engine_url: str | None = None, **env: str) -> AppTest:
        monkeypatch.setenv(names.ENV_DATABASE_URL, database_url)
        monkeypatch.setenv(names.ENV_ENGINE_URL, engine_url or closed_port_url())
        monkeypatch.setenv(names.ENV_ENGINE_TIMEOUT_S, "2")
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        app = AppTest.from_file(str(APP_SCRIPT), default_timeout=PAGE_TIMEOUT_S).run()
        if page != "overview":
            app.switch_page(f"views/{page}.py").run()
        assert not app.exception, [item.message for item in app.exception]
        return app

    return run
