"""Demo data: realistic, seeded, consistent with its rollups."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from db import queries
from gateway.demo.history import write_demo_data
from db.engine import create_sync_engine_for
from db.records import MISS_KINDS, MISS_REASONS

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

    from gateway.explain.reasons import REASONS
    from gateway.tenant_settings import ALL_RULES
    from gateway.upstreams.base import MISS_KINDS as GATEWAY_MISS_KINDS

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
    assert {row.miss_kind for row in rows if row.miss_kind} <= set(GATEWAY_MISS_KINDS)
    assert all(re.fullmatch(r"req_[0-9a-f]{24}", row.id) for row in rows)
    for row in rows:
        if row.miss_reason not in (None, "hit") and row.cached_tokens is not None:
            assert row.recomputed_tokens == row.prompt_tokens - row.cached_tokens > 0
