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
