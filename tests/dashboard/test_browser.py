"""The dashboard in a real headless browser: `prefixscope dashboard` serving a seeded SQLite database.

Needs the `playwright` Python package and a system Chromium (Debian's `chromium`); no browser is downloaded. When
CI=true a missing browser fails the test instead of skipping it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from dashboard_testkit import create_database, expected_figures, free_port
from explain_testkit import CEILING_HIT_RATE, TOKENS_LOST, explained_records

from dashboard import ui

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
STARTUP_TIMEOUT_S = 60
VIEWS = Path(__file__).resolve().parents[2] / "dashboard" / "views"


def every_page_path() -> list[str]:
    """The URL path of every page in `dashboard/views/` (the Overview is the root), as `dashboard/app.py` names them."""
    app = (VIEWS.parent / "app.py").read_text()
    paths = []
    for view in sorted(VIEWS.glob("*.py")):
        path = "" if view.stem == "overview" else view.stem.replace("_", "-")
        assert path == "" or f'url_path="{path}"' in app, f"dashboard/app.py serves {view.name} elsewhere"
        paths.append(path)
    return paths
PAGE_TIMEOUT_MS = 30_000


def _chromium_path() -> str | None:
    for candidate in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def _require_browser() -> str:
    reason = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        reason = "the playwright Python package is not installed"
    chromium = _chromium_path()
    if reason is None and chromium is None:
        reason = "no system Chromium (apt-get install chromium)"
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser test cannot run in CI: {reason}")
        pytest.skip(reason)
    assert chromium is not None
    return chromium


def _prefixscope_command() -> list[str]:
    script = Path(sys.executable).parent / "prefixscope"
    return [str(script)] if script.exists() else [sys.executable, "-m", "prefixscope.cli"]


@contextmanager
def _served_dashboard(database_url: str, engine_url: str, log_dir: Path) -> Iterator[str]:
    """`prefixscope dashboard` on a free port over `database_url`, until the block ends."""
    port = free_port()
    log = (log_dir / "dashboard.log").open("w")
    process = subprocess.Popen(
        [
            *_prefixscope_command(),
            "dashboard",
            "--port",
            str(port),
            "--database-url",
            database_url,
            "--engine",
            engine_url,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so teardown stops Streamlit as well
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            try:
                if httpx.get(f"{url}/_stcore/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail(f"the dashboard did not start: {Path(log.name).read_text()[-2000:]}")
            time.sleep(0.3)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


@pytest.fixture(scope="module")
def dashboard_url(seeded_url: str, engine_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with _served_dashboard(seeded_url, engine_server[0], tmp_path_factory.mktemp("dashboard-log")) as url:
        yield url


@pytest.fixture(scope="module")
def explained_dashboard_url(engine_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The dashboard over history with miss reasons and block hash chains (the Why misses and What-if pages)."""
    database_url = create_database(tmp_path_factory.mktemp("explained") / "prefixscope.db", explained_records())
    with _served_dashboard(database_url, engine_server[0], tmp_path_factory.mktemp("explained-log")) as url:
        yield url


@pytest.fixture(scope="module")
def browser_page(dashboard_url: str) -> Iterator[object]:
    chromium = _require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(PAGE_TIMEOUT_MS)
            page.on("request", lambda request: None if _is_local(request.url) else OUTSIDE_REQUESTS.append(request.url))
            yield page
        finally:
            browser.close()


# Every request the browser made to anything but this machine, over all the tests of this module.
OUTSIDE_REQUESTS: list[str] = []


def _is_local(url: str) -> bool:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.scheme in ("data", "blob", "about") or parts.hostname in ("127.0.0.1", "localhost")


def _wait_until_rendered(page: object) -> None:
    """Wait for the script run to finish: no "running" indicator and no placeholder skeletons left."""
    page.wait_for_function(  # type: ignore[attr-defined]
        """() => document.querySelector('[data-testid="stApp"][data-test-script-state="notRunning"]')
             && !document.querySelector('[data-testid="stSkeleton"]')"""
    )
    page.wait_for_timeout(500)  # type: ignore[attr-defined]  # let charts and the data grid paint


