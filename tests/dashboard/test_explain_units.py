"""The Why misses and What-if pages' plain parts: the chain sample's block budget, the replay grid and its shortcut
for caches that hold everything, page sizes, and the figures."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from dashboard_testkit import create_database
from explain_testkit import CEILING_HIT_RATE, CHAINS, explained_records

from dashboard import charts_explain, loaders_explain
from dashboard.what_if_model import CurrentSetting, default_page_size, page_size_choices, run_what_if
from db.engine import create_sync_engine_for
from db.simulation import POLICIES, Trace, TraceRequest, simulate
from db.timeutil import utc_now


@pytest.fixture(scope="module")
def chains_engine(tmp_path_factory: pytest.TempPathFactory):
    engine = create_sync_engine_for(create_database(tmp_path_factory.mktemp("units") / "p.db", explained_records()))
    yield engine
    engine.dispose()


def _sample(engine, max_blocks: int, hours: float = 2) -> loaders_explain.ChainSample:
    until = utc_now() + timedelta(minutes=1)
    with engine.connect() as conn:
        return loaders_explain.load_chain_sample(conn, until - timedelta(hours=hours), until, None, max_blocks)


def test_chain_sample_keeps_the_newest_chains_within_the_budget(chains_engine) -> None:
    whole = _sample(chains_engine, 1000)
    assert [request.hash_ids for request in whole.requests] == [chain for chain, _, _ in CHAINS]
    assert whole.covers_range and whole.num_blocks == 16 and whole.num_approximate == 1
    assert whole.block_sizes == (4,)
    newest = _sample(chains_engine, 8)  # the last two chains hold 2 + 4 blocks; a third would pass 8
    assert [request.hash_ids for request in newest.requests] == [chain for chain, _, _ in CHAINS[-2:]]
    assert not newest.covers_range
    assert newest.first_s is not None and newest.last_s is not None and newest.first_s < newest.last_s
    # The newest chain is kept even when it alone is over the budget.
    assert [request.hash_ids for request in _sample(chains_engine, 1).requests] == [CHAINS[-1][0]]
    # Windows reach back past the first hour when the range is long.
    assert _sample(chains_engine, 1000, hours=24 * 90).num_requests == len(CHAINS)


def _random_requests(seed: int, num_requests: int = 60) -> list[TraceRequest]:
    rng = random.Random(seed)
    prefixes = [[rng.getrandbits(62) for _ in range(12)] for _ in range(4)]
    requests = []
    for index in range(num_requests):
        shared = prefixes[rng.randrange(len(prefixes))][: rng.randint(1, 12)]
        chain = tuple(shared + [rng.getrandbits(62) for _ in range(rng.randint(0, 6))])
        requests.append(TraceRequest(index * 30.0, len(chain) * 4 + rng.randint(0, 3), chain, 4))
    return requests


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_grid_matches_direct_replays_including_the_shortcut_for_large_caches(seed: int) -> None:
    requests = _random_requests(seed)
    capacities = [8, 40, 200, 1_000, 100_000]
    ttls = [None, 300.0]
    today = CurrentSetting(capacity_tokens=64, policy="fifo", ttl_s=300.0)
    result = run_what_if(requests, 4, capacities, POLICIES, ttls, today)
    trace = Trace.from_requests(requests, page_size=4)
    assert len(result.results) == len(capacities) * len(POLICIES) * len(ttls)
    for item in result.results:
        assert item == simulate(trace, item.capacity_tokens, item.policy, item.ttl_s)
    assert result.today == simulate(trace, 64, "fifo", 300.0)
    assert result.ceiling == simulate(trace, None, "lru", None)
    assert set(result.series()) == {(policy, ttl) for policy in POLICIES for ttl in ttls}
    assert result.distinct_blocks == len(set(trace.hashes))


def test_page_sizes_merge_recorded_blocks() -> None:
    assert page_size_choices([16]) == [16, 32, 64, 128, 256]
    assert page_size_choices([4, 6])[0] == 12
    assert default_page_size([16, 32], 32) == 32
    assert default_page_size([16, 32], 1) == 16 and default_page_size([16, 32], None) == 16
    requests = [TraceRequest(0.0, 16, (1, 2, 3, 4), 4), TraceRequest(1.0, 16, (1, 2, 3, 4), 4)]
    assert run_what_if(requests, 8, [1_000], ["lru"], [None]).num_blocks == 4  # two pages of 8 tokens each


def test_what_if_figure_has_a_line_per_series_the_ceiling_and_today() -> None:
    requests = [TraceRequest(10.0 * index, length, chain, 4) for index, (chain, length, _) in enumerate(CHAINS)]
    result = run_what_if(requests, 4, [8, 1_000], POLICIES, [None, 3600.0], CurrentSetting(1_000, "lru", None))
    assert result.ceiling is not None and result.ceiling.token_hit_rate == pytest.approx(CEILING_HIT_RATE)
    figure = charts_explain.what_if_figure(result, "today")
    lines = [trace for trace in figure.data if trace.mode == "lines+markers"]
    assert sorted(trace.name for trace in lines) == sorted(
        charts_explain.series_name(policy, ttl) for policy in POLICIES for ttl in (None, 3600.0)
    )
    star = next(trace for trace in figure.data if trace.mode == "markers")
    assert list(star.x) == [1_000] and list(star.y) == [pytest.approx(CEILING_HIT_RATE)]
    assert figure.layout.xaxis.type == "log"


def test_reason_colours_are_stable() -> None:
    assert charts_explain.reason_color("evicted") == charts_explain.reason_color("evicted")
    assert charts_explain.reason_color("evicted") != charts_explain.reason_color("expired")
    assert charts_explain.reason_color("some_new_reason").startswith("#")
    with pytest.raises(ValueError):
        charts_explain.miss_reasons_figure([], ["evicted"], measure="dollars")
