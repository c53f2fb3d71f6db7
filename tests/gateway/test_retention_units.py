"""Retention classes in the configuration and on requests, and reading the engine's per-tier match report."""

from __future__ import annotations

import json

import pytest
import tomllib

from gateway.config import parse_config
from gateway.config.retention import RetentionPolicy, capped
from gateway.errors import BadRequest, ConfigError
from gateway.parsing import CHAT, parse_request
from gateway.retention import requested_retention
from gateway.upstreams import adapter_for
from gateway.upstreams.tiers import (
    MAX_TIER_TOKENS,
    TierSplit,
    load_ms_from_prefix_cache,
    tiers_from_header,
    tiers_from_prefix_cache,
)


def config(text: str):
    return parse_config(tomllib.loads(text))


# --- configuration ----------------------------------------------------------------------------------------------------


def test_absent_settings_send_no_class_and_allow_every_class():
    parsed = config("")
    settings = parsed.tenant_settings("anyone")
    assert (settings.cache_retention, settings.max_cache_retention) == (None, "persistent")
    assert settings.retention.effective(None) is None
    assert settings.retention.effective("persistent") == "persistent"


def test_tenant_tables_inherit_and_override_the_defaults():
    parsed = config(
        """
        [tenant_defaults]
        max_cache_retention = "1h"
        cache_retention = "5m"

        [tenants.acme]
        cache_retention = "1h"

        [tenants.vault]
        max_cache_retention = "persistent"
        cache_retention = "persistent"

        [tenants.plain]
        store_prompt_text = true
        """
    )
    acme, vault, plain = (parsed.tenant_settings(name) for name in ("acme", "vault", "plain"))
    assert (acme.cache_retention, acme.max_cache_retention) == ("1h", "1h")
    assert (vault.cache_retention, vault.max_cache_retention) == ("persistent", "persistent")
    assert (plain.cache_retention, plain.max_cache_retention) == ("5m", "1h")
    assert parsed.tenant_settings("unlisted").retention == RetentionPolicy("5m", "1h")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[tenant_defaults]\ncache_retention = "forever"', r"\[tenant_defaults\] cache_retention must be one of"),
        ('[tenants.acme]\nmax_cache_retention = "24h"', r"\[tenants.acme\] max_cache_retention must be one of"),
        ("[tenants.acme]\ncache_retention = 5", "cache_retention must be one of"),
        (
            '[tenants.acme]\ncache_retention = "persistent"\nmax_cache_retention = "1h"',
            r"\[tenants.acme\] cache_retention = 'persistent' is longer than max_cache_retention = '1h'",
        ),
        # The default comes from [tenant_defaults], the lower maximum from the tenant's own table.
        (
            '[tenant_defaults]\ncache_retention = "1h"\n[tenants.acme]\nmax_cache_retention = "5m"',
            r"\[tenants.acme\] cache_retention = '1h' is longer than max_cache_retention = '5m'",
        ),
    ],
)
def test_config_refuses_unknown_classes_and_a_default_above_the_maximum(text, message):
    with pytest.raises(ConfigError, match=message):
        config(text)


# --- the class a request gets -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "requested", "effective"),
    [
        (RetentionPolicy(None, "1h"), "persistent", "1h"),  # more than allowed: lowered
        (RetentionPolicy(None, "1h"), "1h", "1h"),
        (RetentionPolicy(None, "1h"), "5m", "5m"),  # less is always fine
        (RetentionPolicy("1h", "persistent"), "5m", "5m"),  # an explicit ask wins over the default
        (RetentionPolicy("1h", "persistent"), None, "1h"),  # no ask: the default
        (RetentionPolicy(None, "5m"), None, None),  # no ask, no default: nothing sent
        (RetentionPolicy(None, "persistent"), "persistent", "persistent"),
    ],
)
def test_effective_class_is_the_ask_or_default_lowered_to_the_maximum(policy, requested, effective):
    assert policy.effective(requested) == effective


def test_capped_orders_classes_shortest_first():
    assert [capped(c, "1h") for c in ("5m", "1h", "persistent", None)] == ["5m", "1h", "1h", None]
    assert [capped(c, "5m") for c in ("5m", "1h", "persistent")] == ["5m", "5m", "5m"]


@pytest.mark.parametrize("value", ["forever", "", "1H", "24h", 5, True, ["1h"], {"ttl": "1h"}, "x" * 500])
def test_an_unknown_requested_class_is_a_400_naming_the_field(value):
    with pytest.raises(BadRequest) as caught:
        requested_retention({"cache_retention": value})
    assert caught.value.param == "cache_retention"
    assert len(caught.value.message) < 200


