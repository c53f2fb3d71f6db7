"""Folding the rule advisor's estimates (`RequestRecord.advice`) into the `hourly_advice` rollup.

Called by `db.store.store_records` for the records it has just inserted, in the same transaction, so an estimate is
counted exactly once per stored request. Rows are keyed by hour, tenant, the fingerprint of the settings the sample
was served under, and candidate. Every other column is a sum, added with one upsert (`ON CONFLICT DO UPDATE SET
col = col + excluded.col`) as the other rollups are, except `last_sample_at`, which keeps the later time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Connection, case

from db.advice import CANDIDATE_MAX, SETTINGS_FINGERPRINT_MAX
from db.dialect import upsert_insert
from db.models import HourlyAdvice, table_of
from db.records import RequestRecord
from db.timeutil import floor_hour

ADVICE = table_of(HourlyAdvice)
KEY_COLUMNS: Final = ("bucket_start", "tenant", "settings_fingerprint", "candidate")
SUM_COLUMNS: Final = (
    "samples",
    "changed_samples",
    "prompt_tokens",
    "cached_tokens",
    "candidate_prompt_tokens",
    "candidate_cached_tokens",
    "ttft_ms_sum",
    "ttft_prefilled_tokens",
)


def advice_rows(records: Iterable[RequestRecord]) -> list[dict[str, Any]]:
    """`hourly_advice` parameter rows summing the advice of `records`, in key order. Records without known prompt
    and cached tokens carry no advice and are skipped."""
    sums: dict[tuple[datetime, str, str, str], dict[str, Any]] = defaultdict(lambda: dict.fromkeys(SUM_COLUMNS, 0))
    for record in records:
        if not record.advice or record.prompt_tokens is None or record.cached_tokens is None:
            continue
        prefilled = max(0, record.prompt_tokens - record.cached_tokens)
        for outcome in record.advice:
            fingerprint = outcome.settings[:SETTINGS_FINGERPRINT_MAX]
            row = sums[(floor_hour(record.created_at), record.tenant, fingerprint, outcome.candidate[:CANDIDATE_MAX])]
            last = row.get("last_sample_at")
            row["last_sample_at"] = record.created_at if last is None or record.created_at > last else last
            row["samples"] += 1
            row["changed_samples"] += 1 if outcome.changed else 0
            row["prompt_tokens"] += record.prompt_tokens
            row["cached_tokens"] += record.cached_tokens
            row["candidate_prompt_tokens"] += outcome.prompt_tokens
            row["candidate_cached_tokens"] += outcome.cached_tokens
            if record.ttft_ms is not None and prefilled > 0:
                row["ttft_ms_sum"] += record.ttft_ms
                row["ttft_prefilled_tokens"] += prefilled
    return [dict(zip(KEY_COLUMNS, key, strict=True)) | values for key, values in sorted(sums.items())]


def store_advice(conn: Connection, records: Iterable[RequestRecord]) -> int:
    """Add the advice of freshly stored `records` to `hourly_advice` (in the caller's transaction); returns the
    number of rows upserted."""
    rows = advice_rows(records)
    if not rows:
        return 0
    stmt = upsert_insert(conn, ADVICE)
    set_: dict[str, Any] = {name: ADVICE.c[name] + stmt.excluded[name] for name in SUM_COLUMNS}
    later = stmt.excluded.last_sample_at > ADVICE.c.last_sample_at
    set_["last_sample_at"] = case((later, stmt.excluded.last_sample_at), else_=ADVICE.c.last_sample_at)
    conn.execute(stmt.on_conflict_do_update(index_elements=list(KEY_COLUMNS), set_=set_), rows)
    return len(rows)
