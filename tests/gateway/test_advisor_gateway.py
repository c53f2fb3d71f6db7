"""The rule advisor inside the gateway, against the stub upstream: sampled records carry their estimates, a dry run
that cannot be used costs the estimate but never the record, and /health counts the samples."""

from __future__ import annotations

import httpx
from gateway_testkit import gateway_config, running_gateway

from gateway.advisor.candidates import settings_fingerprint
from gateway.config import TenantSettings

STATIC = "You are the assistant of a bicycle shop. Be brief."


def _chat(url: str, system: str) -> None:
    body = {"model": "m", "messages": [{"role": "system", "content": system}, {"role": "user", "content": "Hi"}]}
    assert httpx.post(f"{url}/v1/chat/completions", json=body).status_code == 200


def test_sampled_records_carry_advice_and_are_never_lost(stub, stub_url) -> None:
    config = gateway_config(stub_url, tenant_defaults=TenantSettings(uplift_sample_rate=0.0, advice_sample_rate=1.0))
    with running_gateway(config) as gateway:
        _chat(gateway.url, STATIC)
        _chat(gateway.url, STATIC)
        # A volatile value: hoisting changes the request, and the stub's dry run has no hash chain to measure it by.
        _chat(gateway.url, f"Current time: 2025-06-01T10:00:00Z\n{STATIC}")
        records = gateway.wait_records(3)
        health = httpx.get(f"{gateway.url}/health").json()
    assert len(records) == 3
    unchanged = [record for record in records if record.advice]
    assert len(unchanged) == 2
    for record in unchanged:
        # Nothing volatile: no dry run, and the estimate is what actually hit.
        assert record.prompt_tokens == 10 and record.cached_tokens == stub.state.cached_tokens
        assert [(o.candidate, o.prompt_tokens, o.cached_tokens, o.changed) for o in record.advice] == [
            ("hoist_volatile:after_system", 10, record.cached_tokens, False),
            ("hoist_volatile:end", 10, record.cached_tokens, False),
        ]
    cpu_s = health["rule_advice"].pop("cpu_s")
    assert health["rule_advice"] == {"sampled": 3, "failed": 0, "skipped": 0, "pending": 0}
    assert cpu_s >= 0
    # Each sampled record carries its prompt's keyed signature, for the fleet patterns: equal prompts sign equal.
    signatures = [record.signature for record in records]
    assert all(signature is not None for signature in signatures)
    assert unchanged[0].signature == unchanged[1].signature
    assert STATIC not in str(signatures[0])
    # Every estimate names the settings its request was served under (the tenant defaults here).
    assert {o.settings for record in unchanged for o in record.advice} == {
        settings_fingerprint(config.tenant_defaults)
    }
    assert stub.state.match_requests, "the volatile request was dry-run"
    for payload in stub.state.match_requests:
        assert payload["return_hash_chain"] is True and payload["hash_block_size"] == 1
        assert payload["cache_salt"] and "[volatile#1]" in payload["messages"][0]["content"]


def test_advice_is_off_at_rate_zero(stub, stub_url) -> None:
    with running_gateway(gateway_config(stub_url)) as gateway:
        _chat(gateway.url, STATIC)
        (record,) = gateway.wait_records(1)
        assert httpx.get(f"{gateway.url}/health").json()["rule_advice"]["sampled"] == 0
    assert record.advice == ()
    assert stub.state.match_requests == []
