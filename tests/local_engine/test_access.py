"""Engine access: the API key on every endpoint but /health, the admin token on the cache views, and no listening on
a non-loopback address without a key."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from local_engine.api.access import check_bind, is_loopback

from .server_fixtures import served_engine

CHAT = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
API_ROUTES = [
    ("GET", "/metrics", None),
    ("GET", "/v1/models", None),
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/completions", {"model": "tiny-llama", "prompt": "hi", "max_tokens": 2}),
    ("POST", "/v1/cache/match", CHAT),
    ("GET", "/v1/cache", None),  # aggregate statistics only: the gateway records them with its history
]
ADMIN_ROUTES = [("GET", "/v1/cache/tree", None), ("POST", "/v1/cache/flush", None)]


def call(base_url: str, method: str, path: str, body, token: str | None) -> httpx.Response:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, base_url + path, json=body, headers=headers, timeout=60)


@pytest.fixture(scope="module")
def keyed(tiny_loaded):
    with served_engine(tiny_loaded, admin_token="admin-token", api_key="engine-key", kv_cache_tokens=4096) as served:
        yield served[0]


def test_health_is_public(keyed):
    assert httpx.get(f"{keyed}/health").status_code == 200


@pytest.mark.parametrize(("method", "path", "body"), API_ROUTES)
def test_every_endpoint_needs_the_api_key(keyed, method, path, body):
    for token in (None, "wrong"):
        refused = call(keyed, method, path, body, token)
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "authentication_error"
    assert call(keyed, method, path, body, "engine-key").status_code == 200
    assert call(keyed, method, path, body, "admin-token").status_code == 200


@pytest.mark.parametrize(("method", "path", "body"), ADMIN_ROUTES)
def test_cache_views_need_the_admin_token(keyed, method, path, body):
    for token in (None, "engine-key"):
        refused = call(keyed, method, path, body, token)
        assert refused.status_code == 401
        assert "admin token" in refused.json()["error"]["message"]
    assert call(keyed, method, path, body, "admin-token").status_code == 200


def test_with_a_key_but_no_admin_token_the_cache_views_are_closed(tiny_loaded):
    with served_engine(tiny_loaded, api_key="engine-key", kv_cache_tokens=2048) as (url, _):
        for method, path, body in ADMIN_ROUTES:
            assert call(url, method, path, body, "engine-key").status_code == 403
        assert call(url, "GET", "/v1/models", None, "engine-key").status_code == 200


def test_binding_beyond_loopback_needs_a_key():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5")
    assert check_bind("127.0.0.1", None, insecure=False) is None
    assert check_bind("0.0.0.0", "k", insecure=False) is None
    assert check_bind("0.0.0.0", None, insecure=True) is None
    assert "--insecure" in (check_bind("0.0.0.0", None, insecure=False) or "")


def test_the_engine_command_refuses_a_public_address_without_a_key():
    result = subprocess.run(
        [sys.executable, "-m", "prefixscope", "engine", "--host", "0.0.0.0", "--port", "9"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "PREFIXSCOPE_ENGINE_API_KEY": ""},
    )
    assert result.returncode == 2
    assert "refusing to listen on 0.0.0.0 without an API key" in result.stderr


def test_the_dashboard_reads_the_cache_views_with_the_admin_token(keyed):
    from dashboard.engine_client import EngineUnavailable, fetch_cache_stats, fetch_cache_tree
    from dashboard.settings import settings_from_env

    assert settings_from_env({"PREFIXSCOPE_DASHBOARD_ENGINE_TOKEN": "admin-token"}).engine_token == "admin-token"
    assert fetch_cache_stats(keyed, 30, token="admin-token").capacity_tokens == 4096
    assert fetch_cache_tree(keyed, 10, 30, token="admin-token").namespaces is not None
    with pytest.raises(EngineUnavailable):
        fetch_cache_tree(keyed, 10, 30)
