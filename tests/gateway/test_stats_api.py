"""`GET /api/stats`: scoping by key, parameters, and the shape of the answer."""

from __future__ import annotations

import httpx
import pytest
from gateway_testkit import FakeStorage, gateway_config, running_gateway


@pytest.fixture
def stats_gateway(stub, stub_url):
    storage = FakeStorage()
    keys = {"admin": storage.add_key("a1", "ops", is_admin=True), "acme": storage.add_key("k1", "acme")}
    storage.stats_rows = [{"tenant": "acme", "requests": 3}, {"tenant": "beta", "requests": 5}]
    with running_gateway(gateway_config(stub_url, auth="keys"), storage) as gw:
        yield gw, storage, keys


def get(gw, key, **params):
    return httpx.get(f"{gw.url}/api/stats", params=params, headers={"authorization": f"Bearer {key}"})


def test_admin_sees_every_tenant(stats_gateway):
    gw, storage, keys = stats_gateway
    body = get(gw, keys["admin"], group_by="tenant", bucket="1d").json()
    assert body["tenant"] is None and body["group_by"] == "tenant" and body["bucket"] == "1d"
    assert [row["tenant"] for row in body["data"]] == ["acme", "beta"]
    assert get(gw, keys["admin"], tenant="beta").json()["data"] == [{"tenant": "beta", "requests": 5}]


def test_tenant_key_sees_only_its_own(stats_gateway):
    gw, storage, keys = stats_gateway
    body = get(gw, keys["acme"]).json()
    assert body["tenant"] == "acme"
    assert body["data"] == [{"tenant": "acme", "requests": 3}]
    assert get(gw, keys["acme"], tenant="acme").status_code == 200
    assert get(gw, keys["acme"], tenant="beta").status_code == 403
    assert storage.stats_calls[-1]["tenant"] == "acme"


def test_parameters_are_validated(stats_gateway):
    gw, _, keys = stats_gateway
    assert get(gw, keys["admin"], since="yesterday-ish").status_code == 400
    assert get(gw, keys["admin"], since="1h", until="2h").status_code == 400
    assert get(gw, keys["admin"], group_by="colour").status_code == 400
    assert httpx.get(f"{gw.url}/api/stats").status_code == 401
    ok = get(gw, keys["admin"], since="2025-01-01T00:00:00", until="2025-01-02T00:00:00")
    assert ok.status_code == 200
    assert ok.json()["since"].startswith("2025-01-01T00:00:00")


def test_tiers_per_bucket_and_in_totals_from_a_real_database(stub_url, tmp_path):
    """Over a real database: each bucket splits its cached tokens by tier (unknown where the upstream reported no
    tiers), and `totals` sums the buckets, the load time and the retention classes."""
    from datetime import timedelta

    from db.engine import create_sync_engine_for
    from db.migrate import upgrade
    from db.records import RequestRecord
    from db.store import store_records
    from db.timeutil import floor_hour, utc_now
    from gateway_testkit import db_storage

    hour = floor_hour(utc_now()) - timedelta(hours=3)
    base = {"key_id": None, "endpoint": "chat.completions", "model": "m", "upstream": "local", "stream": False,
            "status_code": 200, "error_type": None, "completion_tokens": 1, "ttft_ms": 10.0, "latency_ms": 20.0}

    def record(name: str, minutes: int, tenant: str, cached: int, tiers=None, load_ms=None, retention=None):
        device, host, disk = tiers or (None, None, None)
        return RequestRecord(request_id=name, created_at=hour + timedelta(minutes=minutes), tenant=tenant,
                             prompt_tokens=1000, cached_tokens=cached, cached_tokens_device=device,
                             cached_tokens_host=host, cached_tokens_disk=disk, cache_load_ms=load_ms,
                             retention_class=retention, **base)

    url = f"sqlite:///{tmp_path}/stats.db"
    upgrade(url)
    engine = create_sync_engine_for(url)
    with engine.begin() as conn:
        store_records(conn, [
            record("a", 5, "acme", 600, (300, 200, 100), 8.0, "1h"),
            record("b", 10, "acme", 50),  # no tiers reported
            record("c", 70, "acme", 400, (0, 0, 400), 30.0, "persistent"),
            record("d", 75, "beta", 20, (20, 0, 0), None, "5m"),
        ])
    engine.dispose()
    window = {"since": (hour - timedelta(hours=1)).isoformat(), "until": (hour + timedelta(hours=3)).isoformat()}
    with running_gateway(gateway_config(stub_url), db_storage(url, tmp_path)) as gw:
        answer = httpx.get(f"{gw.url}/api/stats", params=window)
        acme = httpx.get(f"{gw.url}/api/stats", params={**window, "tenant": "acme", "bucket": "1d"}).json()
    assert answer.status_code == 200
    body = answer.json()
    first, second = body["data"]
    assert first["tiers"] == {"device": 300, "host": 200, "disk": 100, "unknown": 50}
    assert sum(first["tiers"].values()) == first["cached_tokens"] == 650
    assert second["tiers"] == {"device": 20, "host": 0, "disk": 400, "unknown": 0}
    assert (first["cache_load_ms_mean"], second["requests_by_retention"]) == (8.0, {"5m": 1, "persistent": 1})
    totals = body["totals"]
    assert totals["tiers"] == {"device": 320, "host": 200, "disk": 500, "unknown": 50}
    assert (totals["requests"], totals["cached_tokens"]) == (4, 1070)
    assert (totals["cache_load_ms_total"], totals["cache_load_ms_mean"]) == (38.0, 19.0)
    assert totals["requests_by_retention"] == {"5m": 1, "1h": 1, "persistent": 1}
    assert (totals["requests_with_known_tiers"], totals["requests_without_retention"]) == (3, 1)
    assert acme["totals"]["tiers"] == {"device": 300, "host": 200, "disk": 500, "unknown": 50}
