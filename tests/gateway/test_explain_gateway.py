"""Miss explanations, hash chains and normalization uplift through the gateway, against the stub upstream."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import httpx
from gateway_testkit import TEST_SECRET, gateway_config, running_gateway
from stub_upstream import STUB_HASH_IDS

from db.chains import RequestChain
from db.records import RequestRecord
from gateway.config import TenantSettings, UpstreamConfig
from gateway.explain.uplift import UpliftChecker, UpliftJob
from gateway.record_keys import RecordHasher
from gateway.tenancy import derive_salt

SYSTEM = {"role": "system", "content": "You answer questions about bicycles."}
CHAT = {"model": "m", "messages": [SYSTEM, {"role": "user", "content": "hi"}]}
UNSORTED_TOOLS = [{"type": "function", "function": {"parameters": {"type": "object"}, "name": "lookup"}}]


def post(gw, body, path="/v1/chat/completions"):
    return httpx.post(f"{gw.url}{path}", json=body)


def test_answered_requests_are_explained_and_failed_ones_are_not(stub, stub_url):
    with running_gateway(gateway_config(stub_url)) as gw:
        post(gw, CHAT)
        grown = {
            **CHAT,
            "messages": [
                *CHAT["messages"],
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "more"},
            ],
        }
        post(gw, grown)
        post(gw, {**CHAT, "model": "err-400"})
        post(gw, {"model": "m", "prompt": "Once upon a time"}, "/v1/completions")
        first, second, failed, completion = gw.wait_records(4)
        metrics = httpx.get(f"{gw.url}/metrics").text
    # The stub reports a partial match of 4 of 10 tokens.
    assert (first.miss_reason, first.recomputed_tokens, first.divergence_segment) == ("new_prefix", 6, None)
    assert (second.miss_reason, second.recomputed_tokens) == ("hit", 0)  # the conversation grew: the ideal case
    assert (failed.miss_reason, failed.chain, failed.recomputed_tokens) == (None, None, None)
    assert completion.miss_reason == "new_prefix"  # no earlier completions prompt: nothing similar seen
    assert 'prefixscope_gateway_miss_reasons_total{reason="new_prefix"} 2.0' in metrics
    assert 'prefixscope_gateway_recomputed_tokens_total{reason="new_prefix"} 12.0' in metrics


def test_engine_chains_are_recorded_and_hidden_from_clients_that_did_not_ask(stub, stub_url):
    with running_gateway(gateway_config(stub_url)) as gw:
        plain = post(gw, CHAT).json()
        with_usage = post(gw, {**CHAT, "stream": True, "stream_options": {"include_usage": True}}).text
        without_usage = post(gw, {**CHAT, "stream": True}).text
        records = gw.wait_records(3)
    sent = stub.state.requests
    assert all(r["return_hash_chain"] is True and r["hash_block_size"] == 16 for r in sent)
    assert plain["prefix_cache"] == {"matched_tokens": 4, "prompt_tokens": 10, "miss": "partial"}
    assert "hash_chain" not in with_usage and '"prefix_cache"' in with_usage and '"usage"' in with_usage
    assert "hash_chain" not in without_usage and '"prefix_cache"' not in without_usage  # the usage chunk is dropped
    # Recorded keyed (gateway.record_keys): the engine's hashes never reach the database as they are.
    keyed = RecordHasher(TEST_SECRET).chain("default", RequestChain(16, 10, tuple(STUB_HASH_IDS)))
    assert keyed is not None and set(keyed.hash_ids).isdisjoint(STUB_HASH_IDS)
    assert all(r.chain == keyed and r.hash_key_version == 1 for r in records)


def test_a_client_that_asks_for_the_chain_gets_it_with_its_block_size(stub, stub_url):
    with running_gateway(gateway_config(stub_url)) as gw:
        body = post(gw, {**CHAT, "return_hash_chain": True, "hash_block_size": 32}).json()
        streamed = post(
            gw, {**CHAT, "return_hash_chain": True, "stream": True, "stream_options": {"include_usage": True}}
        )
        records = gw.wait_records(2)
    assert stub.state.requests[0]["hash_block_size"] == 32
    assert body["prefix_cache"]["hash_chain"]["hash_ids"] == STUB_HASH_IDS
    assert '"hash_chain"' in streamed.text
    assert [r.chain.block_size for r in records] == [32, 16]


def test_other_upstreams_get_an_approximate_chain_and_no_chain_request(stub, stub_url):
    config = replace(gateway_config(stub_url), upstreams=(UpstreamConfig(name="stub", url=stub_url, kind="openai"),))
    with running_gateway(config) as gw:
        post(gw, CHAT)
        (record,) = gw.wait_records(1)
    assert "return_hash_chain" not in stub.state.requests[0]
    assert record.chain is not None and record.chain.approximate and record.chain.input_length == 10
    assert record.miss_reason == "new_prefix"  # no miss kind: the structure alone says it is new


def test_chains_can_be_switched_off_per_tenant(stub, stub_url):
    config = gateway_config(stub_url, tenant_defaults=TenantSettings(hash_chain=False, uplift_sample_rate=0.0))
    with running_gateway(config) as gw:
        post(gw, CHAT)
        (record,) = gw.wait_records(1)
    assert "return_hash_chain" not in stub.state.requests[0] and record.chain is None


def test_uplift_dry_runs_the_request_as_sent_under_the_tenant_salt(stub, stub_url):
    stub.state.match_matched_tokens = 1
    config = gateway_config(stub_url, tenant_defaults=TenantSettings(uplift_sample_rate=1.0))
    with running_gateway(config) as gw:
        post(gw, {**CHAT, "tools": UNSORTED_TOOLS, "cache_salt": "the client's own"})
        post(gw, CHAT)  # nothing to normalize: a known gain of 0, no dry run
        changed, unchanged = sorted(gw.wait_records(2), key=lambda r: r.applied_rules == ())
    (match,) = stub.state.match_requests
    assert match == {
        "model": "m",
        "messages": CHAT["messages"],
        "tools": UNSORTED_TOOLS,  # the client's key order, not the normalized one
        "cache_salt": derive_salt(TEST_SECRET, "default"),
    }
    assert changed.applied_rules == ("tool_schema_key_order",)
    assert changed.normalization_gain_tokens == 4 - 1  # normalized matched 4, the raw request would match 1
    assert unchanged.normalization_gain_tokens == 0


def test_uplift_is_not_measured_where_the_upstream_has_no_dry_run(stub, stub_url):
    config = replace(
        gateway_config(stub_url, tenant_defaults=TenantSettings(uplift_sample_rate=1.0)),
        upstreams=(UpstreamConfig(name="stub", url=stub_url, kind="vllm"),),
    )
    with running_gateway(config) as gw:
        post(gw, {**CHAT, "tools": UNSORTED_TOOLS})
        (record,) = gw.wait_records(1)
    assert record.normalization_gain_tokens is None and stub.state.match_requests == []


def record(request_id: str = "r") -> RequestRecord:
    from datetime import UTC, datetime

    return RequestRecord(
        request_id, datetime.now(UTC), "t", None, "chat.completions", "m", "u", False, 200, None, 10, 4, 1, 1.0, 2.0
    )


def job(url: str = "http://127.0.0.1:9/v1/cache/match") -> UpliftJob:
    return UpliftJob("chat.completions", {"model": "m", "messages": []}, "salt", url, httpx.Headers(), 4)


class HangingTransport(httpx.AsyncBaseTransport):
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


class AnsweringTransport(httpx.AsyncBaseTransport):
    def __init__(self, body: bytes, status: int = 200) -> None:
        self.body, self.status = body, status

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(self.status, content=self.body)


async def test_stopping_submits_the_records_of_unfinished_checks_without_a_gain():
    submitted: list[RequestRecord] = []
    client = httpx.AsyncClient(transport=HangingTransport())
    checker = UpliftChecker(lambda: client, submitted.append, concurrency=1, max_pending=2)
    assert checker.defer(record("a"), job()) and checker.defer(record("b"), job())
    assert not checker.defer(record("c"), job())  # too many waiting: the caller submits it
    await checker.stop(timeout_s=0.05)
    await client.aclose()
    assert sorted(r.request_id for r in submitted) == ["a", "b"]
    assert all(r.normalization_gain_tokens is None for r in submitted)
    assert (checker.pending, checker.skipped) == (0, 1)
    assert not checker.defer(record("d"), job())  # stopped: the caller submits it


async def test_gains_never_go_below_zero_and_bad_answers_leave_none():
    submitted: list[RequestRecord] = []
    for body, status in ((json.dumps({"matched_tokens": 9}).encode(), 200), (b"{}", 200), (b"oops", 500)):
        client = httpx.AsyncClient(transport=AnsweringTransport(body, status))
        checker = UpliftChecker(lambda client=client: client, submitted.append)
        checker.defer(record(), job())
        await checker.stop()
        await client.aclose()
    assert [r.normalization_gain_tokens for r in submitted] == [0, None, None]


def test_explanations_and_approximate_chains_reach_the_database(stub, stub_url, tmp_path):
    import sqlite3

    from gateway_testkit import db_storage, wait_until

    path = tmp_path / "gateway.db"
    storage = db_storage(f"sqlite:///{path}", tmp_path)
    config = replace(gateway_config(stub_url), upstreams=(UpstreamConfig(name="stub", url=stub_url, kind="openai"),))
    with running_gateway(config, storage) as gw:
        request_id = post(gw, CHAT).headers["x-request-id"]
        assert wait_until(lambda: storage.sink.counters().written == 1)
    with sqlite3.connect(path) as conn:
        reason, recomputed = conn.execute("SELECT miss_reason, recomputed_tokens FROM requests").fetchone()
        chain = conn.execute("SELECT request_id, block_size, input_length, approximate FROM request_chains").fetchone()
    assert (reason, recomputed) == ("new_prefix", 6)
    assert chain == (request_id, 16, 10, 1)
