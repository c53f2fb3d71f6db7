"""Fleet-wide prompt patterns from stored prompt signatures: the latest `max_signatures` in the range, across every
tenant (or one), handed to `db.patterns.finder`. Bounded by that cap whatever the range holds."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select

from db.models import PromptSignatureRow, table_of
from db.patterns.finder import (
    DEFAULT_MAX_SPAN_CHARS,
    DEFAULT_MIN_SHARED_CHARS,
    FleetPattern,
    SignedRequest,
    find_patterns,
)
from db.signatures import PromptSignature
from db.queries.totals import Reader
from db.timeutil import as_utc

SIGNATURES = table_of(PromptSignatureRow)
DEFAULT_MAX_SIGNATURES = 20_000


def load_signatures(
    conn: Reader, since: datetime, until: datetime | None = None, tenant: str | None = None,
    max_signatures: int = DEFAULT_MAX_SIGNATURES,
) -> list[SignedRequest]:
    """The latest `max_signatures` signatures created in [since, until)."""
    stmt = select(SIGNATURES).where(SIGNATURES.c.created_at >= as_utc(since))
    if until is not None:
        stmt = stmt.where(SIGNATURES.c.created_at < as_utc(until))
    if tenant is not None:
        stmt = stmt.where(SIGNATURES.c.tenant == tenant)
    stmt = stmt.order_by(SIGNATURES.c.created_at.desc()).limit(max_signatures)
    unpack = PromptSignature.unpack
    return [
        SignedRequest(
            row.tenant,
            PromptSignature(
                block_chars=row.block_chars,
                text_chars=row.text_chars,
                head=unpack(row.head),
                tail=unpack(row.tail),
                tools=unpack(row.tools),
                tool_chars=row.tool_chars,
                prompt_chars=row.prompt_chars,
                prompt_tokens=row.prompt_tokens,
            ),
        )
        for row in conn.execute(stmt)
    ]


def fleet_patterns(
    conn: Reader, since: datetime, until: datetime | None = None, tenant: str | None = None, top: int = 20,
    max_span_chars: int = DEFAULT_MAX_SPAN_CHARS, min_shared_chars: int = DEFAULT_MIN_SHARED_CHARS,
) -> list[FleetPattern]:
    """The costliest patterns (at most `top`) among the signatures in the range."""
    signed = load_signatures(conn, since, until, tenant)
    return find_patterns(signed, max_span_chars, min_shared_chars, top)
