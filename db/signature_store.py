"""Writing prompt signatures (`RequestRecord.signature`) into `prompt_signatures`.

Called by `db.store.store_records` for the records it has just inserted, in the same transaction, so a replayed record
never stores its signature twice."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection

from db.dialect import upsert_insert
from db.models import PromptSignatureRow, table_of
from db.records import RequestRecord

SIGNATURES = table_of(PromptSignatureRow)


def signature_rows(records: Iterable[RequestRecord]) -> list[dict[str, Any]]:
    """The `prompt_signatures` rows of the records that carry a signature."""
    rows = []
    for record in records:
        sig = record.signature
        if sig is None:
            continue
        rows.append(
            {
                "request_id": record.request_id,
                "created_at": record.created_at,
                "tenant": record.tenant,
                "block_chars": sig.block_chars,
                "text_chars": sig.text_chars,
                "tool_chars": sig.tool_chars,
                "prompt_chars": sig.prompt_chars,
                "prompt_tokens": sig.prompt_tokens,
                **sig.packed(),
            }
        )
    return rows


def store_signatures(conn: Connection, records: Iterable[RequestRecord]) -> int:
    """Insert the signatures of freshly stored `records` (in the caller's transaction); returns how many."""
    rows = signature_rows(records)
    if rows:
        conn.execute(upsert_insert(conn, SIGNATURES).on_conflict_do_nothing(index_elements=["request_id"]), rows)
    return len(rows)