def test_parse_request_reads_the_class_and_null_means_absent():
    messages = [{"role": "user", "content": "hi"}]
    assert parse_request(CHAT, json.dumps({"model": "m", "messages": messages}).encode()).cache_retention is None
    for value, expected in (("1h", "1h"), (None, None)):
        raw = json.dumps({"model": "m", "messages": messages, "cache_retention": value}).encode()
        assert parse_request(CHAT, raw).cache_retention == expected


# --- adapters ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["openai", "vllm", "sglang", "anthropic"])
def test_only_the_local_engine_is_sent_a_class(kind):
    body = {"model": "m", "cache_retention": "persistent"}
    adapter_for(kind).apply_retention(body, "1h")
    assert "cache_retention" not in body and "prompt_cache_retention" not in body
    local = {"model": "m", "cache_retention": "persistent"}
    adapter_for("local_engine").apply_retention(local, "1h")
    assert local["cache_retention"] == "1h"
    adapter_for("local_engine").apply_retention(local, None)
    assert "cache_retention" not in local


def test_local_engine_reads_tiers_from_body_and_header():
    adapter = adapter_for("local_engine")
    payload = {
        "usage": {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 60}},
        "prefix_cache": {"matched_tokens": 60, "tiers": {"device": 10, "host": 20, "disk": 30}, "load_ms": 4.5},
    }
    usage = adapter.usage(payload)
    assert (usage.cached_tokens, usage.tiers, usage.cache_load_ms) == (60, TierSplit(10, 20, 30), 4.5)
    report = adapter.cache_report({"x-prefix-cache-tiers": "device=1,host=2,disk=3"})
    assert report.tiers == TierSplit(1, 2, 3)
    assert adapter.cache_report({}).tiers is None
    assert "x-prefix-cache-tiers" in adapter.passthrough_headers


def test_other_kinds_report_no_tiers():
    payload = {"usage": {"prompt_tokens": 5}, "prefix_cache": {"tiers": {"device": 1, "host": 0, "disk": 0}}}
    for kind in ("openai", "vllm", "sglang"):
        assert adapter_for(kind).usage(payload).tiers is None
        assert adapter_for(kind).cache_report({"x-prefix-cache-tiers": "device=1,host=0,disk=0"}).tiers is None


# --- garbled tier reports read as "not reported" ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "tiers",
    [
        None,
        "device=1,host=2,disk=3",
        [1, 2, 3],
        {"device": 1, "host": 2},
        {"device": -1, "host": 2, "disk": 3},
        {"device": 1.5, "host": 2, "disk": 3},
        {"device": True, "host": 2, "disk": 3},
        {"device": "1", "host": 2, "disk": 3},
        {"device": None, "host": 2, "disk": 3},
        {"device": MAX_TIER_TOKENS + 1, "host": 0, "disk": 0},
    ],
)
def test_garbled_body_tiers_are_none(tiers):
    assert tiers_from_prefix_cache({"tiers": tiers}) is None


def test_body_tiers_accept_integral_floats_and_ignore_extra_tiers():
    split = tiers_from_prefix_cache({"tiers": {"device": 3.0, "host": 0, "disk": 2, "nvme": 9}})
    assert split == TierSplit(3, 0, 2)


@pytest.mark.parametrize("value", [None, "x", -1, True, [], float("inf"), float("nan")])
def test_garbled_load_ms_is_none(value):
    assert load_ms_from_prefix_cache({"load_ms": value}) is None


def test_load_ms_reads_numbers():
    assert load_ms_from_prefix_cache({"load_ms": 0}) == 0.0
    assert load_ms_from_prefix_cache({"load_ms": 12.25}) == 12.25
    assert load_ms_from_prefix_cache("nope") is None


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        "device=1,host=2",
        "device=1,host=2,disk=x",
        "device=1,host=2,disk=-3",
        "device=1,host=2,disk=3,",
        "device=1,device=2,host=2,disk=3",
        "device=1,host=2,disk=99999999999",
        "device=１,host=2,disk=3",  # a full-width digit
        "device=1,host=2,disk=3" + ",x=1" * 100,
    ],
)
def test_garbled_tiers_headers_are_none(value):
    assert tiers_from_header(value) is None


def test_tiers_header_reads_the_engines_format():
    assert tiers_from_header("device=7,host=0,disk=12") == TierSplit(7, 0, 12)
    assert tiers_from_header(" disk=1 , host=2 , device=3 ") == TierSplit(3, 2, 1)
