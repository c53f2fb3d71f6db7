"""A database's own engine context: the prefill speed and cache settings of the engines its history was recorded on.

The gateway polls each local engine's `/v1/cache` in the background and records, per upstream, the engine's
measured prefill speed (tokens/s) and its cache settings (capacity, page size, eviction policy, TTL). Figures over a
database's history ("Prefill time saved", the What-if page's "today") then use the context recorded with that
history rather than whatever engine the dashboard happens to reach.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, select

from db.dialect import upsert_insert
from db.models import EngineContextRow, table_of
from db.timeutil import as_utc

CONTEXTS = table_of(EngineContextRow)


@dataclass(frozen=True)
class EngineContext:
    """One upstream engine as last recorded; None where the engine did not say."""

    upstream: str
    recorded_at: datetime
    prefill_tokens_per_s: float | None
    capacity_tokens: int | None
    page_size: int | None
    eviction: str | None
    ttl_s: float | None


def _number(value: Any, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return kind(value)


def context_from_stats(upstream: str, stats: Mapping[str, Any], recorded_at: datetime) -> EngineContext:
    """An `EngineContext` from an engine's `/v1/cache` answer (unknown or malformed fields become None)."""
    eviction = stats.get("eviction")
    speed = _number(stats.get("prefill_tokens_per_s"), float)
    ttl = _number(stats.get("ttl_s"), float)
    return EngineContext(
        upstream=upstream,
        recorded_at=as_utc(recorded_at),
        prefill_tokens_per_s=speed if speed else None,
        capacity_tokens=_number(stats.get("capacity_tokens"), int),
        page_size=_number(stats.get("page_size"), int),
        eviction=eviction[:32] if isinstance(eviction, str) else None,
        ttl_s=ttl if ttl else None,
    )


def record_engine_context(conn: Connection, context: EngineContext) -> None:
    """Upsert the upstream's context; a prefill speed the engine has not measured (yet) keeps the recorded one."""
    row = {
        "upstream": context.upstream[:200],
        "recorded_at": context.recorded_at,
        "prefill_tokens_per_s": context.prefill_tokens_per_s,
        "capacity_tokens": context.capacity_tokens,
        "page_size": context.page_size,
        "eviction": context.eviction,
        "ttl_s": context.ttl_s,
    }
    stmt = upsert_insert(conn, CONTEXTS)
    update = {name: stmt.excluded[name] for name in row if name != "upstream"}
    update["prefill_tokens_per_s"] = func.coalesce(stmt.excluded.prefill_tokens_per_s, CONTEXTS.c.prefill_tokens_per_s)
    conn.execute(stmt.on_conflict_do_update(index_elements=["upstream"], set_=update), [row])


def latest_engine_context(conn: Connection, upstream: str | None = None) -> EngineContext | None:
    """The most recently recorded context (of `upstream`, when given), or None when none was recorded."""
    stmt = select(CONTEXTS).order_by(CONTEXTS.c.recorded_at.desc(), CONTEXTS.c.upstream).limit(1)
    if upstream is not None:
        stmt = stmt.where(CONTEXTS.c.upstream == upstream)
    row = conn.execute(stmt).first()
    if row is None:
        return None
    return EngineContext(
        upstream=row.upstream,
        recorded_at=as_utc(row.recorded_at),
        prefill_tokens_per_s=row.prefill_tokens_per_s,
        capacity_tokens=row.capacity_tokens,
        page_size=row.page_size,
        eviction=row.eviction,
        ttl_s=row.ttl_s,
    )
