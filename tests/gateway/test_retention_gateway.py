"""Retention classes and per-tier cache reports through the gateway, in front of the stub upstream (shaped like the
local engine: `prefix_cache.tiers`, `prefix_cache.load_ms`, `x-prefix-cache-tiers`).

The class a tenant's request gets is the client's `cache_retention` (or the tenant's default) lowered to the tenant's
maximum; it is sent to the local engine only, named in `x-prefixscope-cache-retention` and recorded. The per-tier split
is recorded from the body or the usage chunk, else from the header, and as NULL when the upstream reports none or
reports garbage.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace

import anthropic
import httpx
import openai
import pytest
from anthropic_stub import AnthropicStub
from gateway_testkit import FakeStorage, db_storage, gateway_config, running_gateway, serve_in_thread, wait_until
from test_recording_db import stored_rows

from gateway.config import TenantSettings, UpstreamConfig, parse_config

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello"}]
CHAT = {"model": "m", "messages": MESSAGES}
TIERS = {"device": 1, "host": 2, "disk": 1}  # the stub reports 4 cached tokens
TENANTS_TOML = """
[tenant_defaults]
uplift_sample_rate = 0.0
advice_sample_rate = 0.0

[tenants.acme]
max_cache_retention = "1h"

[tenants.steady]
cache_retention = "1h"
max_cache_retention = "persistent"
"""


def quiet(**retention: str) -> TenantSettings:
    """Tenant settings without sampled background checks, with the given retention settings."""
    return TenantSettings(uplift_sample_rate=0.0, advice_sample_rate=0.0, **retention)


@pytest.fixture
def keyed_gateway(stub, stub_url):
    """Tenants `acme` (max 1h, no default) and `steady` (default 1h, max persistent), from the TOML above."""
    parsed = parse_config(tomllib.loads(TENANTS_TOML))
    storage = FakeStorage()
    keys = {tenant: storage.add_key(f"k-{tenant}", tenant) for tenant in ("acme", "steady", "other")}
    config = gateway_config(stub_url, auth="keys", tenants=parsed.tenants, tenant_defaults=parsed.tenant_defaults)
    with running_gateway(config, storage) as gw:
        yield gw, keys


def post(gw, path: str, body: dict, key: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{gw.url}{path}", json=body, headers=headers, timeout=30)


# --- the class sent and recorded --------------------------------------------------------------------------------------


def test_openai_sdk_asking_for_more_than_the_maximum_gets_the_maximum(keyed_gateway, stub):
    gw, keys = keyed_gateway
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=keys["acme"], max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, extra_body={"cache_retention": "persistent"}
    )
    assert raw.parse().choices[0].message.content == "ok"
    assert raw.headers["x-prefixscope-cache-retention"] == "1h"
    assert stub.state.requests[-1]["cache_retention"] == "1h"
    (record,) = gw.wait_records(1)
    assert (record.tenant, record.status_code, record.retention_class) == ("acme", 200, "1h")


def test_asking_for_less_is_kept_and_the_default_fills_in(keyed_gateway, stub):
    gw, keys = keyed_gateway
    sent = []
    for key, ask in ((keys["acme"], "5m"), (keys["acme"], None), (keys["steady"], None), (keys["steady"], "5m"),
                     (keys["steady"], "persistent"), (keys["other"], "persistent")):
        body = CHAT if ask is None else {**CHAT, "cache_retention": ask}
        response = post(gw, "/v1/chat/completions", body, key)
        assert response.status_code == 200
        applied = response.headers.get("x-prefixscope-cache-retention")
        sent.append((stub.state.requests[-1].get("cache_retention"), applied))
    expected = ["5m", None, "1h", "5m", "persistent", "persistent"]
    assert sent == [(value, value) for value in expected]
    records = gw.wait_records(len(expected))
    assert [r.retention_class for r in records] == expected


def test_streams_and_completions_are_lowered_too(keyed_gateway, stub):
    gw, keys = keyed_gateway
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=keys["acme"], max_retries=0)
    with client.chat.completions.with_streaming_response.create(
        model="m", messages=MESSAGES, stream=True, extra_body={"cache_retention": "persistent"}
    ) as streamed:
        assert streamed.headers["x-prefixscope-cache-retention"] == "1h"
        chunks = list(streamed.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello world"
    assert stub.state.requests[-1]["cache_retention"] == "1h"
    completion = client.completions.create(model="m", prompt="Once", extra_body={"cache_retention": "persistent"})
    assert completion.choices[0].text == "ok"
    assert (stub.state.paths[-1], stub.state.requests[-1]["cache_retention"]) == ("/v1/completions", "1h")
    records = gw.wait_records(2)
    assert [(r.endpoint, r.stream, r.retention_class) for r in records] == [
        ("chat.completions", True, "1h"),
        ("completions", False, "1h"),
    ]


def test_no_retention_settings_send_nothing(gateway, stub):
    response = post(gateway, "/v1/chat/completions", CHAT)
    assert response.status_code == 200 and "x-prefixscope-cache-retention" not in response.headers
    assert "cache_retention" not in stub.state.requests[-1]
    (record,) = gateway.wait_records(1)
    assert record.retention_class is None


@pytest.mark.parametrize("value", ["forever", "", 3600, True, {"ttl": "1h"}])
def test_an_unknown_class_is_an_openai_shaped_400(gateway, stub, value):
    response = post(gateway, "/v1/chat/completions", {**CHAT, "cache_retention": value})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "cache_retention")
    assert "5m" in error["message"] and "persistent" in error["message"]
    assert stub.state.requests == []
    with pytest.raises(openai.BadRequestError) as caught:
        openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="x", max_retries=0).chat.completions.create(
            model="m", messages=MESSAGES, extra_body={"cache_retention": value}
        )
    assert caught.value.body["param"] == "cache_retention"
    records = gateway.wait_records(2)
    assert [(r.status_code, r.retention_class) for r in records] == [(400, None), (400, None)]


@pytest.mark.parametrize("kind", ["vllm", "sglang", "openai"])
def test_upstreams_without_the_field_never_receive_it(stub, stub_url, kind):
    upstream = UpstreamConfig(name="other", url=stub_url, kind=kind, timeout_s=30)
    config = gateway_config(
        stub_url, upstreams=(upstream,), default_upstream="other", tenant_defaults=quiet(cache_retention="1h")
    )
    with running_gateway(config) as gw:
        plain = post(gw, "/v1/chat/completions", {**CHAT, "cache_retention": "persistent"})
        streamed = post(gw, "/v1/chat/completions", {**CHAT, "stream": True, "cache_retention": "5m"})
        records = gw.wait_records(2)
    assert plain.status_code == streamed.status_code == 200
    assert "x-prefixscope-cache-retention" not in plain.headers
    for sent in stub.state.requests:
        assert "cache_retention" not in sent and "prompt_cache_retention" not in sent
    assert [r.retention_class for r in records] == [None, None]
    # Nor do they report tiers, whatever the stub puts in its body.
    assert [r.cached_tokens_device for r in records] == [None, None]


# --- the per-tier report ----------------------------------------------------------------------------------------------


def test_tiers_from_the_body_plain_and_streamed(gateway, stub):
    stub.state.tiers, stub.state.load_ms = TIERS, 2.5
    plain = post(gateway, "/v1/chat/completions", CHAT)
    assert plain.json()["prefix_cache"]["tiers"] == TIERS
    # The client did not ask for usage: the usage chunk (with the tiers) is consumed by the gateway, yet recorded.
    silent = post(gateway, "/v1/chat/completions", {**CHAT, "stream": True})
    assert '"tiers"' not in silent.text
    asked = post(gateway, "/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    usage_chunk = json.loads(asked.text.split("data: ")[-2])
    assert usage_chunk["prefix_cache"]["tiers"] == TIERS
    records = gateway.wait_records(3)
    assert [
        (r.stream, r.cached_tokens, r.cached_tokens_device, r.cached_tokens_host, r.cached_tokens_disk, r.cache_load_ms)
        for r in records
    ] == [(False, 4, 1, 2, 1, 2.5), (True, 4, 1, 2, 1, 2.5), (True, 4, 1, 2, 1, 2.5)]


def test_tiers_from_the_header_when_the_body_has_none(gateway, stub):
    stub.state.tiers_header = "device=0,host=3,disk=1"
    plain = post(gateway, "/v1/chat/completions", CHAT)
    streamed = post(gateway, "/v1/chat/completions", {**CHAT, "stream": True})
    assert plain.headers["x-prefix-cache-tiers"] == streamed.headers["x-prefix-cache-tiers"] == "device=0,host=3,disk=1"
    records = gateway.wait_records(2)
    assert [(r.cached_tokens_device, r.cached_tokens_host, r.cached_tokens_disk, r.cache_load_ms) for r in records] == [
        (0, 3, 1, None),
        (0, 3, 1, None),
    ]


def test_the_body_wins_over_the_header(gateway, stub):
    stub.state.tiers, stub.state.tiers_header = TIERS, "device=4,host=0,disk=0"
    assert post(gateway, "/v1/chat/completions", CHAT).status_code == 200
    (record,) = gateway.wait_records(1)
    assert (record.cached_tokens_device, record.cached_tokens_host, record.cached_tokens_disk) == (1, 2, 1)


def test_no_tier_report_records_null(gateway, stub):
    post(gateway, "/v1/chat/completions", CHAT)
    post(gateway, "/v1/chat/completions", {**CHAT, "stream": True})
    for record in gateway.wait_records(2):
        assert (record.cached_tokens_device, record.cached_tokens_host, record.cached_tokens_disk) == (None,) * 3
        assert record.cache_load_ms is None and record.cached_tokens == 4


@pytest.mark.parametrize(
    ("tiers", "load_ms", "header"),
    [
        ({"device": -1, "host": 2, "disk": 1}, "slow", "device=1,host=2"),
        ({"device": "1", "host": 2, "disk": 1}, -4, "device=x,host=y,disk=z"),
        ([1, 2, 1], {"ms": 1}, "device=1,host=2,disk=1" + ",extra=1" * 40),
        ("device=1,host=2,disk=1", True, "device=99999999999,host=0,disk=0"),
        ({"device": 2**40, "host": 0, "disk": 0}, None, ""),
    ],
)
def test_garbled_tier_reports_record_null_and_never_fail_the_request(gateway, stub, tiers, load_ms, header):
    stub.state.tiers, stub.state.load_ms, stub.state.tiers_header = tiers, load_ms, header
    plain = post(gateway, "/v1/chat/completions", CHAT)
    with_usage = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    streamed = post(gateway, "/v1/chat/completions", with_usage)
    assert plain.status_code == streamed.status_code == 200
    assert plain.json()["choices"][0]["message"]["content"] == "ok"
    assert streamed.text.rstrip().endswith("data: [DONE]")
    for record in gateway.wait_records(2):
        assert (record.status_code, record.cached_tokens) == (200, 4)
        assert (record.cached_tokens_device, record.cached_tokens_host, record.cached_tokens_disk) == (None,) * 3
        assert record.cache_load_ms is None


# --- the database -----------------------------------------------------------------------------------------------------


def _database_url(backend: str, tmp_path, request) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/gateway.db"
    return f"postgresql://root@127.0.0.1:5432/{request.getfixturevalue('postgres_database')}"


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_retention_and_tiers_are_stored(stub, stub_url, tmp_path, request, backend):
    url = _database_url(backend, tmp_path, request)
    storage = db_storage(url, tmp_path)
    config = gateway_config(stub_url, tenant_defaults=quiet(max_cache_retention="1h"))
    stub.state.tiers, stub.state.load_ms, stub.state.tiers_header = TIERS, 0.75, "device=1,host=2,disk=1"
    with running_gateway(config, storage) as gw:
        ids = [
            post(gw, "/v1/chat/completions", {**CHAT, "cache_retention": "persistent"}).headers["x-request-id"],
            post(gw, "/v1/chat/completions", {**CHAT, "stream": True, "cache_retention": "5m"}).headers["x-request-id"],
        ]
        stub.state.tiers, stub.state.load_ms = None, None  # the header alone
        ids.append(post(gw, "/v1/chat/completions", CHAT).headers["x-request-id"])
        stub.state.tiers_header = None  # no report at all
        ids.append(post(gw, "/v1/completions", {"model": "m", "prompt": "p"}).headers["x-request-id"])
        assert wait_until(lambda: storage.sink.counters().written == len(ids))
    rows = {row["id"]: row for row in stored_rows(url)}
    got = [
        tuple(rows[i][c] for c in ("retention_class", "cached_tokens_device", "cached_tokens_host",
                                    "cached_tokens_disk", "cache_load_ms"))
        for i in ids
    ]
    assert got == [
        ("1h", 1, 2, 1, 0.75),
        ("5m", 1, 2, 1, 0.75),
        (None, 1, 2, 1, None),
        (None, None, None, None, None),
    ]


# --- the Messages API -------------------------------------------------------------------------------------------------


def _messages_client(gw) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0, timeout=30)


def test_messages_breakpoint_class_goes_to_the_engine_lowered_to_the_maximum(stub, stub_url):
    config = gateway_config(stub_url, tenant_defaults=quiet(max_cache_retention="5m"))
    stub.state.tiers, stub.state.load_ms = TIERS, 1.0
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    with running_gateway(config) as gw:
        client = _messages_client(gw)
        plain = client.messages.with_raw_response.create(
            model="m", max_tokens=8, system=system, messages=[{"role": "user", "content": "Hi"}]
        )
        sent_plain = stub.state.requests[-1]
        with client.messages.stream(
            model="m", max_tokens=8, system=system, messages=[{"role": "user", "content": "Hi"}]
        ) as streamed:
            text = "".join(streamed.text_stream)
        records = gw.wait_records(2)
    assert plain.headers["x-prefixscope-cache-retention"] == "5m"
    assert sent_plain["cache_retention"] == stub.state.requests[-1]["cache_retention"] == "5m"
    assert text == "Hello world"
    assert [(r.endpoint, r.stream, r.retention_class) for r in records] == [
        ("messages", False, "5m"),
        ("messages", True, "5m"),
    ]
    # The tier split is the engine's report of its match (4 cached tokens), kept beside Anthropic's usage split.
    for record in records:
        assert (record.cached_tokens_device, record.cached_tokens_host, record.cached_tokens_disk) == (1, 2, 1)
        assert record.cache_load_ms == 1.0


def test_messages_without_breakpoints_get_the_tenant_default(stub, stub_url):
    config = gateway_config(stub_url, tenant_defaults=quiet(cache_retention="1h"))
    with running_gateway(config) as gw:
        _messages_client(gw).messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
        (record,) = gw.wait_records(1)
    assert stub.state.requests[-1]["cache_retention"] == "1h"
    assert record.retention_class == "1h"


def test_messages_passthrough_keeps_anthropics_own_ttl(tmp_path):
    anthropic_stub = AnthropicStub()
    with serve_in_thread(anthropic_stub) as url:
        upstream = UpstreamConfig(name="claude", url=url, kind="anthropic", api_key="sk-upstream", timeout_s=30)
        config = gateway_config(
            url, upstreams=(upstream,), default_upstream="claude", tenant_defaults=quiet(max_cache_retention="5m")
        )
        with running_gateway(config) as gw:
            system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
            _messages_client(gw).messages.create(
                model="claude-x", max_tokens=8, system=system, messages=[{"role": "user", "content": "Hi"}]
            )
            (record,) = gw.wait_records(1)
    sent = anthropic_stub.state.requests[-1]
    assert "cache_retention" not in sent
    assert sent["system"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert (record.retention_class, record.cached_tokens_device) == ("1h", None)


def test_open_mode_default_tenant_settings_apply(stub, stub_url):
    """Open mode serves everyone as tenant `default`, under [tenant_defaults]."""
    config = replace(gateway_config(stub_url), tenant_defaults=quiet(cache_retention="5m", max_cache_retention="1h"))
    with running_gateway(config) as gw:
        assert post(gw, "/v1/chat/completions", CHAT).headers["x-prefixscope-cache-retention"] == "5m"
        assert post(gw, "/v1/chat/completions", {**CHAT, "cache_retention": "persistent"}).headers[
            "x-prefixscope-cache-retention"
        ] == "1h"
    assert [r.get("cache_retention") for r in stub.state.requests] == ["5m", "1h"]
