"""The fast replay agrees exactly with the brute-force reference on random traces; Belady is the ceiling."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from simulation_reference import reference_replay

from db.simulation import POLICIES, Trace, TraceRequest, simulate, sweep

TOKENS = st.lists(st.integers(0, 2), max_size=6)
# Whole and half seconds: TTL boundaries (idle exactly `ttl_s`) come up often.
TIMES = st.integers(0, 20).map(lambda half_seconds: half_seconds / 2)
TTLS = st.one_of(st.none(), st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.5, 4.0]))


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    """Chained traces over a three-token alphabet: shared prompts, conversations that grow, two tenants."""
    block_size = draw(st.integers(1, 3))
    bases = draw(st.lists(TOKENS, min_size=1, max_size=3))
    ids: dict[tuple[int, tuple[int, ...]], int] = {}
    requests = []
    for _ in range(draw(st.integers(0, 16))):
        tenant = draw(st.integers(0, 1))
        tokens = draw(st.sampled_from(bases)) + draw(TOKENS)
        bases.append(tokens)  # a later request may continue this one, as the next turn of a conversation
        chain = []
        for end in range(block_size, len(tokens) + 1, block_size):
            # Large, scattered ids, as real 63-bit hashes are; the same prefix in the same tenant gets the same id.
            chain.append(ids.setdefault((tenant, tuple(tokens[:end])), (len(ids) * 0x9E3779B97F4A7C15) % 2**63))
        requests.append(TraceRequest(draw(TIMES), len(tokens), tuple(chain), block_size))
    return Trace.from_requests(requests)


@st.composite
def unchained_traces(draw: st.DrawFn) -> Trace:
    """Chains of distinct ids in any order, as a trace file from elsewhere may hold: a block can sit at any depth."""
    block_size = draw(st.integers(1, 2))
    requests = [
        TraceRequest(draw(TIMES), draw(st.integers(0, 12)), tuple(chain), block_size)
        for chain in draw(st.lists(st.lists(st.integers(0, 6), max_size=5, unique=True), max_size=12))
    ]
    return Trace.from_requests(requests)


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
