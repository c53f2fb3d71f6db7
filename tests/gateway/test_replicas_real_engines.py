"""Replica sets over three real engine processes (a tiny random Llama with SmolLM2's tokenizer, small KV pools) that
publish their KV events over ZeroMQ: cache-aware placement from those events, failover, health, a killed and
restarted engine re-learnt, tenant isolation, a gap replayed, two gateways agreeing; the event index against a real
engine's evictions. Every test uses fresh prompt text (a nonce) so that nothing cached by an earlier test helps it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from gateway_testkit import FakeStorage, TcpProxy, free_port, gateway_config, running_gateway, wait_until
from replica_kit import EngineProcess, save_tiny_model

from gateway.config import UpstreamConfig
from gateway.config.router import ReplicaEvents, RouterSettings
from gateway.replicas.event_index import EventIndex, block_keys
from gateway.replicas.event_subscriber import EventSubscriber
from gateway.replicas.request_tokens import RequestTokenizer

POOL_TOKENS = "640"
ADMIN = "replica-test-admin"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("models") / "tiny"))


@pytest.fixture(scope="module")
def engines(tiny_model: str) -> Iterator[list[EngineProcess]]:
    processes = [
        EngineProcess(tiny_model, "--kv-cache-tokens", POOL_TOKENS, "--admin-token", ADMIN,
                      "--kv-events-endpoint", f"tcp://127.0.0.1:{free_port()}",
                      "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{free_port()}")
        for _ in range(3)
    ]
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


def replica_config(urls: list[str], events: tuple[ReplicaEvents | None, ...] = (), **router: object):
    """A replica set over `urls`; without `events` the gateway finds each engine's KV events in its /v1/cache."""
    values = {"health_interval_s": 0.5, "replay_timeout_s": 2.0, **router}
    settings = RouterSettings(**values)  # type: ignore[arg-type]
    upstream = UpstreamConfig(
        name="pool", url=urls[0], kind="local_engine", timeout_s=60.0, replicas=tuple(urls), routing="cache_aware",
        router=settings, replica_events=events,
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
        # A prefix no replica holds: placed by load, the events predicting nothing anywhere.
        assert (first.routing_policy, first.predicted_match_tokens, first.routing_index_source) == (
            "cache_aware", 0, "events"
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
                assert record.routing_index_source == "events"
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
        assert again.routing_index_source == "events" and again.predicted_match_tokens > 0
        assert httpx.get(f"{gateway.url}/health").json()["upstreams"][0]["failovers"] == 1


def test_a_killed_and_restarted_replica_is_taken_out_put_back_and_relearnt(fresh):
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
        new = system_prompt(f"{nonce}-new")
        chat(gateway.url, new, "question")
        assert last_record(gateway, 5).replica == victim.url
        state = {r["url"]: r for r in replicas_state(gateway.url)}[victim.url]
        assert state["event_restarts"] + state["event_replays"] >= 2  # the new process was learnt from a replay
        # What the new process caches is learnt from its events: the prefix stays there, predicted from them.
        chat(gateway.url, new, "another question")
        again = last_record(gateway, 6)
        assert (again.replica, again.routing_index_source) == (victim.url, "events")
        assert again.predicted_match_tokens > 0 and again.cached_tokens > 0


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


def _one_token(messages: list[dict]) -> dict:
    return {"model": "tiny", "messages": messages, "max_tokens": 1}


def _engine_matched(url: str, messages: list[dict]) -> int:
    body = {"model": "tiny", "messages": messages}
    return httpx.post(f"{url}/v1/cache/match", json=body, timeout=30).json()["matched_tokens"]


def test_the_event_index_follows_a_real_engines_evictions_token_for_token(fresh):
    """The gateway's tokenization of each prompt, looked up in the index its events built, finds exactly the full
    blocks the engine's own dry-run match finds, before and after evictions."""
    engine = fresh[0]
    cache = httpx.get(f"{engine.url}/v1/cache", timeout=10).json()["kv_events"]
    tokenizer = RequestTokenizer.from_engine(httpx.get(f"{engine.url}/v1/tokenizer", timeout=30).json())
    index = EventIndex()

    async def run() -> None:
        subscriber = EventSubscriber(index, ReplicaEvents(cache["endpoint"], cache["replay_endpoint"]))
        task = asyncio.create_task(subscriber.run())
        try:
            async with httpx.AsyncClient(timeout=60) as client:
                nonce = uuid.uuid4().hex[:8]
                prompts = [[{"role": "user", "content": system_prompt(f"{nonce}-{i}")}] for i in range(6)]
                for messages in prompts:  # about 170 tokens each into a 640-token pool: the first ones are evicted
                    await client.post(f"{engine.url}/v1/chat/completions", json=_one_token(messages))
                    await asyncio.sleep(0.3)
                    for earlier in prompts[: prompts.index(messages) + 1]:
                        tokens = tokenizer.prompt_token_ids("chat", {"messages": earlier})
                        matched = _engine_matched(engine.url, earlier)
                        blocks, _ = index.match(block_keys("", tokens, 16), 0.0)
                        # The engine never matches a prompt's last token (it computes it for its logits): a prompt of
                        # whole blocks, all held, matches one block less than the index holds.
                        matchable = min(blocks * 16, (len(tokens) - 1) // 16 * 16)
                        assert matchable == matched - matched % 16
                assert subscriber.synced and subscriber.gaps == 0
                assert _engine_matched(engine.url, prompts[0]) < 100  # the first prompt was evicted (mostly)
        finally:
            task.cancel()

    asyncio.run(run())


def test_a_gap_in_the_live_events_is_replayed(fresh):
    """The gateway's subscription goes through a proxy whose plug is pulled while the engine serves: the batches
    published meanwhile never arrive live; the next one shows the gap, and the replay brings them back."""
    engine = fresh[0]
    advertised = httpx.get(f"{engine.url}/v1/cache", timeout=10).json()["kv_events"]
    host, port = advertised["endpoint"].removeprefix("tcp://").rsplit(":", 1)
    proxy = TcpProxy(host, int(port))
    proxy.start()
    events = (ReplicaEvents(f"tcp://127.0.0.1:{proxy.port}", advertised["replay_endpoint"]),)
    try:
        # Blocks routed but not yet confirmed lapse at once: the prediction below can only come from the events.
        with running_gateway(replica_config([engine.url], events, pending_ttl_s=0.001)) as gateway:
            wait_synced(gateway.url)
            proxy.stop()
            system = system_prompt(uuid.uuid4().hex[:8])
            chat(gateway.url, system, "asked while the events were cut off")
            proxy.start()
            # Keep the engine publishing until the reconnected subscription sees a batch (and with it, the gap).
            for n in range(30):
                filler = {"model": "tiny", "max_tokens": 1,
                          "messages": [{"role": "user", "content": f"filler {n} {uuid.uuid4().hex}"}]}
                httpx.post(f"{engine.url}/v1/chat/completions", json=filler, timeout=60)
                if replicas_state(gateway.url)[0]["event_gaps"]:
                    break
            assert replicas_state(gateway.url)[0]["event_gaps"] >= 1
            chat(gateway.url, system, "asked again")  # the replayed batch told the router what this replica holds
            record = last_record(gateway, 2)
            assert record.routing_index_source == "events"
            assert record.predicted_match_tokens == record.cached_tokens - record.cached_tokens % 16 > 0
    finally:
        proxy.close()


def _gateway_process(port: int, config: Path, database_url: str, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "prefixscope", "gateway", "--port", str(port), "--config", str(config),
               "--database-url", database_url, "--log-level", "warning", "--open"]
    with open(log, "ab") as handle:
        return subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT)


def test_two_gateway_processes_route_the_same_prefix_to_the_same_replica(fresh, postgres_database, tmp_path):
    """Two gateway processes sharing one PostgreSQL database in front of one fleet, each following the engines'
    events: a prefix one of them sent somewhere is found there by the other."""
    urls = [p.url for p in fresh]
    config = tmp_path / "gateway.toml"
    config.write_text(
        '[[upstreams]]\nname = "pool"\nkind = "local_engine"\nrouting = "cache_aware"\n'
        f"replicas = [{', '.join(json.dumps(url) for url in urls)}]\n"
        "[upstreams.router]\nhealth_interval = 0.5\n"
    )
    database_url = f"postgresql://root@127.0.0.1:5432/{postgres_database}"
    ports = [free_port(), free_port()]
    gateways = [_gateway_process(port, config, database_url, tmp_path / f"gateway-{port}.log") for port in ports]
    gateway_urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        for url, process in zip(gateway_urls, gateways):
            assert wait_until(lambda: process.poll() is None and _healthy(url), 120), f"{url} did not start"
            wait_synced(url)
        nonce = uuid.uuid4().hex[:8]
        systems = [system_prompt(f"{nonce}-{i}") for i in range(3)]
        for system in systems:
            chat(gateway_urls[0], system, "from the first gateway")
        for system in systems:
            chat(gateway_urls[1], system, "from the second gateway")
        engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
        try:
            query = text("SELECT replica, routing_index_source, predicted_match_tokens, cached_tokens FROM requests "
                         "ORDER BY created_at")

            def stored_rows() -> list:
                with engine.connect() as conn:
                    return conn.execute(query).all()

            assert wait_until(lambda: len(stored_rows()) == 6, 30)
            rows = stored_rows()
        finally:
            engine.dispose()
        first, second = rows[:3], rows[3:]
        assert sorted(row.replica for row in first) == sorted(urls)
        for sent, found in zip(first, second):
            assert found.replica == sent.replica
            assert found.routing_index_source == "events" and found.predicted_match_tokens > 0
            assert found.predicted_match_tokens == found.cached_tokens - found.cached_tokens % 16
    finally:
        for process in gateways:
            process.terminate()
        for process in gateways:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


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
    engines = [EngineProcess("smollm2", "--kv-cache-tokens", "4096", "--kv-events-endpoint", "tcp://127.0.0.1:*",
                             "--kv-events-replay-endpoint", "tcp://127.0.0.1:*") for _ in range(2)]
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
                assert record.routing_index_source == "events" and record.cached_tokens > 0
                assert record.predicted_match_tokens == record.cached_tokens - record.cached_tokens % 16
    finally:
        for engine in engines:
            engine.stop()
