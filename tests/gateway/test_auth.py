"""Keys: open mode with no key, keys required once one exists, unknown and revoked keys are 401."""

from __future__ import annotations

import time

import httpx
import pytest
from gateway_testkit import FakeStorage, gateway_config, running_gateway

from gateway.auth import KeySnapshot, KeyStore, bearer_token
from gateway.errors import ServiceUnavailable, Unauthorized

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def post(url: str, key: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=headers)


def test_open_mode_serves_the_default_tenant(gateway):
    response = post(gateway.url)
    assert response.status_code == 200
    (record,) = gateway.wait_records(1)
    assert record.tenant == "default"
    assert record.key_id is None
    assert httpx.get(f"{gateway.url}/health").json()["open_mode"] is True


def test_keys_required_once_a_key_exists(stub, stub_url):
    storage = FakeStorage()
    secret = storage.add_key("k1", "acme")
    with running_gateway(gateway_config(stub_url), storage) as gw:
        missing = post(gw.url)
        assert missing.status_code == 401
        assert missing.json()["error"]["type"] == "authentication_error"
        assert post(gw.url, "wrong-key").status_code == 401
        ok = post(gw.url, secret)
        assert ok.status_code == 200
        assert [(r.tenant, r.key_id, r.status_code) for r in gw.wait_records(3)] == [
            ("unauthenticated", None, 401),
            ("unauthenticated", None, 401),
            ("acme", "k1", 200),
        ]
        assert len(stub.state.requests) == 1  # rejected requests never reach the upstream
        assert httpx.get(f"{gw.url}/health").json()["open_mode"] is False


def wait_for_status(url: str, key: str | None, status: int) -> httpx.Response:
    """Poll until the background key refresh has picked up a change (bounded; no timing assertion)."""
    deadline = time.monotonic() + 10
    while True:
        response = post(url, key)
        if response.status_code == status or time.monotonic() > deadline:
            return response
        time.sleep(0.05)


def test_revoked_key_is_rejected_after_refresh(stub, stub_url):
    storage = FakeStorage()
    secret = storage.add_key("k1", "acme")
    other = storage.add_key("k2", "beta")
    with running_gateway(gateway_config(stub_url), storage) as gw:
        assert post(gw.url, secret).status_code == 200
        storage.revoked.add("k1")
        assert wait_for_status(gw.url, secret, 401).status_code == 401
        assert post(gw.url, other).status_code == 200
        # Revoking every key must not reopen the gateway.
        storage.revoked.add("k2")
        assert wait_for_status(gw.url, other, 401).status_code == 401
        assert post(gw.url).status_code == 401


def test_key_created_while_running_closes_open_mode(stub, stub_url):
    storage = FakeStorage()
    with running_gateway(gateway_config(stub_url), storage) as gw:
        assert post(gw.url).status_code == 200
        secret = storage.add_key("k1", "acme")
        assert wait_for_status(gw.url, None, 401).status_code == 401
        assert post(gw.url, secret).status_code == 200


def test_bearer_parsing():
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer   abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token(None) is None


async def test_keystore_refuses_before_first_load_and_keeps_keys_when_db_fails():
    calls = {"n": 0}

    async def loader() -> KeySnapshot:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("database down")
        if calls["n"] == 3:
            raise OSError("database down again")
        return KeySnapshot(entries={"k": "entry"}, any_key_exists=True)

    class Entry:
        tenant, key_id, is_admin = "acme", "k", False

    store = KeyStore(loader, lambda token, entries: Entry() if token == "good" else None, refresh_interval_s=60)
    assert not await store.refresh()
    with pytest.raises(ServiceUnavailable):
        store.authenticate("Bearer good")
    assert await store.refresh()
    assert store.authenticate("Bearer good").tenant == "acme"
    assert not await store.refresh()  # failure keeps the previous keys
    assert store.authenticate("Bearer good").tenant == "acme"
    with pytest.raises(Unauthorized):
        store.authenticate("Bearer bad")
