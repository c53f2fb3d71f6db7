"""The fast replay agrees exactly with the brute-force reference on random traces; Belady is the ceiling."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from simulation_reference import reference_replay
from simulation_strategies import TTLS, traces, unchained_traces

from db.simulation import POLICIES, Trace, simulate, sweep

def _counts(trace: Trace, capacity_tokens: int | None, policy: str, ttl_s: float | None) -> tuple[int, ...]:
    result = simulate(trace, capacity_tokens, policy, ttl_s)
    return (result.hit_tokens, result.hit_blocks, result.hit_requests, result.evicted_blocks, result.expired_blocks)


@settings(max_examples=300, deadline=None)
@given(trace=traces(), capacity_tokens=st.one_of(st.none(), st.integers(0, 24)), ttl_s=TTLS)
def test_fast_replay_matches_reference(trace: Trace, capacity_tokens: int | None, ttl_s: float | None) -> None:
    for policy in POLICIES:
        expected = tuple(reference_replay(trace, capacity_tokens, policy, ttl_s))
        assert _counts(trace, capacity_tokens, policy, ttl_s) == expected, policy


@settings(max_examples=200, deadline=None)
@given(trace=unchained_traces(), capacity_tokens=st.one_of(st.none(), st.integers(0, 10)), ttl_s=TTLS)
def test_fast_replay_matches_reference_on_unchained_ids(
    trace: Trace, capacity_tokens: int | None, ttl_s: float | None
) -> None:
    for policy in POLICIES:
        expected = tuple(reference_replay(trace, capacity_tokens, policy, ttl_s))
        assert _counts(trace, capacity_tokens, policy, ttl_s) == expected, policy


@settings(max_examples=300, deadline=None)
@given(trace=traces(), capacity_tokens=st.integers(0, 24), ttl_s=TTLS)
def test_optimal_is_the_ceiling(trace: Trace, capacity_tokens: int, ttl_s: float | None) -> None:
    lru, fifo, optimal = sweep(trace, [capacity_tokens], ["lru", "fifo", "optimal"], [ttl_s])
    assert optimal.hit_blocks >= max(lru.hit_blocks, fifo.hit_blocks)
    assert optimal.hit_tokens >= max(lru.hit_tokens, fifo.hit_tokens)


@settings(max_examples=100, deadline=None)
@given(trace=traces())
def test_unlimited_cache_hits_every_repeated_block(trace: Trace) -> None:
    seen: set[int] = set()
    repeated = 0
    for request in trace.requests():
        repeated += sum(1 for block in request.hash_ids if block in seen)
        seen.update(request.hash_ids)
    for policy in POLICIES:
        result = simulate(trace, None, policy)
        assert result.hit_blocks == repeated
        assert result.hit_tokens == repeated * trace.block_size
        assert result.evicted_blocks == 0
