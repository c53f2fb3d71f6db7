"""The one-pass LRU curve (stack distances) agrees exactly with the brute-force replays at every capacity, for one
cache and for a device tier with a host tier below it; `sweep` takes its LRU points from it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from simulation_reference import reference_replay, reference_replay_tiers
from simulation_strategies import TTLS, traces, unchained_traces

from db.simulation import Trace, TraceRequest, lru_curve, simulate, sweep


def _capacities(trace: Trace) -> list[int | None]:
    """Every capacity in blocks that can matter, one past the trace's blocks, and unlimited."""
    return [*range(trace.num_blocks + 2), None]


def _check_single_level(trace: Trace, ttl_s: float | None) -> None:
    curve = lru_curve(trace, ttl_s)
    for blocks in _capacities(trace):
        capacity_tokens = None if blocks is None else blocks * trace.block_size
        expected = tuple(reference_replay(trace, capacity_tokens, "lru", ttl_s))
        counts = curve.counts(blocks)
        assert tuple(counts)[:5] == expected, blocks
        assert (counts.device_hit_blocks, counts.device_hit_tokens) == (counts.hit_blocks, counts.hit_tokens)
        assert (counts.host_hit_blocks, counts.host_hit_tokens) == (0, 0)


@settings(max_examples=300, deadline=None)
@given(trace=traces(), ttl_s=TTLS)
def test_one_pass_matches_the_reference_at_every_capacity(trace: Trace, ttl_s: float | None) -> None:
    _check_single_level(trace, ttl_s)


@settings(max_examples=200, deadline=None)
@given(trace=unchained_traces(), ttl_s=TTLS)
def test_one_pass_matches_the_reference_on_unchained_ids(trace: Trace, ttl_s: float | None) -> None:
    _check_single_level(trace, ttl_s)


def _check_two_levels(trace: Trace, ttl_s: float | None) -> None:
    curve = lru_curve(trace, ttl_s)
    sizes = [*range(min(trace.num_blocks, 8) + 2), None]
    for device in sizes:
        for host in sizes:
            def tokens(blocks: int | None) -> int | None:
                return None if blocks is None else blocks * trace.block_size

            expected = reference_replay_tiers(trace, tokens(device), tokens(host), ttl_s)
            assert curve.counts(device, host) == expected, (device, host)


@settings(max_examples=200, deadline=None)
@given(trace=traces(), ttl_s=TTLS)
def test_two_levels_match_the_brute_force_hierarchy(trace: Trace, ttl_s: float | None) -> None:
    _check_two_levels(trace, ttl_s)


@settings(max_examples=150, deadline=None)
@given(trace=unchained_traces(), ttl_s=TTLS)
def test_two_levels_match_the_brute_force_hierarchy_on_unchained_ids(trace: Trace, ttl_s: float | None) -> None:
    _check_two_levels(trace, ttl_s)


@settings(max_examples=100, deadline=None)
@given(
    trace=traces(),
    capacities=st.lists(st.one_of(st.none(), st.integers(0, 30)), min_size=1, max_size=4),
    hosts=st.lists(st.one_of(st.none(), st.integers(0, 30)), min_size=1, max_size=3),
    ttls=st.lists(TTLS, min_size=1, max_size=2, unique=True),
)
def test_sweep_takes_lru_points_from_the_curve(
    trace: Trace, capacities: list[int | None], hosts: list[int | None], ttls: list[float | None]
) -> None:
    results = sweep(trace, capacities, ["lru"], ttls, host_capacities=hosts)
    assert [(r.capacity_tokens, r.host_capacity_tokens, r.ttl_s) for r in results] == [
        (capacity, host, ttl) for capacity in capacities for host in hosts for ttl in ttls
    ]
    for result in results:
        assert result == simulate(trace, result.capacity_tokens, "lru", result.ttl_s, result.host_capacity_tokens)
        if result.host_capacity_tokens == 0:
            # The single-level points are exactly the replay's.
            assert result == simulate(trace, result.capacity_tokens, "lru", result.ttl_s)


def _trace(*chains: list[int], block_size: int = 1) -> Trace:
    requests = [
        TraceRequest(float(index), len(chain) * block_size, tuple(chain), block_size) for index, chain in enumerate(chains)
    ]
    return Trace.from_requests(requests)


def test_a_block_demoted_to_the_host_hits_there_and_moves_back() -> None:
    # Device of one block, host of one. [1] then [2]: 1 is demoted to the host. [1] hits on the host and moves
    # back, demoting 2. [2] then hits on the host too, and [1] again.
    trace = _trace([1], [2], [1], [2], [1])
    result = simulate(trace, 1, "lru", host_capacity_tokens=1)
    assert (result.device_hit_blocks, result.host_hit_blocks, result.evicted_blocks) == (0, 3, 0)
    assert result.host_capacity_blocks == 1
    assert simulate(trace, 1, "lru").hit_blocks == 0  # without the host tier nothing hits
    assert simulate(trace, 2, "lru").hit_blocks == 3  # one cache of both sizes hits the same blocks


def test_a_prefix_hits_on_the_device_first_then_the_host() -> None:
    # [1, 2, 3] then [9]: a device of two blocks keeps 9 and 1 (the first block is the most recent); 2 and 3 are on
    # the host. The repeat hits 1 on the device, 2 and 3 on the host: 8 + 16 of 24 prompt tokens.
    trace = _trace([1, 2, 3], [9], [1, 2, 3], block_size=8)
    result = simulate(trace, 16, "lru", host_capacity_tokens=16)
    assert (result.device_hit_tokens, result.host_hit_tokens, result.hit_tokens) == (8, 16, 24)
    assert result.device_token_hit_rate == pytest.approx(8 / 56)
    assert result.host_token_hit_rate == pytest.approx(16 / 56)
    data = result.to_dict()
    assert (data["host_capacity_tokens"], data["host_capacity_blocks"], data["host_hit_tokens"]) == (16, 2, 16)


def test_the_curve_covers_every_capacity_up_to_the_distinct_blocks() -> None:
    trace = _trace([1, 2, 3], [4], [1, 2, 3])
    curve = lru_curve(trace)
    assert curve.max_blocks == 4
    assert [curve.counts(blocks).hit_blocks for blocks in range(6)] == [0, 0, 1, 2, 3, 3]
    assert curve.counts(None) == curve.counts(4) == curve.counts(1000)


def test_host_tier_is_lru_only_and_sizes_cannot_be_negative() -> None:
    trace = _trace([1], [1])
    with pytest.raises(ValueError, match="lru only"):
        simulate(trace, 1, "fifo", host_capacity_tokens=1)
    with pytest.raises(ValueError, match="lru only"):
        sweep(trace, [1], ["lru", "optimal"], host_capacities=[0, 1])
    with pytest.raises(ValueError, match="negative"):
        simulate(trace, 1, "lru", host_capacity_tokens=-1)
    with pytest.raises(ValueError, match="negative"):
        lru_curve(trace).counts(-1)
    with pytest.raises(ValueError, match="negative"):
        lru_curve(trace, -1.0)
