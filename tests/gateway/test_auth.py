"""Keys: open mode only when asked for, 503 while no key exists, unknown and revoked keys are 401, a key snapshot with
bounded staleness while the key table cannot be read."""

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
    with running_gateway(gateway_config(stub_url, auth="keys"), storage) as gw:
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
    with running_gateway(gateway_config(stub_url, auth="keys"), storage) as gw:
        assert post(gw.url, secret).status_code == 200
        storage.revoked.add("k1")
        assert wait_for_status(gw.url, secret, 401).status_code == 401
        assert post(gw.url, other).status_code == 200
        # Revoking every key must not reopen the gateway.
        storage.revoked.add("k2")
        assert wait_for_status(gw.url, other, 401).status_code == 401
        assert post(gw.url).status_code == 401


def test_an_empty_key_table_is_refused_unless_open_was_chosen(stub, stub_url):
    storage = FakeStorage()
    with running_gateway(gateway_config(stub_url, auth="keys"), storage) as gw:
        refused = post(gw.url)
        assert refused.status_code == 503
        error = refused.json()["error"]
        assert error["type"] == "service_unavailable"
        assert "No API key exists" in error["message"] and "--open" in error["message"]
        health = httpx.get(f"{gw.url}/health")
        assert health.status_code == 503  # a load balancer takes it out: every request would be refused
        assert health.json()["open_mode"] is False
        assert health.json()["status"] == "degraded"
        assert health.json()["reason"] == error["message"]
        assert _started(f"{gw.url}/health")  # `prefixscope up` still sees the gateway up
        assert "prefixscope_gateway_open_mode 0.0" in httpx.get(f"{gw.url}/metrics").text
        secret = storage.add_key("k1", "acme")
        assert wait_for_status(gw.url, secret, 200).status_code == 200
        healthy = httpx.get(f"{gw.url}/health")
        assert (healthy.status_code, healthy.json()["status"], healthy.json()["reason"]) == (200, "ok", None)
        assert post(gw.url).status_code == 401
    assert len(stub.state.requests) == 1


def _started(url: str) -> bool:
    from prefixscope.supervisor import _healthy

    return _healthy(url)


def test_up_takes_only_a_stated_degraded_503_for_started():
    import http.server
    import threading

    from prefixscope.supervisor import _healthy

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            status, body = {"/degraded": (503, b'{"status": "degraded"}'), "/down": (503, b"down")}.get(
                self.path, (404, b"{}")
            )
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert [_healthy(base + path) for path in ("/degraded", "/down", "/missing")] == [True, False, False]
    finally:
        server.shutdown()
        server.server_close()


def test_the_default_configuration_is_not_open():
    from gateway.config import load_config

    assert load_config(None).open_mode is False


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


class _Entry:
    def __init__(self, key_id: str, tenant: str) -> None:
        self.key_id, self.tenant, self.is_admin = key_id, tenant, False


async def test_revocation_seen_before_an_outage_holds_and_the_snapshot_expires():
    """Within max_key_staleness_s the last snapshot answers (a key revoked before the outage stays revoked); past it
    the gateway fails closed with 503 until the key table is readable again."""
    now = {"t": 1000.0}
    table = {"good": _Entry("good", "acme"), "revoked": _Entry("revoked", "acme")}
    database = {"up": True}

    async def loader() -> KeySnapshot:
        if not database["up"]:
            raise OSError("database down")
        return KeySnapshot(entries=dict(table), any_key_exists=True)

    store = KeyStore(
        loader, lambda token, entries: entries.get(token), refresh_interval_s=60, max_staleness_s=60,
        clock=lambda: now["t"],
    )
    assert await store.refresh()
    assert store.authenticate("Bearer revoked").tenant == "acme"
    del table["revoked"]
    assert await store.refresh()  # the revocation is seen
    database["up"] = False
    now["t"] += 59
    assert not await store.refresh()
    with pytest.raises(Unauthorized):
        store.authenticate("Bearer revoked")  # 80 of 80 tries during an outage: still refused
    assert store.authenticate("Bearer good").tenant == "acme"
    assert store.refusal_reason() is None
    now["t"] += 2  # 61 s since the last read
    with pytest.raises(ServiceUnavailable) as stale:
        store.authenticate("Bearer good")
    assert "max_key_staleness_s = 60" in stale.value.message
    assert store.refusal_reason() == stale.value.message  # what /health reports with 503 "degraded"
    database["up"] = True
    assert await store.refresh()
    assert store.refusal_reason() is None
    assert store.authenticate("Bearer good").tenant == "acme"


async def test_a_start_with_the_database_down_uses_the_saved_snapshot_within_its_bound(tmp_path):
    from db.keys import hash_secret, verify_key
    from gateway.key_snapshot import read_key_snapshot, write_key_snapshot

    path = tmp_path / "keys.json"
    now = {"t": 5000.0}
    saved = {}

    async def loader_up() -> KeySnapshot:
        from db.keys import KeyEntry

        return KeySnapshot(entries={"abc": KeyEntry("abc", "acme", False, hash_secret("s3cret"))}, any_key_exists=True)

    async def save(snapshot: KeySnapshot) -> None:
        write_key_snapshot(path, snapshot)
        saved["n"] = saved.get("n", 0) + 1

    first = KeyStore(loader_up, verify_key, 60, save_snapshot=save, clock=lambda: now["t"])
    await first.start()
    await first.stop()
    assert saved["n"] == 1
    text = path.read_text()
    assert "s3cret" not in text and hash_secret("s3cret") in text  # hashes only
    assert path.stat().st_mode & 0o777 == 0o600

    async def loader_down() -> KeySnapshot:
        raise OSError("database down")

    async def read() -> KeySnapshot | None:
        return read_key_snapshot(path)

    now["t"] += 30
    second = KeyStore(loader_down, verify_key, 60, read_saved_snapshot=read, clock=lambda: now["t"])
    await second.start()
    try:
        assert second.authenticate("Bearer psk-abc-s3cret").tenant == "acme"
        with pytest.raises(Unauthorized):
            second.authenticate("Bearer psk-abc-wrong")
        now["t"] += 31
        with pytest.raises(ServiceUnavailable):
            second.authenticate("Bearer psk-abc-s3cret")
    finally:
        await second.stop()
