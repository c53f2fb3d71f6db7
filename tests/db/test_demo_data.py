"""Demo data: realistic, seeded, consistent with its rollups."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from db import queries
from db.engine import create_sync_engine_for
from db.records import MISS_KINDS, MISS_REASONS
from db.queries.conversations import conversation, conversation_totals, conversations
from db.timeutil import utc_now
from gateway.demo.history import write_demo_data
from prefixscope.cli import main

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def test_demo_data_is_varied_seeded_and_consistent(empty_db_url: str, db_helpers: SimpleNamespace) -> None:
    result = write_demo_data(empty_db_url, rows=3000, seed=3, days=3, now=NOW)
    assert result.rows == 3000 and result.until == NOW
    db_helpers.assert_rollups_match_requests(empty_db_url)
    ids = db_helpers.stored_ids(empty_db_url)
    assert len(ids) == len(set(ids)) == 3000

    engine = create_sync_engine_for(empty_db_url)
    try:
        with engine.connect() as conn:
            overview = queries.overview(conn, NOW - timedelta(days=3), NOW)
            assert overview.requests == 3000
            assert 0.2 < (overview.token_hit_rate or 0) < 0.95
            assert set(overview.miss_kinds) <= set(MISS_KINDS) and len(overview.miss_kinds) >= 4
            assert overview.error_requests > 0 and overview.requests_with_known_cache < 3000
            assert overview.ttft_hit_p50_ms is not None and overview.ttft_miss_p50_ms is not None
            assert overview.ttft_hit_p50_ms < overview.ttft_miss_p50_ms
            assert len(queries.tenants(conn)) == 5 and len(queries.models(conn)) >= 3
            assert queries.rule_counts(conn, NOW - timedelta(days=3), NOW)
            assert queries.top_prefixes(conn, NOW - timedelta(days=3), NOW, limit=5)
            newest = queries.recent_requests(conn, limit=1)[0]
            assert NOW - timedelta(days=3) <= newest.created_at < NOW
    finally:
        engine.dispose()

    # Same seed: the same ids, so writing again adds nothing.
    write_demo_data(empty_db_url, rows=3000, seed=3, days=3, now=NOW)
    assert len(db_helpers.stored_ids(empty_db_url)) == 3000


def test_demo_data_explains_misses_and_records_replayable_chains(empty_db_url: str) -> None:
    write_demo_data(empty_db_url, rows=4000, seed=5, days=2, now=NOW, chain_share=0.05)
    since = NOW - timedelta(days=2)
    engine = create_sync_engine_for(empty_db_url)
    try:
        with engine.connect() as conn:
            reasons = {row.reason: row for row in queries.miss_reason_totals(conn, since, NOW)}
            assert set(reasons) <= set(MISS_REASONS) and len(reasons) >= 7
            explained = sum(row.requests for row in reasons.values())
            assert 0.4 < reasons["hit"].requests / explained < 0.8  # most requests reuse their prefix
            assert reasons["hit"].recomputed_tokens == 0 and reasons["evicted"].recomputed_tokens > 0
            locations = queries.divergence_locations(conn, since, NOW, limit=50)
            segments = {location.segment for location in locations}
            assert {"system", "tools"} <= segments
            # The gateway's segment names; `model` when another model's cache was what differed (history method).
            assert all(s in ("system", "tools", "model", "prompt") or s.startswith("messages[") for s in segments)
            example = queries.miss_examples(conn, "reordered", since, NOW, limit=1)[0]
            assert example.divergence_segment == "tools" and example.recomputed_tokens
            gains = queries.normalization_gains(conn, since, NOW)
            assert 0 < gains.requests_with_gain < gains.sampled_requests < 4000 * 0.2
            chains = list(queries.iter_chains(conn, since))
    finally:
        engine.dispose()
    assert 4000 * 0.03 < len(chains) < 4000 * 0.07
    # Engine chains cover every full block; the gateway's approximate chains hash its own rendering of the prompt,
    # which comes out near the upstream's token count.
    for _, _, chain in chains:
        blocks = chain.input_length // chain.block_size
        if chain.approximate:
            assert abs(len(chain.hash_ids) - blocks) <= max(2, blocks // 10)
        else:
            assert len(chain.hash_ids) == blocks
    assert {chain.approximate for _, _, chain in chains} == {False, True}
    # Shared prefixes: an unbounded cache replaying the chains in order serves most blocks from cache.
    seen: set[int] = set()
    reused = total = 0
    for _, _, chain in chains:
        for block in chain.hash_ids:
            reused += block in seen
            total += 1
            seen.add(block)
    assert 0.3 < reused / total < 0.95


def test_demo_data_refuses_a_bad_chain_share(empty_db_url: str) -> None:
    with pytest.raises(ValueError):
        write_demo_data(empty_db_url, rows=10, chain_share=1.5)


def test_demo_names_are_the_gateway_s(empty_db_url: str) -> None:
    """Rule names, reasons, miss kinds and request ids as the gateway writes them; reasons that lost tokens say so."""
    import re

    from sqlalchemy import text

    from gateway.config.tenant import ALL_RULES
    from gateway.explain.reasons import REASONS

    write_demo_data(empty_db_url, rows=2000, seed=7, days=1, now=NOW)
    engine = create_sync_engine_for(empty_db_url)
    try:
        with engine.connect() as conn:
            rules = {rule for row in queries.recent_requests(conn, limit=2000) for rule in row.applied_rules}
            rows = conn.execute(text("SELECT id, miss_reason, miss_kind, recomputed_tokens, prompt_tokens, "
                                     "cached_tokens FROM requests")).all()
    finally:
        engine.dispose()
    assert rules and rules <= set(ALL_RULES)
    assert {row.miss_reason for row in rows if row.miss_reason} <= set(REASONS)
    assert {row.miss_kind for row in rows if row.miss_kind} <= set(MISS_KINDS)
    assert all(re.fullmatch(r"req_[0-9a-f]{24}", row.id) for row in rows)
    for row in rows:
        if row.miss_reason not in (None, "hit") and row.cached_tokens is not None:
            assert row.recomputed_tokens == row.prompt_tokens - row.cached_tokens > 0


def test_demo_data_splits_the_local_engine_s_hits_over_its_cache_tiers(empty_db_url: str) -> None:
    """The simulated local engine reports its tiers as the real one does: every answered request has its cached
    tokens split over device, host and disk (none on disk), a share of them loaded back from the host tier with a load
    time; upstreams that report no tiers leave the columns NULL, as real ones do."""
    from sqlalchemy import text

    from db.queries.results import CachedByTier
    from gateway.demo.engine_model import HOST_LOAD_MS_PER_TOKEN
    from gateway.demo.replay import LOCAL_UPSTREAM

    write_demo_data(empty_db_url, rows=2000, seed=7, days=1, now=NOW)
    engine = create_sync_engine_for(empty_db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT upstream, status_code, cached_tokens, cached_tokens_device, cached_tokens_host, "
                "cached_tokens_disk, cache_load_ms FROM requests"
            )).all()
            overview = queries.overview(conn, NOW - timedelta(days=1), NOW)
    finally:
        engine.dispose()
    tiers = ("cached_tokens_device", "cached_tokens_host", "cached_tokens_disk", "cache_load_ms")
    local = [row for row in rows if row.upstream == LOCAL_UPSTREAM and row.status_code == 200]
    others = [row for row in rows if row.upstream != LOCAL_UPSTREAM]
    assert len(local) > 500 and len(others) > 300
    for row in local:
        assert row.cached_tokens_device + row.cached_tokens_host + row.cached_tokens_disk == row.cached_tokens
        assert row.cached_tokens_disk == 0
        assert row.cache_load_ms == pytest.approx(row.cached_tokens_host * HOST_LOAD_MS_PER_TOKEN, abs=1e-3)
    assert 0.2 * len(local) < sum(row.cached_tokens_host > 0 for row in local) < 0.8 * len(local)
    assert all(getattr(row, name) is None for row in others for name in tiers)
    # Failed requests report nothing.
    assert all(getattr(row, name) is None for row in rows if row.status_code != 200 for name in tiers)
    # The rollups agree: about a fifth of the local engine's hit tokens came from the host tier.
    device = sum(row.cached_tokens_device for row in local)
    host = sum(row.cached_tokens_host for row in local)
    unknown = sum(row.cached_tokens or 0 for row in rows) - device - host
    assert overview.tiers == CachedByTier(device=device, host=host, disk=0, unknown=unknown)
    assert 0.1 < host / (device + host) < 0.3 and unknown > 0
    assert overview.cache_load_ms_mean is not None and overview.cache_load_ms_mean > 0


def test_demo_data_records_conversations_with_ledgers_that_add_up(empty_db_url: str) -> None:
    """The replayed multi-turn chats are conversations (ids, turns, parents in the same conversation) with token
    ledgers that add up to each turn's prompt tokens; `prefixscope conversations` lists them."""
    write_demo_data(empty_db_url, rows=3000, seed=3, days=1, now=NOW)
    engine = create_sync_engine_for(empty_db_url)
    try:
        with engine.connect() as conn:
            listed = conversations(conn, NOW - timedelta(days=1), NOW, limit=1000)
            totals = conversation_totals(conn, NOW - timedelta(days=1), NOW)
            shown = [conversation(conn, row.conversation_id, tenant=row.tenant) for row in listed]
    finally:
        engine.dispose()
    assert len(listed) > 50 and max(row.turns for row in listed) >= 4
    assert totals.eligible_hit_rate is not None and totals.lost_tokens and totals.new_tokens
    ledgers = 0
    for found in shown:
        assert found is not None
        ids = {turn.request_id for turn in found.turns}
        for turn in found.turns:
            assert turn.turn_index == 1 or turn.parent_request_id in ids
            if turn.has_ledger:
                ledgers += 1
                assert turn.adds_up and turn.cached_tokens + turn.new_tokens + turn.lost_tokens + (
                    turn.unknown_tokens or 0) == turn.prompt_tokens
        summary = found.summary
        assert summary.turns == len(found.turns)
    assert ledgers > 0.3 * totals.turns


def test_demo_data_through_the_cli_lists_conversations(
    empty_db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    write_demo_data(empty_db_url, rows=500, seed=4, days=1, now=utc_now())
    assert main(["conversations", "--since", "2d", "--limit", "5", "--database-url", empty_db_url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("CONVERSATION") and len(lines) == 6
