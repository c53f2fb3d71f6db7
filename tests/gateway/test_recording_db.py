"""Recording into a real database: one row per request, the stats API over it, and database outages.

SQLite runs everywhere. The PostgreSQL test needs the server on 127.0.0.1:5432; it is skipped without one, except
under CI (CI=true), where it fails.
"""

from __future__ import annotations

import sqlite3

import httpx
import pytest
from gateway_testkit import TcpProxy, db_storage, gateway_config, running_gateway, wait_until
from sqlalchemy import create_engine, text

CHAT = {"model": "m", "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]}


def stored_rows(url: str) -> list[dict]:
    engine = create_engine(url.replace("+aiosqlite", "").replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(text("SELECT * FROM requests ORDER BY created_at"))]
    finally:
        engine.dispose()


def send_mixed_traffic(url: str) -> list[str]:
    """Successes, a stream, an upstream error and a bad request; returns the request ids the gateway gave."""
    responses = [
        httpx.post(f"{url}/v1/chat/completions", json=CHAT),
        httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "stream": True}),
        httpx.post(f"{url}/v1/completions", json={"model": "m", "prompt": "p"}),
        httpx.post(f"{url}/v1/chat/completions", json={**CHAT, "model": "err-400"}),
        httpx.post(f"{url}/v1/chat/completions", content=b"{broken"),
    ]
    # Whatever the database is doing, the answers are the upstream's (and the gateway's own 400).
    assert [r.status_code for r in responses] == [200, 200, 200, 400, 400]
    return [r.headers["x-request-id"] for r in responses]


def test_every_request_becomes_exactly_one_row(stub, stub_url, tmp_path):
    url = f"sqlite:///{tmp_path}/gateway.db"
    storage = db_storage(url, tmp_path)
    with running_gateway(gateway_config(stub_url), storage) as gw:
        ids = send_mixed_traffic(gw.url)
        assert wait_until(lambda: storage.sink.counters().written == len(ids))
        stats = httpx.get(f"{gw.url}/api/stats", params={"group_by": "tenant"}).json()
    rows = stored_rows(url)
    assert sorted(r["id"] for r in rows) == sorted(ids)
    by_id = {r["id"]: r for r in rows}
    first, streamed, completion, upstream_error, bad = (by_id[i] for i in ids)
    assert (first["status_code"], first["cached_tokens"], first["miss_kind"], first["tenant"]) == (
        200,
        4,
        "partial",
        "default",
    )
    assert streamed["stream"] and streamed["ttft_ms"] is not None and streamed["prompt_tokens"] == 10
    assert completion["endpoint"] == "completions"
    assert (upstream_error["status_code"], upstream_error["error_type"]) == (400, "invalid_request_error")
    assert (bad["status_code"], bad["cached_tokens"], bad["model"]) == (400, None, "")
    (row,) = stats["data"]
    assert row["group"] == "default" and row["requests"] == len(ids)
    assert row["cached_tokens"] == 12


def test_sqlite_outage_spills_and_replays_everything(stub, stub_url, tmp_path):
    """The `requests` table disappears mid-run (renamed away) and comes back: nothing is lost."""
    path = tmp_path / "gateway.db"
    url = f"sqlite:///{path}"
    storage = db_storage(url, tmp_path)
    ids: list[str] = []
    with running_gateway(gateway_config(stub_url), storage) as gw:
        ids += send_mixed_traffic(gw.url)
        assert wait_until(lambda: storage.sink.counters().written == len(ids))
        with sqlite3.connect(path, timeout=30) as conn:
            conn.execute("ALTER TABLE requests RENAME TO requests_away")
        for _ in range(3):
            ids += send_mixed_traffic(gw.url)
        assert wait_until(lambda: storage.sink.counters().spilled > 0)
        assert httpx.get(f"{gw.url}/health").json()["records"]["spilled"] > 0
        with sqlite3.connect(path, timeout=30) as conn:
            conn.execute("ALTER TABLE requests_away RENAME TO requests")
        assert wait_until(lambda: storage.sink.counters().pending_spill == 0 and storage.sink.counters().replayed > 0)
        ids += send_mixed_traffic(gw.url)
        assert wait_until(lambda: storage.sink.counters().queued == 0)
        counters = storage.sink.counters()
        metrics = httpx.get(f"{gw.url}/metrics").text
    assert counters.dropped == 0 and counters.spilled == counters.replayed
    assert "prefixscope_gateway_records_replayed_total" in metrics
    assert sorted(r["id"] for r in stored_rows(url)) == sorted(ids)


@pytest.mark.postgres
def test_postgres_outage_spills_and_replays_everything(stub, stub_url, tmp_path, postgres_database):
    """The gateway reaches PostgreSQL through a proxy; pulling the proxy's plug is a database outage."""
    proxy = TcpProxy("127.0.0.1", 5432)
    proxy.start()
    url = f"postgresql://root@127.0.0.1:{proxy.port}/{postgres_database}"
    storage = db_storage(url, tmp_path)
    ids: list[str] = []
    try:
        with running_gateway(gateway_config(stub_url), storage) as gw:
            ids += send_mixed_traffic(gw.url)
            assert wait_until(lambda: storage.sink.counters().written == len(ids))
            proxy.stop()
            for _ in range(3):
                ids += send_mixed_traffic(gw.url)
            assert wait_until(lambda: storage.sink.counters().spilled > 0)
            proxy.start()
            assert wait_until(
                lambda: storage.sink.counters().pending_spill == 0 and storage.sink.counters().replayed > 0
            )
            assert wait_until(lambda: storage.sink.counters().queued == 0)
            counters = storage.sink.counters()
    finally:
        proxy.close()
    assert counters.dropped == 0 and counters.spilled == counters.replayed
    direct = f"postgresql://root@127.0.0.1:5432/{postgres_database}"
    assert sorted(r["id"] for r in stored_rows(direct)) == sorted(ids)


def test_keys_from_the_database_and_revocation(stub, stub_url, tmp_path):
    from db.keys import create_api_key, revoke_api_key
    from db.migrate import upgrade

    url = f"sqlite:///{tmp_path}/gateway.db"
    upgrade(url)
    sync_engine = create_engine(url)
    acme = create_api_key(sync_engine, "acme")
    admin = create_api_key(sync_engine, "ops", is_admin=True)
    storage = db_storage(url, tmp_path)
    with running_gateway(gateway_config(stub_url, auth="keys"), storage) as gw:

        def status(key: str | None) -> int:
            headers = {"authorization": f"Bearer {key}"} if key else {}
            return httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers=headers).status_code

        assert status(None) == 401
        assert status(acme.plaintext_key) == 200
        assert status(acme.plaintext_key + "x") == 401
        assert (
            httpx.get(f"{gw.url}/api/stats", headers={"authorization": f"Bearer {admin.plaintext_key}"}).status_code
            == 200
        )
        tenant_view = httpx.get(
            f"{gw.url}/api/stats", params={"tenant": "ops"}, headers={"authorization": f"Bearer {acme.plaintext_key}"}
        )
        assert tenant_view.status_code == 403
        revoke_api_key(sync_engine, acme.key_id)
        assert wait_until(lambda: status(acme.plaintext_key) == 401)
        assert wait_until(lambda: storage.sink.counters().queued == 0)
    sync_engine.dispose()
    rows = stored_rows(url)
    assert {(r["tenant"], r["key_id"], r["status_code"]) for r in rows} >= {
        ("unauthenticated", None, 401),
        ("acme", acme.key_id, 200),
    }
