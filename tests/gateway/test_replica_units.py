"""Replica routing without engines: the policy's balance rules, both indexes, the text chain and the configuration."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gateway.config import ConfigOverrides, UpstreamConfig, load_config, parse_config
from gateway.config.router import RouterSettings
from gateway.errors import ConfigError
from gateway.replicas.approximate_index import ApproximateIndex
from gateway.replicas.policy import Candidate, choose
from gateway.replicas.text_chain import prompt_material, text_chain

SETTINGS = RouterSettings(balance_abs_threshold=4, balance_rel_threshold=1.5, min_match_share=0.3)


def test_cache_aware_prefers_the_longest_match():
    pool = [Candidate(0, 1, 2, 32, 100), Candidate(1, 1, 60, 960, 100), Candidate(2, 0, 0, 0, 0)]
    assert choose("cache_aware", pool, SETTINGS, 0, 1000).position == 1
    assert choose("cache_aware", pool, SETTINGS, 0, 1000).reason == "cache"


def test_a_new_prefix_goes_to_the_least_loaded_then_emptiest():
    pool = [Candidate(0, 2, 0, 0, 0), Candidate(1, 1, 0, 0, 50), Candidate(2, 1, 0, 0, 10)]
    choice = choose("cache_aware", pool, SETTINGS, 0, 1000)
    assert (choice.position, choice.reason) == (2, "load")


def test_a_match_below_the_minimum_share_routes_by_load():
    pool = [Candidate(0, 3, 18, 290, 100), Candidate(1, 0, 0, 0, 100)]  # 290 < 0.3 * 1000
    assert choose("cache_aware", pool, SETTINGS, 0, 1000).position == 1
    pool = [Candidate(0, 3, 19, 310, 100), Candidate(1, 0, 0, 0, 100)]
    assert choose("cache_aware", pool, SETTINGS, 0, 1000).position == 0


def test_an_imbalance_beyond_both_thresholds_routes_by_load():
    pool = [Candidate(0, 10, 60, 960, 100), Candidate(1, 5, 0, 0, 100)]  # gap 5 > 4 and 10 > 1.5 * 5
    assert choose("cache_aware", pool, SETTINGS, 0, 1000) .reason == "balance"
    pool = [Candidate(0, 10, 60, 960, 100), Candidate(1, 7, 0, 0, 100)]  # 10 <= 1.5 * 7: not imbalanced
    assert choose("cache_aware", pool, SETTINGS, 0, 1000).position == 0


def test_the_load_penalty_breaks_near_ties():
    pool = [Candidate(0, 3, 60, 960, 100), Candidate(1, 0, 59, 944, 100)]
    assert choose("cache_aware", pool, SETTINGS, 0, 1000).position == 1


def test_round_robin_and_least_loaded():
    pool = [Candidate(0, 3), Candidate(1, 0), Candidate(2, 0)]
    assert [choose("round_robin", pool, SETTINGS, turn, 0).position for turn in range(4)] == [0, 1, 2, 0]
    assert [choose("least_loaded", pool, SETTINGS, turn, 0).position for turn in range(3)] == [1, 2, 1]


def test_approximate_index_ages_by_ttl_and_capacity():
    index = ApproximateIndex(capacity_blocks=4, ttl_s=10.0)
    index.record("a", [1, 2, 3], now=0.0)
    index.record("b", [1, 2], now=5.0)  # capacity 4: block ("a", 1) goes first
    assert index.match_blocks("a", [1, 2, 3], 6.0) == 0
    assert index.match_blocks("b", [1, 2], 6.0) == 2
    assert index.match_blocks("b", [1, 2], 16.0) == 0  # older than the TTL
    assert index.num_blocks() == 0


def test_text_chain_is_namespaced_and_shares_prefix_blocks():
    body = {"messages": [{"role": "system", "content": "x" * 200}, {"role": "user", "content": "hi"}]}
    other = {"messages": [{"role": "system", "content": "x" * 200}, {"role": "user", "content": "bye"}]}
    first = text_chain("salt-a", "m", prompt_material("chat.completions", body), 64)
    second = text_chain("salt-a", "m", prompt_material("chat.completions", other), 64)
    tenant_b = text_chain("salt-b", "m", prompt_material("chat.completions", body), 64)
    assert first.hashes[:3] == second.hashes[:3] and first.hashes != second.hashes
    assert not set(first.hashes) & set(tenant_b.hashes)
    assert len(first.hashes) == first.num_chars // 64


def test_replica_sets_in_the_config_file_and_on_the_command_line():
    config = parse_config(
        {
            "upstreams": [
                {
                    "name": "pool",
                    "replicas": ["http://127.0.0.1:8001", "http://127.0.0.1:8002"],
                    "router": {"min_match_share": 0.5, "health_interval": 1},
                }
            ]
        }
    )
    pool = config.upstream("pool")
    assert (pool.url, pool.routing, pool.router.min_match_share, pool.router.health_interval_s) == (
        "http://127.0.0.1:8001", "cache_aware", 0.5, 1.0
    )
    overridden = load_config(
        None, ConfigOverrides(replica_urls=("http://127.0.0.1:1", "http://127.0.0.1:2"), routing="least_loaded")
    )
    local = overridden.upstream("local")
    assert (local.replicas, local.routing) == (("http://127.0.0.1:1", "http://127.0.0.1:2"), "least_loaded")


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "p", "replicas": []},
        {"name": "p", "replicas": ["ftp://x"]},
        {"name": "p", "replicas": ["http://a", "http://a"]},
        {"name": "p", "replicas": ["http://a"], "routing": "random"},
        {"name": "p", "replicas": ["http://a"], "router": {"min_match_share": 2}},
        {"name": "p", "replicas": ["http://a"], "router": {"unknown": 1}},
    ],
)
def test_bad_replica_config_is_refused(entry):
    with pytest.raises(ConfigError):
        parse_config({"upstreams": [entry]})


def test_failovers_count_retries_not_failed_attempts():
    """A request that fails on every replica of a pair is retried once: one failover, not one per failed attempt."""
    import asyncio
    from types import SimpleNamespace

    from gateway.config import UpstreamConfig
    from gateway.errors import UpstreamUnavailable
    from gateway.replicas.dispatch import forward_routed
    from gateway.replicas.replica_set import ReplicaSet

    upstream = UpstreamConfig(
        name="local", url="http://127.0.0.1:1", replicas=("http://127.0.0.1:1", "http://127.0.0.1:2"),
        routing="round_robin",
    )
    replica_set = ReplicaSet(upstream)
    router = SimpleNamespace(replica_sets={"local": replica_set})
    placed = []
    tracker = SimpleNamespace(model="m", answer=None, explain=None, placed=placed.append)
    attempts: list[str] = []

    async def refuse(route):
        attempts.append(str(route.upstream.url))
        raise UpstreamUnavailable("refused")

    async def run() -> None:
        with pytest.raises(UpstreamUnavailable):
            await forward_routed(router, None, SimpleNamespace(name="local"), "chat", {"messages": []}, "ns", tracker,
                                 SimpleNamespace(started=False), refuse)

    asyncio.run(run())
    assert len(attempts) == 2
    assert [stage.failovers for stage in placed] == [1]
    assert replica_set.failovers == 1
    assert all(not r.healthy and r.load == 0 for r in replica_set.replicas)


def test_replica_metrics_compare_predictions_only_where_the_engine_answered():
    """A request the engine refused (a 400, no usage) has no actual cached tokens: its prediction is left out of the
    predicted-tokens counter too, as the dashboard's router accuracy leaves it out, so the two counters compare."""
    from datetime import datetime, timezone

    from prometheus_client import CollectorRegistry

    from db.records import RequestRecord
    from gateway.replicas.replica_metrics import ReplicaMetrics

    registry = CollectorRegistry()
    metrics = ReplicaMetrics(registry)

    def record(status: int, predicted: int, cached: int | None) -> RequestRecord:
        return RequestRecord(
            request_id=f"r{status}", created_at=datetime.now(timezone.utc), tenant="t", key_id=None,
            endpoint="chat", model="m", upstream="local", stream=False, status_code=status, error_type=None,
            prompt_tokens=None if cached is None else 464, cached_tokens=cached, completion_tokens=None, ttft_ms=None,
            latency_ms=1.0, replica="http://r1", routing_policy="cache_aware", predicted_match_tokens=predicted,
            routing_index_source="events",
        )

    metrics.observe(record(200, 448, 457))
    metrics.observe(record(400, 304, None))
    labels = {"upstream": "local", "replica": "http://r1"}
    assert registry.get_sample_value("prefixscope_gateway_replica_requests_total", labels) == 2
    assert registry.get_sample_value("prefixscope_gateway_replica_predicted_cached_tokens_total", labels) == 448
    assert registry.get_sample_value("prefixscope_gateway_replica_cached_tokens_total", labels) == 457