def _metric_value(page: object, label: str) -> str:
    metric = page.locator('[data-testid="stMetric"]', has_text=label).first  # type: ignore[attr-defined]
    metric.wait_for()
    return metric.locator('[data-testid="stMetricValue"]').inner_text().strip()


def test_overview_in_a_browser_shows_the_databases_hit_rate(
    browser_page, dashboard_url: str, records, tmp_path_factory: pytest.TempPathFactory
) -> None:
    page = browser_page
    page.goto(dashboard_url)
    expected = expected_figures(records)
    assert _metric_value(page, "Token hit rate") == ui.format_share(expected.token_hit_rate)
    assert _metric_value(page, "Requests with any hit") == ui.format_share(expected.request_hit_share)
    page.locator(".js-plotly-plot").first.wait_for()
    _wait_until_rendered(page)
    assert page.locator('[data-testid="stException"]').count() == 0
    screenshot = tmp_path_factory.mktemp("screens") / "overview.png"
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 10_000
    print(f"screenshot: {screenshot}")


@pytest.mark.parametrize(
    ("path", "marker"),
    [
        ("requests", '[data-testid="stMetric"]'),
        ("prefixes", '[data-testid="stDataFrame"]'),
        ("engine", ".js-plotly-plot"),
        ("cost", '[data-testid="stMetric"]'),
        ("advice", "h1"),
        ("replicas", "h1"),
    ],
)
def test_every_page_renders_in_a_browser(
    browser_page, dashboard_url: str, path: str, marker: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    page = browser_page
    page.goto(f"{dashboard_url}/{path}")
    page.locator(marker).first.wait_for()
    _wait_until_rendered(page)
    assert page.locator('[data-testid="stException"]').count() == 0
    page.screenshot(path=str(tmp_path_factory.mktemp("screens") / f"{path}.png"), full_page=True)


@pytest.mark.parametrize(
    ("path", "label", "expected"),
    [
        ("why-misses", "Tokens lost", ui.format_tokens(TOKENS_LOST)),
        ("what-if", "Unlimited cache, no TTL", ui.format_share(CEILING_HIT_RATE)),
    ],
)
def test_why_misses_and_what_if_render_in_a_browser(
    browser_page,
    explained_dashboard_url: str,
    path: str,
    label: str,
    expected: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    page = browser_page
    page.goto(f"{explained_dashboard_url}/{path}")
    assert _metric_value(page, label) == expected
    page.locator(".js-plotly-plot").first.wait_for()
    page.locator('[data-testid="stDataFrame"]').first.wait_for()
    _wait_until_rendered(page)
    assert page.locator('[data-testid="stException"]').count() == 0
    screenshot = tmp_path_factory.mktemp("screens") / f"{path}.png"
    page.screenshot(path=str(screenshot), full_page=True)
    assert screenshot.stat().st_size > 10_000
    print(f"screenshot: {screenshot}")


def test_the_dashboard_works_offline_no_request_leaves_127_0_0_1(browser_page, dashboard_url: str) -> None:
    """A tour of every page: nothing is fetched from another host (fonts, icons, analytics), and the page icon
    the browser would fetch is served by the dashboard itself."""
    page = browser_page
    paths = every_page_path()
    assert len(paths) == 10, paths
    for path in paths:
        page.goto(f"{dashboard_url}/{path}")
        _wait_until_rendered(page)
        icons = page.eval_on_selector_all('link[rel~="icon"]', "links => links.map(link => link.href)")
        assert icons and all(_is_local(href) for href in icons), icons
        sources = page.eval_on_selector_all("[src]", "nodes => nodes.map(node => node.src)")
        assert all(_is_local(src) for src in sources if src), sources
    assert OUTSIDE_REQUESTS == []
