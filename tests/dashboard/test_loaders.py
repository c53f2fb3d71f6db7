"""The pages' loaders on the seeded rows: whole-range figures per tenant and model from the rollups in one pass."""

from __future__ import annotations

from datetime import timedelta

from dashboard_testkit import ALPHA_PROMPT_TEXT, PREFIX_ALPHA, PREFIX_BETA, create_database, seeded_records

from dashboard import loaders
from db.engine import create_sync_engine_for
from db.tenants import ensure_tenant
from db.timeutil import utc_now


def test_prefixes_and_model_usage_loaders(tmp_path) -> None:
    records = seeded_records()
    url = create_database(tmp_path / "loaders.db", records)
    engine = create_sync_engine_for(url)
    try:
        with engine.begin() as conn:
            ensure_tenant(conn, "gamma")  # registered, no requests yet
        until = utc_now() + timedelta(minutes=1)
        since = until - timedelta(days=90)
        with engine.connect() as conn:
            result = loaders.load_prefixes(conn, since, until, None)
            usage = {item.model: item for item in loaders.load_model_usage(conn, since, until, None)}
            beta_only = loaders.load_prefixes(conn, since, until, "beta")
    finally:
        engine.dispose()
    assert [row.prefix_hash for row in result.prefixes] == [PREFIX_ALPHA, PREFIX_BETA]
    assert result.labels == {PREFIX_ALPHA: ALPHA_PROMPT_TEXT}
    assert result.requests_in_range == len(records)
    tenants = {row.group: row for row in result.tenants}
    assert list(tenants) == ["alpha", "beta", "gamma"]
    assert tenants["alpha"].requests == 4 and tenants["beta"].error_requests == 1
    assert tenants["gamma"].requests == 0 and tenants["gamma"].token_hit_rate is None
    assert (usage["m-small"].prompt_tokens, usage["m-small"].cached_tokens) == (4000, 3148)
    assert (usage["m-large"].prompt_tokens, usage["m-large"].cached_tokens) == (4500, 0)
    assert [row.group for row in beta_only.tenants] == ["beta"] and beta_only.requests_in_range == 4
