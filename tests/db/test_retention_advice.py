"""Retention advice: a generated workload with known reuse gaps gets the class that pays, with savings equal to a
brute-force replay of the cost model, and the advisor and the what-if simulator agree on a recorded trace."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from db.chains import RequestChain
from db.engine import create_sync_engine_for
from db.queries.retention import retention_advice
from db.retention.advice import GAP_EDGES_S, PrefixUses, advise_tenant, gap_histogram
from db.retention.costs import CLASS_TTL_S, CostModel, PriceError
from db.retention.prices import UpstreamPrices
from db.retention.replay import replay_class
from db.simulation.retention import replay_retention
from db.records import RequestRecord
from db.store import store_records
from prefixscope.cli import main
from .retention_testkit import stored_advice, trace_of

BASE_TIME = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)

ANTHROPIC = CostModel.for_kind("anthropic")
HOUR = 3600.0
TOKENS = {"every_3m": 3000, "every_20m": 2000, "once": 5000}
GAPS = {"every_3m": 180.0, "every_20m": 1200.0}


def brute_force_saving(times: list[float], tokens: int, retention: str, model: CostModel) -> float:
    """Second-by-second: an entry's remaining lifetime counts down each second; a use reads when it is alive."""
    if retention == "none":
        return 0.0
    ttl = CLASS_TTL_S[retention]
    uses = {int(t) for t in times}
    remaining: float | None = -1.0  # < 0: nothing cached
    cost = 0.0
    for second in range(int(max(times)) + 1):
        if second in uses:
            alive = remaining is None or remaining >= 0
            cost += tokens * (model.read if alive else model.write[retention])
            remaining = ttl  # a read refreshes, a write starts the lifetime
        elif remaining is not None and remaining >= 0:
            remaining -= 1
    return len(times) * tokens - cost


def workload() -> dict[str, list[float]]:
    """Six hours: one prefix every 3 minutes, one every 20 minutes, one used once."""
    return {
        "every_3m": [i * GAPS["every_3m"] for i in range(int(6 * HOUR / GAPS["every_3m"]))],
        "every_20m": [i * GAPS["every_20m"] for i in range(int(6 * HOUR / GAPS["every_20m"]))],
        "once": [42.0],
    }


def test_known_gaps_get_5m_1h_and_do_not_cache_with_exact_savings() -> None:
    times = workload()
    prefixes = [PrefixUses("acme", name, TOKENS[name], tuple(t), None, "anthropic") for name, t in times.items()]
    days = 0.25
    advice = advise_tenant("acme", prefixes, ANTHROPIC, days, end_s=6 * HOUR)
    best = {p.prefix_hash: p.best.retention for p in advice.prefixes}
    assert best == {"every_3m": "5m", "every_20m": "1h", "once": "none"}
    for prefix in advice.prefixes:
        name = prefix.prefix_hash
        for outcome in prefix.outcomes:
            assert outcome.saving == brute_force_saving(times[name], TOKENS[name], outcome.retention, ANTHROPIC)
        assert prefix.today == "default (5m)"
        expected = brute_force_saving(times[name], TOKENS[name], prefix.best.retention, ANTHROPIC)
        expected -= brute_force_saving(times[name], TOKENS[name], "5m", ANTHROPIC)
        assert prefix.saving_per_day == pytest.approx(expected / days, rel=1e-12)
    by_name = {p.prefix_hash: p for p in advice.prefixes}
    # Under today's 5m class, every write of the 20-minute prefix expires unread; the 3-minute one is written once.
    assert by_name["every_20m"].unread_write_share == 1.0
    assert by_name["every_3m"].today_outcome.writes == 1
    assert by_name["every_3m"].gaps.median_s == 180.0
    assert by_name["every_20m"].gaps.counts[GAP_EDGES_S.index(1800.0)] == len(times["every_20m"]) - 1
    assert advice.toml_lines[0] == "[tenants.acme]"


def test_openai_has_no_write_premium_so_reuse_within_the_lifetime_is_all_gain() -> None:
    openai = CostModel.for_kind("openai")
    outcome = replay_class([0.0, 100.0, 200.0], 1000, "5m", openai)
    assert (outcome.writes, outcome.hits) == (1, 2)
    assert outcome.saving == 3000 - (1000 * 1.0 + 2 * 1000 * 0.5)
    assert replay_class([0.0], 1000, "5m", openai).saving == 0.0


def test_local_engine_trades_prefill_time_against_capacity_held() -> None:
    local = CostModel.for_kind("local_engine", {"prefill_ms_per_token": 1.0, "held_ms_per_token_hour": 2.0})
    outcome = replay_class([0.0, 600.0], 100, "1h", local, end_s=600.0)
    assert outcome.hits == 1 and outcome.held_token_s == 100 * 600.0
    assert outcome.saving == 100 * 1.0 - (100 * 600.0 / 3600) * 2.0
    assert local.unit == "ms"