def test_bench_routing_starts_its_gateway_open(monkeypatch, tmp_path):
    """The routing bench's own gateway has a fresh database without keys and its client sends none: the gateway must
    run open, or every request is refused with a 503 (open mode is never inferred)."""
    from gateway.bench import routing

    commands: list[list[str]] = []

    class Started(Exception):
        pass

    def spawn(command, log):
        commands.append(command)
        raise Started

    monkeypatch.setattr(routing, "spawn", spawn)
    with pytest.raises(Started):
        routing._run_policy("events", [], [], tmp_path)
    assert "--open" in commands[0]


def test_a_prefix_an_engine_holds_is_found_from_its_events_after_a_gateway_restart():
    """The gateway's own text index is empty after a restart; the replica's KV events still say where the prefix is,
    and a namespace whose blocks no replica holds is placed by load."""
    from gateway.parsing import CHAT
    from gateway.replicas.event_index import block_keys
    from gateway.replicas.kv_event_wire import Stored
    from gateway.replicas.replica_set import ReplicaSet

    upstream = UpstreamConfig(
        name="local", url="http://127.0.0.1:1", replicas=("http://127.0.0.1:1", "http://127.0.0.1:2"),
        routing="cache_aware",
    )
    replicas = ReplicaSet(upstream)
    tokens = list(range(480))
    replicas.replicas[1].index.apply([Stored(tuple(range(30)), None, tokens, 16, 0, "ns")])
    for replica in replicas.replicas:
        replica.subscriber = SimpleNamespace(synced=True)
    body = {"model": "m", "messages": [{"role": "system", "content": "long system prompt " * 40},
                                       {"role": "user", "content": "hi"}]}
    placement = replicas.decide(CHAT, body, "ns", "m", tokens)
    assert placement.replica.url == "http://127.0.0.1:2"
    assert placement.index_source == "events" and placement.predicted_match_tokens == 480 - 1  # all but the last
    assert placement.reason == "cache"
    other = replicas.decide(CHAT, body, "other", "m", tokens)
    assert (other.reason, other.predicted_match_tokens) == ("load", 0)
    assert block_keys("ns", tokens, 16) != block_keys("other", tokens, 16)
