"""Each policy on small hand-made traces with known answers: prefix lookups, eviction order, TTL, long requests."""

from __future__ import annotations

import pytest

from db.simulation import Trace, TraceRequest, simulate, sweep


def trace_of(*requests: tuple[float, list[int]] | tuple[float, list[int], int], block_size: int = 1) -> Trace:
    """Requests as (time, chain) or (time, chain, input_length); the length defaults to whole blocks."""
    built = []
    for request in requests:
        timestamp, chain = request[0], request[1]
        length = request[2] if len(request) == 3 else len(chain) * block_size
        built.append(TraceRequest(timestamp, length, tuple(chain), block_size))
    return Trace.from_requests(built)


def hits(trace: Trace, capacity_tokens: int | None, policy: str, ttl_s: float | None = None) -> int:
    return simulate(trace, capacity_tokens, policy, ttl_s).hit_blocks


# Two-block cache. 1 is touched again at t=2, then 3 forces an eviction: LRU drops 2, FIFO drops 1 (inserted first),
# Belady drops 1 (used again only at t=5, after 2 at t=4).
EVICTION_ORDER = trace_of((0, [1]), (1, [2]), (2, [1]), (3, [3]), (4, [2]), (5, [1]))


@pytest.mark.parametrize(("policy", "expected"), [("lru", 1), ("fifo", 2), ("optimal", 2)])
def test_eviction_order(policy: str, expected: int) -> None:
    assert hits(EVICTION_ORDER, 2, policy) == expected


def test_lookup_stops_at_the_first_missing_block() -> None:
    trace = trace_of((0, [1, 2, 3]), (1, [1, 2, 4]), (2, [1, 2, 4, 5]))
    result = simulate(trace, None, "lru")
    assert result.hit_blocks == 2 + 3
    assert result.hit_requests == 2
    assert result.request_hit_share == pytest.approx(2 / 3)


def test_fifo_can_orphan_a_child_lru_evicts_leaves_first() -> None:
    # After [1] and [1, 2], a third block evicts one: FIFO the parent 1 (inserted first), so [1, 2] then hits nothing
    # although 2 is cached; LRU the leaf 2 (the deepest block of the last request counts as oldest), keeping 1.
    trace = trace_of((0, [1]), (1, [1, 2]), (2, [3]), (3, [1, 2]))
    assert hits(trace, 2, "fifo") == 1
    assert hits(trace, 2, "lru") == 1 + 1
    assert hits(trace, 2, "optimal") == 1 + 1


def test_deepest_block_of_one_request_is_evicted_first() -> None:
    trace = trace_of((0, [1, 2, 3]), (1, [9]), (2, [1, 2, 3]))
    for policy in ("lru", "fifo"):
        # Room for three blocks: 9 evicts 3, so the repeat still hits 1 and 2.
        assert hits(trace, 3, policy) == 2


def test_request_longer_than_the_cache_keeps_its_first_blocks() -> None:
    trace = trace_of((0, [1, 2, 3, 4]), (1, [1, 2, 3, 4]))
    for policy in ("lru", "fifo", "optimal"):
        result = simulate(trace, 2, policy)
        assert (result.hit_blocks, result.evicted_blocks) == (2, 0)


def test_request_longer_than_the_cache_drops_its_deeper_cached_blocks() -> None:
    # Only possible when chains are not chained hashes (a chained block always sits at the same depth): 7 is cached,
    # then [1, 2, 7] in a two-block cache keeps 1 and 2 and drops 7, so the last request misses.
    trace = trace_of((0, [7]), (1, [1, 2, 7]), (2, [7]))
    for policy in ("lru", "fifo", "optimal"):
        result = simulate(trace, 2, policy)
        assert (result.hit_blocks, result.evicted_blocks) == (0, 1 + 1)


def test_ttl_drops_idle_blocks_and_an_exact_ttl_still_hits() -> None:
    trace = trace_of((0, [1]), (10, [1]), (21, [1]), (31, [1]))
    for policy in ("lru", "fifo", "optimal"):
        result = simulate(trace, None, policy, ttl_s=10)
        assert result.hit_blocks == 2  # t=10 (idle exactly 10 s) and t=31; t=21 had been idle for 11 s
        assert result.expired_blocks == 1
        assert simulate(trace, None, policy).hit_blocks == 3


def test_optimal_knows_a_block_will_expire_before_its_next_use() -> None:
    # TTL 5 s, room for two blocks. At t=5 block 3 must evict 1 or 2. 1's next use (t=6) comes first, but by then it
    # will have been idle 6 s and expired; 2 is used at t=7, idle 3 s. So Belady evicts 1 and hits 2 (LRU hits none).
    trace = trace_of((0, [1]), (4, [2]), (5, [3]), (6, [1]), (7, [2]))
    assert hits(trace, 2, "optimal", ttl_s=5) == 1
    assert hits(trace, 2, "lru", ttl_s=5) == 0


def test_hit_tokens_are_capped_by_the_input_length() -> None:
    # Mooncake-style chains hash a trailing partial block too: 2 blocks of 4 tokens for a 6-token prompt.
    trace = trace_of((0, [1, 2], 6), (1, [1, 2], 6), block_size=4)
    result = simulate(trace, None, "lru")
    assert (result.hit_blocks, result.hit_tokens, result.prompt_tokens) == (2, 6, 12)
    assert result.token_hit_rate == 0.5
    assert result.block_hit_rate == 0.5


def test_partial_trailing_tokens_count_as_prompt_tokens() -> None:
    trace = trace_of((0, [1], 7), (1, [1], 7), block_size=4)
    result = simulate(trace, None, "lru")
    assert (result.hit_tokens, result.prompt_tokens) == (4, 14)


def test_capacity_in_tokens_rounds_down_to_whole_blocks() -> None:
    trace = trace_of((0, [1, 2]), (1, [1, 2]), block_size=4)
    assert simulate(trace, 7, "lru").capacity_blocks == 1
    assert hits(trace, 7, "lru") == 1
    assert hits(trace, 3, "lru") == 0


def test_empty_trace_has_no_rates() -> None:
    result = simulate(Trace.from_requests([]), 100, "optimal")
    assert (result.token_hit_rate, result.block_hit_rate, result.request_hit_share) == (None, None, None)


def test_sweep_order_and_bad_settings() -> None:
    results = sweep(EVICTION_ORDER, [1, 2], ["lru", "optimal"], [None, 1.0])
    assert [(r.capacity_tokens, r.policy, r.ttl_s) for r in results] == [
        (capacity, policy, ttl) for capacity in (1, 2) for policy in ("lru", "optimal") for ttl in (None, 1.0)
    ]
    with pytest.raises(ValueError, match="unknown eviction policy"):
        simulate(EVICTION_ORDER, 2, "mru")
    with pytest.raises(ValueError, match="negative"):
        simulate(EVICTION_ORDER, -1, "lru")
    with pytest.raises(ValueError, match="negative"):
        simulate(EVICTION_ORDER, 2, "lru", ttl_s=-1)