def test_prices_come_from_the_config_and_bad_ones_are_refused() -> None:
    data = {
        "upstreams": [{"name": "claude", "kind": "anthropic"}, {"name": "local", "kind": "local_engine"}],
        "advice": {"cache_prices": {"claude": {"write_1h": 3.0}}},
    }
    prices = UpstreamPrices.from_config(data)
    assert prices.for_upstream("claude").write["1h"] == 3.0
    assert prices.for_upstream("claude").read == 0.1
    assert not prices.for_upstream("local").hosted
    with pytest.raises(PriceError, match="read"):
        UpstreamPrices.from_config({**data, "advice": {"cache_prices": {"claude": {"read": -1}}}})
    with pytest.raises(PriceError, match="names no upstream"):
        UpstreamPrices.from_config({**data, "advice": {"cache_prices": {"nope": {"read": 0.2}}}})


def test_gap_histogram_bins() -> None:
    histogram = gap_histogram([5.0, 10.0, 11.0, 100000.0])
    assert histogram.counts[0] == 2 and histogram.counts[1] == 1 and histogram.counts[-1] == 1
    assert histogram.total == 4


def test_advice_and_simulator_agree_on_a_recorded_trace(
    db_url: str, make_record: Callable[..., RequestRecord], capsys: pytest.CaptureFixture[str]
) -> None:
    """Each request: its prefix's blocks, then blocks of its own. Stored, then read back by both."""
    block = 16
    prefix_blocks = {name: tuple(range(1000 * (i + 1), 1000 * (i + 1) + tokens // block))
                     for i, (name, tokens) in enumerate(TOKENS.items())}
    records = []
    unique = 10**6
    for name, times in workload().items():
        for t in times:
            unique += 1
            hashes = (*prefix_blocks[name], unique, unique + 10**7)
            chain = RequestChain(block, len(hashes) * block, hashes)
            records.append(make_record(created_at=BASE_TIME + timedelta(seconds=t), prefix_hash=name, chain=chain,
                                  prompt_tokens=chain.input_length, upstream="claude"))
    records.sort(key=lambda r: r.created_at)
    advice = stored_advice(db_url, records, ANTHROPIC, BASE_TIME, BASE_TIME + timedelta(hours=6))
    trace = trace_of(records, BASE_TIME, block)
    by_name = {p.prefix_hash: p for p in advice.prefixes}
    # The blocks a prefix's requests all share; a prefix used once is as long as its only prompt.
    assert by_name["every_3m"].prefix_tokens == len(prefix_blocks["every_3m"]) * block
    assert by_name["every_20m"].prefix_tokens == len(prefix_blocks["every_20m"]) * block
    assert by_name["once"].prefix_tokens == (len(prefix_blocks["once"]) + 2) * block
    for retention in ("none", "5m", "1h", "persistent"):
        simulated = replay_retention(trace, lambda _: retention)
        for name, prefix in by_name.items():
            outcome = next((o for o in prefix.outcomes if o.retention == retention), None)
            if outcome is None:  # hosted upstreams have no persistent class: the advisor replays it directly
                outcome = replay_class(
                    [(r.created_at - BASE_TIME).total_seconds() for r in records if r.prefix_hash == name],
                    prefix.prefix_tokens, retention, ANTHROPIC,
                )
            assert simulated.prefixes[name].hit_tokens == outcome.hit_tokens, (retention, name)
            assert simulated.prefixes[name].requests == outcome.uses
            assert simulated.prefixes[name].writes == outcome.writes, (retention, name)
    advised = replay_retention(trace, lambda name: by_name[name].best.retention)
    assert advised.prefixes["every_20m"].hit_tokens == by_name["every_20m"].best.hit_tokens > 0
    assert advised.prefixes["once"].hit_tokens == 0

    # `prefixscope simulate --retention` replays the stored requests the same way.
    argv = ["simulate", "--database-url", db_url, "--since", BASE_TIME.isoformat(), "--retention", "none,5m,1h,advised",
            "--json"]
    assert main(argv) == 0
    rows = {row["retention"]: row for row in json.loads(capsys.readouterr().out)["retention"]}
    for retention in ("none", "5m", "1h"):
        expected = sum(next(o for o in p.outcomes if o.retention == retention).hit_tokens for p in by_name.values())
        assert rows[retention]["hit_tokens"] == expected and rows[retention]["requests"] == len(records)
    # `advised`: each prefix under its best class, priced as a local engine (the cache the replay models).
    engine = create_sync_engine_for(db_url)
    try:
        with engine.connect() as conn:
            (local,) = retention_advice(conn, BASE_TIME, lambda _: CostModel.for_kind("local_engine"), top=10)
    finally:
        engine.dispose()
    best = {p.prefix_hash: p.best.retention for p in local.prefixes}
    assert rows["advised"]["hit_tokens"] == replay_retention(trace, best.__getitem__).hit_tokens


def test_a_local_engine_is_priced_at_its_measured_prefill_speed_unless_the_config_sets_one() -> None:
    data = {"upstreams": [{"name": "a", "kind": "local_engine"}, {"name": "b", "kind": "local_engine"}],
            "advice": {"cache_prices": {"b": {"prefill_ms_per_token": 3.0}}}}
    prices = UpstreamPrices.from_config(data)
    assert prices.for_upstream("a", 0.25).prefill_ms_per_token == 0.25
    assert prices.for_upstream("a").prefill_ms_per_token == 0.5
    assert prices.for_upstream("b", 0.25).prefill_ms_per_token == 3.0


LOCAL = CostModel.for_kind("local_engine")


def test_a_prefix_whose_requests_got_cached_tokens_is_never_advised_do_not_cache() -> None:
    # A timestamp atop the system prompt: every request's prefix hash is new, so each "prefix" is used once, but the
    # engine served ~196 leading tokens of each from its cache.
    prefixes = [PrefixUses("agents", f"p{i:02}", 643, (i * 10.0,), None, "", cached_tokens=196) for i in range(12)]
    # Observed for an hour: by the replay alone 5m would hold less capacity than persistent for the same (no) hits,
    # but the reuse it cannot see may need longer, so no shorter class than today's is advised.
    advice = advise_tenant("agents", prefixes, LOCAL, 1.0, end_s=3600.0)
    assert {p.best.retention for p in advice.prefixes} == {"persistent"}
    assert all(p.kept_for_reuse for p in advice.prefixes)
    five = sum(o.saving for p in advice.prefixes for o in p.outcomes if o.retention == "5m")
    assert five > sum(p.today_outcome.saving for p in advice.prefixes)
    assert all(p.action.startswith("keep today's class (persistent): its requests got 196 cached tokens")
               for p in advice.prefixes)
    assert advice.advised_class == advice.today_class == "persistent"
    assert advice.saving_per_day == 0.0 and advice.toml_lines == ()
    # The tenant's line says why today's class stays: not "no other class saves more" (by the replay one does).
    from gateway.advisor.retention_report import format_retention

    assert "keep today's class (persistent): its prefixes' leading blocks are read from cache" in format_retention(
        [advice])
    # Without reported cached tokens the same uses are not read again: do not cache, with no lines that keep caching.
    unread = [PrefixUses("agents", f"p{i:02}", 643, (i * 10.0,), None, "") for i in range(12)]
    advice = advise_tenant("agents", unread, LOCAL, 1.0, end_s=120.0)
    assert advice.advised_class == "none" and advice.toml_lines == ()


def test_a_tie_keeps_todays_class() -> None:
    # Two uses 3.5 s apart, observed up to the last use: 5m, 1h and persistent save exactly the same.
    uses = PrefixUses("acme", "tie", 256, (0.0, 3.48193), None, "")
    advice = advise_tenant("acme", [uses], LOCAL, 1.0)
    (prefix,) = advice.prefixes
    assert len({o.saving for o in prefix.outcomes if o.retention != "none"}) == 1
    assert prefix.best.retention == "persistent" and prefix.saving_per_day == 0.0
    assert advice.advised_class == advice.today_class == "persistent" and advice.toml_lines == ()


def test_observed_days_are_whole_or_the_fraction_below_one() -> None:
    from db.timeutil import observed_days

    assert observed_days(timedelta(days=1, minutes=20)) == 1.0
    assert observed_days(timedelta(days=7, hours=2)) == 7.0
    assert observed_days(timedelta(hours=2)) == pytest.approx(2 / 24)
    assert observed_days(timedelta(minutes=5)) == pytest.approx(1 / 24)


def test_simulated_advised_keeps_the_hits_the_engine_recorded(
    db_url: str, make_record: Callable[..., RequestRecord], capsys: pytest.CaptureFixture[str]
) -> None:
    """Twelve requests with unique prefix hashes sharing 12 leading blocks, each reported with cached tokens: the
    advised replay must hit as much as today's persistent class, not fall to "do not cache"."""
    block = 16
    shared = tuple(range(500, 512))
    records = []
    for i in range(12):
        hashes = (*shared, 9000 + 2 * i, 9001 + 2 * i)
        chain = RequestChain(block, len(hashes) * block, hashes)
        records.append(make_record(created_at=BASE_TIME + timedelta(seconds=10 * i), prefix_hash=f"stamp{i:02}",
                                   chain=chain, prompt_tokens=chain.input_length, cached_tokens=0 if i == 0 else 192,
                                   upstream="local"))
    engine = create_sync_engine_for(db_url)
    try:
        with engine.begin() as conn:
            store_records(conn, records)
    finally:
        engine.dispose()
    argv = ["simulate", "--database-url", db_url, "--since", BASE_TIME.isoformat(), "--retention",
            "none,persistent,advised", "--json"]
    assert main(argv) == 0
    rows = {row["retention"]: row for row in json.loads(capsys.readouterr().out)["retention"]}
    assert rows["persistent"]["hit_tokens"] == 11 * len(shared) * block
    assert rows["advised"]["hit_tokens"] == rows["persistent"]["hit_tokens"] > rows["none"]["hit_tokens"] == 0
