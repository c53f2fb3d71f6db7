"""The Requests table shows its cache figures in the columns a 1400-pixel window shows without scrolling."""

from __future__ import annotations

from datetime import UTC, datetime

from dashboard.explain import REQUESTS_TABLE_FIRST_VIEW, request_table_rows
from db.queries import RequestRow


def test_the_cache_figures_come_before_the_fold() -> None:
    fields = {name: None for name in RequestRow.__dataclass_fields__}
    fields |= {"created_at": datetime(2026, 12, 1, tzinfo=UTC), "applied_rules": (), "request_id": "r"}
    fields |= {"status_code": 200}
    (row,) = request_table_rows([RequestRow(**fields)])
    first_view = list(row)[:REQUESTS_TABLE_FIRST_VIEW]
    for column in ("time (UTC)", "hit/miss", "prompt tokens", "cached tokens", "cached share", "tokens lost"):
        assert column in first_view, (column, first_view)
