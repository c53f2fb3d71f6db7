"""Replica sets over three real engine processes (a tiny random Llama with SmolLM2's tokenizer, small KV pools):
cache-aware placement, failover, health, tenant isolation; the event follower against a real engine's evictions
and gaps. Every test uses fresh prompt text (a nonce) so that nothing cached by an earlier test helps it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from gateway_testkit import FakeStorage, gateway_config, running_gateway, wait_until
from replica_kit import EngineProcess, save_tiny_model

from gateway.config import UpstreamConfig
from gateway.config.router import RouterSettings
from gateway.replicas.follower import poll_once, resync
from gateway.replicas.replica_set import Replica

POOL_TOKENS = "640"
ADMIN = "replica-test-admin"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("models") / "tiny"))


@pytest.fixture(scope="module")
def engines(tiny_model: str) -> Iterator[list[EngineProcess]]:
    processes = [EngineProcess(tiny_model, "--kv-cache-tokens", POOL_TOKENS, "--admin-token", ADMIN) for _ in range(3)]
    try:
        for process in processes:
            process.wait_healthy()
        yield processes
    finally:
        for process in processes:
            process.stop()


@pytest.fixture
def fresh(engines: list[EngineProcess]) -> list[EngineProcess]:
    """The engines, restarted if a test killed one, with empty caches."""
    for process in engines:
        try:
            httpx.get(f"{process.url}/health", timeout=2)
        except httpx.HTTPError:
            process.start()
            process.wait_healthy()
        headers = {"authorization": f"Bearer {ADMIN}"}
        assert httpx.post(f"{process.url}/v1/cache/flush", headers=headers, timeout=10).status_code == 200
    return engines


def replica_config(urls: list[str], **router: object):
    values = {"health_interval_s": 0.5, "event_poll_interval_s": 0.05, **router}
    settings = RouterSettings(**values)  # type: ignore[arg-type]
    upstream = UpstreamConfig(
        name="pool", url=urls[0], kind="local_engine", timeout_s=60.0, replicas=tuple(urls), routing="cache_aware",
        router=settings,
    )
    return gateway_config(urls[0], upstreams=(upstream,), default_upstream="pool")


def system_prompt(tag: str) -> str:
    return f"You are assistant {tag}. " + " ".join(f"rule-{tag}-{j} applies." for j in range(30))


def chat(gateway_url: str, system: str, question: str, key: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    body = {
        "model": "tiny",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 2,
    }
    response = httpx.post(f"{gateway_url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return response


def replicas_state(gateway_url: str) -> list[dict]:
    return httpx.get(f"{gateway_url}/health", timeout=5).json()["upstreams"][0]["replicas"]


def wait_synced(gateway_url: str) -> None:
    assert wait_until(lambda: all(r["events"] == "synced" and r["healthy"] for r in replicas_state(gateway_url)), 60)


def last_record(gateway, count: int):
    return gateway.wait_records(count)[count - 1]


def test_same_prefix_stays_on_its_replica_and_new_prefixes_go_to_the_emptiest(fresh):
    urls = [p.url for p in fresh]
    with running_gateway(replica_config(urls)) as gateway:
        wait_synced(gateway.url)
        nonce = uuid.uuid4().hex[:8]
        systems = [system_prompt(f"{nonce}-{i}") for i in range(3)]
        chat(gateway.url, systems[0], "first question")
        first = last_record(gateway, 1)
        # A prefix no replica was sent: placed by load, no engine asked for its token hashes.
        assert (first.routing_policy, first.predicted_match_tokens, first.routing_index_source) == (
            "cache_aware", 0, "approximate"
        )
        # New prefixes, no load anywhere: each goes to a replica whose cache holds nothing yet.
        chat(gateway.url, systems[1], "first question")
        chat(gateway.url, systems[2], "first question")
        placed = [r.replica for r in gateway.wait_records(3)]
        assert sorted(placed) == sorted(urls)
        # The same prefix again, with other questions: always the replica that holds it, predicted from its events.
        for n, question in enumerate(["second question", "third question", "fourth one"]):
            for i, system in enumerate(systems):
                chat(gateway.url, system, question)
                record = last_record(gateway, 4 + 3 * n + i)
                assert record.replica == placed[i]
                assert record.routing_index_source == "precise"
                assert record.cached_tokens > 0
                # page size 1: the engine matched the whole shared prefix; the router counted its full 16-token blocks
                assert record.predicted_match_tokens == record.cached_tokens - record.cached_tokens % 16
        metrics = httpx.get(f"{gateway.url}/metrics").text
        for url in urls:
            assert f'prefixscope_gateway_replica_requests_total{{replica="{url}",upstream="pool"}} 4.0' in metrics


def test_a_killed_replica_fails_over_once_and_is_routed_around(fresh):
    urls = [p.url for p in fresh]
    # No health check after the first: the request itself finds the replica dead.
    with running_gateway(replica_config(urls, health_interval_s=3600.0)) as gateway:
        wait_synced(gateway.url)
        system = system_prompt(uuid.uuid4().hex[:8])
        chat(gateway.url, system, "where does this go")
        home = last_record(gateway, 1).replica
        victim = next(p for p in fresh if p.url == home)
        victim.kill()
        chat(gateway.url, system, "and now")
        moved = last_record(gateway, 2)
        assert moved.replica != home and moved.status_code == 200
        state = {r["url"]: r for r in replicas_state(gateway.url)}
        assert state[home]["healthy"] is False
        assert httpx.get(f"{gateway.url}/health").json()["upstreams"][0]["failovers"] == 1
        chat(gateway.url, system, "once more")
        again = last_record(gateway, 3)
        assert again.replica == moved.replica  # its cache now holds the prefix; the dead replica is out
        assert again.routing_index_source == "precise" and again.predicted_match_tokens > 0
        assert httpx.get(f"{gateway.url}/health").json()["upstreams"][0]["failovers"] == 1


def test_a_replica_that_fails_health_checks_is_taken_out_and_put_back(fresh):
    urls = [p.url for p in fresh]
    with running_gateway(replica_config(urls)) as gateway:
        wait_synced(gateway.url)
        victim = fresh[0]
        victim.kill()
        assert wait_until(lambda: not {r["url"]: r for r in replicas_state(gateway.url)}[victim.url]["healthy"], 30)
        nonce = uuid.uuid4().hex[:8]
        for i in range(4):
            chat(gateway.url, system_prompt(f"{nonce}-{i}"), "question")
        assert all(r.replica != victim.url for r in gateway.wait_records(4))
        victim.start()
        victim.wait_healthy()
        wait_synced(gateway.url)
        # Back in rotation with an empty cache: the next new prefix goes there.
        chat(gateway.url, system_prompt(f"{nonce}-new"), "question")
        assert last_record(gateway, 5).replica == victim.url


def test_two_tenants_with_the_same_prompt_are_indexed_apart(fresh):
    urls = [p.url for p in fresh]
    storage = FakeStorage()
    keys = {tenant: storage.add_key(f"k{tenant}", tenant) for tenant in ("acme", "globex")}
    with running_gateway(replace(replica_config(urls), auth="keys"), storage) as gateway:
        wait_synced(gateway.url)
        system = system_prompt(uuid.uuid4().hex[:8])
        chat(gateway.url, system, "same question", keys["acme"])
        chat(gateway.url, system, "same question", keys["acme"])
        acme_again = last_record(gateway, 2)
        assert acme_again.tenant == "acme"
        chat(gateway.url, system, "same question", keys["globex"])
        globex = last_record(gateway, 3)
        # Nothing of acme's placement shows through: globex's prompt is new in its own namespace.
        assert (globex.tenant, globex.predicted_match_tokens, globex.cached_tokens) == ("globex", 0, 0)
        assert globex.replica != acme_again.replica  # a new prefix goes to an emptier replica
        snapshot = httpx.get(f"{acme_again.replica}/v1/cache/events/snapshot").json()
        assert len(snapshot["namespaces"]) == 1


def _one_token(messages: list[dict]) -> dict:
    return {"model": "tiny", "messages": messages, "max_tokens": 1}


def _follower_replica(url: str) -> Replica:
    return Replica(UpstreamConfig(name="pool", url=url, replicas=(url,)), url, 0)


def _engine_chain(url: str, messages: list[dict]) -> list[int]:
    body = {"model": "tiny", "messages": messages, "return_hash_chain": True, "hash_block_size": 16}
    return httpx.post(f"{url}/v1/cache/match", json=body, timeout=30).json()["hash_chain"]["hash_ids"]


def test_the_precise_index_follows_evictions(fresh):
    url = fresh[0].url
    replica = _follower_replica(url)

    async def run() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            assert await resync(client, replica)
            nonce = uuid.uuid4().hex[:8]
            prompts = [[{"role": "user", "content": system_prompt(f"{nonce}-{i}")}] for i in range(6)]
            first_chain = _engine_chain(url, prompts[0])
            await client.post(f"{url}/v1/chat/completions", json=_one_token(prompts[0]))
            await poll_once(client, replica)
            assert replica.precise.match_blocks("", first_chain, 0.0) == len(first_chain)
            for messages in prompts[1:]:  # about 170 tokens each into a 640-token pool: the first prompt is evicted
                await client.post(f"{url}/v1/chat/completions", json=_one_token(messages))
            while await poll_once(client, replica):
                pass
            assert replica.events_synced
            # Only the blocks every prompt shares (chat template and the common opening words) are still held.
            other_chain = _engine_chain(url, prompts[1])
            shared = next(i for i, (a, b) in enumerate(zip(first_chain, other_chain)) if a != b)
            assert 0 < shared < len(first_chain)
            assert replica.precise.match_blocks("", first_chain, 0.0) == shared
            snapshot = (await client.get(f"{url}/v1/cache/events/snapshot")).json()
            assert replica.precise.held.get("", set()) == set(snapshot["namespaces"].get("", []))
            assert replica.gaps == 0

    asyncio.run(run())


def test_a_gap_in_the_events_triggers_a_resync(tiny_model):
    import torch

    from local_engine.cache.events import CacheEventLog
    from local_engine.model.loader import load_model
    from tests.local_engine.server_fixtures import served_engine

    loaded = load_model(tiny_model, torch.device("cpu"))
    with served_engine(loaded, kv_cache_tokens=4096) as (url, engine):
        engine.cache.events = CacheEventLog(block_size=16, capacity=2)  # keeps only the last two events
        replica = _follower_replica(url)

        async def run() -> None:
            async with httpx.AsyncClient(timeout=30) as client:
                assert await resync(client, replica) and replica.resyncs == 1
                nonce = uuid.uuid4().hex[:8]
                for i in range(4):  # four stored events: the follower's cursor falls out of the window
                    messages = [{"role": "user", "content": system_prompt(f"{nonce}-{i}")}]
                    await client.post(f"{url}/v1/chat/completions", json=_one_token(messages))
                assert await poll_once(client, replica) == 0
                assert (replica.events_synced, replica.gaps) == (False, 1)
                assert await resync(client, replica) and replica.resyncs == 2
                snapshot = (await client.get(f"{url}/v1/cache/events/snapshot")).json()
                assert replica.precise.held == {"": set(snapshot["namespaces"][""])}
                assert replica.event_cursor == snapshot["seq"] >= 4

        asyncio.run(run())


def test_round_robin_and_least_loaded_are_recorded(fresh):
    urls = [p.url for p in fresh]
    config = replica_config(urls)
    config = replace(config, upstreams=(replace(config.upstreams[0], routing="round_robin"),))
    with running_gateway(config) as gateway:
        system = system_prompt(uuid.uuid4().hex[:8])
        for i in range(6):
            chat(gateway.url, system, f"question {i}")
        records = gateway.wait_records(6)
        assert [r.replica for r in records] == [urls[(i + 1) % 3] for i in range(6)]
        assert {(r.routing_policy, r.predicted_match_tokens, r.routing_index_source) for r in records} == {
            ("round_robin", None, None)
        }


@pytest.mark.real_model
def test_smollm2_replicas_keep_a_prefix_on_one_replica_with_exact_predictions():
    engines = [EngineProcess("smollm2", "--kv-cache-tokens", "4096") for _ in range(2)]
    try:
        urls = [engine.wait_healthy() for engine in engines]
        with running_gateway(replica_config(urls)) as gateway:
            wait_synced(gateway.url)
            system = "You are the help desk of a library. " + system_prompt(uuid.uuid4().hex[:8])
            for n, question in enumerate(["Opening hours?", "Can I renew a loan?", "Where are the maps?"]):
                body = {"model": "smollm2", "max_tokens": 2,
                        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
                response = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=300)
                assert response.status_code == 200, response.text
            records = gateway.wait_records(3)
            assert records[1].replica == records[2].replica == records[0].replica
            for record in records[1:]:
                assert record.routing_index_source == "precise" and record.cached_tokens > 0
                assert record.predicted_match_tokens == record.cached_tokens - record.cached_tokens % 16
    finally:
        for engine in engines:
            engine.stop()
