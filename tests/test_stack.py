"""The whole stack as a user runs it: `prefixscope up`, a few requests through the gateway with the `openai` package,
then the dashboard in a real browser shows them.

Needs the real model, the `playwright` package and Debian's Chromium; when CI=true a missing browser fails the test.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

pytestmark = pytest.mark.real_model

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
SYSTEM = "You are the order desk of Contoso Books. Answer briefly and politely. " * 12


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _chromium() -> str:
    chromium = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        chromium = None
    if chromium is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the stack test needs playwright and Debian's chromium in CI")
        pytest.skip("playwright or chromium is missing")
    return chromium


def _wait_for(url: str, process: subprocess.Popen, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, "prefixscope up exited early"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{url} did not come up")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("stack")
    ports = {name: _free_port() for name in ("engine", "gateway", "dashboard")}
    database_url = f"sqlite+aiosqlite:///{workdir / 'prefixscope.db'}"
    log = (workdir / "up.log").open("w")
    home = workdir / "home"
    process = subprocess.Popen(
        [sys.executable, "-m", "prefixscope", "up", "--kv-cache-tokens", "8192", "--database-url", database_url,
         "--engine-port", str(ports["engine"]), "--gateway-port", str(ports["gateway"]),
         "--dashboard-port", str(ports["dashboard"]), "--open"],
        cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PREFIXSCOPE_HOME": str(home), "PYTHONUNBUFFERED": "1"},
    )
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    try:
        _wait_for(urls["engine"] + "/health", process)
        _wait_for(urls["gateway"] + "/health", process)
        _wait_for(urls["dashboard"] + "/_stcore/health", process)
        yield urls, database_url, process, workdir
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        log.close()


def test_requests_through_the_gateway_appear_on_the_dashboard(stack):
    urls, database_url, _, workdir = stack
    assert "OPEN MODE" in (workdir / "up.log").read_text()  # said loudly
    # The engine shares a generated key with the gateway: nothing reaches it around the gateway.
    direct = httpx.post(urls["engine"] + "/v1/chat/completions", json={"model": "smollm2", "messages": []}, timeout=30)
    assert direct.status_code == 401
    assert httpx.get(urls["engine"] + "/v1/cache/tree", timeout=30).status_code == 401
    client = OpenAI(base_url=urls["gateway"] + "/v1", api_key="unused-in-open-mode", max_retries=0, timeout=120)
    cached = []
    for question in ("Is my order shipped?", "Can I change the address?", "Do you gift-wrap?"):
        reply = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            max_tokens=4,
            temperature=0,
        )
        cached.append(reply.usage.prompt_tokens_details.cached_tokens)
    assert cached[0] == 0 and cached[1] > 0 and cached[2] > 0

    from db.engine import create_sync_engine_for
    from db.queries import overview

    engine = create_sync_engine_for(database_url)
    deadline = time.monotonic() + 30
    while True:  # the gateway's writer flushes in the background
        with engine.connect() as conn:
            totals = overview(conn, since=datetime.now(timezone.utc) - timedelta(hours=24))
        if totals.requests == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert totals.requests == 3

    from dashboard import ui
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            page.goto(urls["dashboard"])
            # The metric labelled exactly "Requests" (not "Requests with any hit").
            requests_metric = page.locator('[data-testid="stMetric"]').filter(
                has=page.get_by_text("Requests", exact=True)
            ).first
            requests_metric.wait_for()
            assert requests_metric.locator('[data-testid="stMetricValue"]').inner_text().strip() == "3"
            hit_rate = page.locator('[data-testid="stMetric"]', has_text="Token hit rate").first
            assert hit_rate.locator('[data-testid="stMetricValue"]').inner_text().strip() == ui.format_share(
                totals.token_hit_rate
            )
        finally:
            browser.close()


def test_a_second_up_on_the_same_ports_refuses_to_start(stack):
    urls, _, _, workdir = stack
    ports = [url.rsplit(":", 1)[1] for url in (urls["engine"], urls["gateway"], urls["dashboard"])]
    result = subprocess.run(
        [sys.executable, "-m", "prefixscope", "up", "--engine-port", ports[0], "--gateway-port", ports[1],
         "--dashboard-port", ports[2]],
        cwd=workdir, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2 and result.stdout == ""
    for option, port in zip(("--engine-port", "--gateway-port", "--dashboard-port"), ports, strict=True):
        assert f"port {port} on 127.0.0.1" in result.stderr and f"{option} PORT" in result.stderr


def test_ctrl_c_stops_the_stack_with_status_0_and_state_lives_in_the_state_dir(stack):
    urls, database_url, process, workdir = stack
    home = workdir / "home"
    os.killpg(process.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    assert process.wait(timeout=60) == 0
    log = (workdir / "up.log").read_text()
    assert "stopping the rest" not in log and "Traceback" not in log
    assert f"state     {home}\n" in log and f"database  {database_url}\n" in log
    assert f"prefixscope gateway: secret    {home / 'gateway_secret'}\n" in log
    assert (home / "gateway_secret").is_file() and not (workdir / "var").exists()
    for url in urls.values():
        with pytest.raises(httpx.HTTPError):
            httpx.get(url, timeout=2)
