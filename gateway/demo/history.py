"""`write_demo_data(url, rows, seed)`: realistic request history, made by the gateway's own request path.

Requests come from `gateway.demo.traffic` and go through `gateway.demo.replay` (the tenant's normalization pipeline,
the record builder, the explainer, simulated engines answering in their real response shapes), so every rule name,
miss kind, reason, segment name and id format in the demo is one the gateway writes. At most `pool` distinct
requests are replayed that way (about 1,000 a second); larger histories repeat them, each copy with its own request
id and time near its original's, so that millions of rows stay cheap. Rows are spread over the last `days` days with
a daily rhythm, inserted in bulk through the same code as the live writer (so the rollups agree with the rows), and
seeded: the same arguments give the same data. The replayed requests carry their conversations (ids, turns, parents)
and token ledgers as the gateway records them; the copies carry the ledgers but are no conversation turns.
"""

from __future__ import annotations

import random
import time
from bisect import bisect_right
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from db.engine import create_sync_engine_for
from db.migrate import upgrade
from db.records import RequestRecord
from db.store import store_records
from db.tenants import ensure_tenant
from db.timeutil import as_utc, utc_now
from gateway.conversations.link import CONVERSATION_FIELDS
from gateway.demo.replay import Replay
from gateway.demo.traffic import TENANTS
from prefixscope.progress import progress

# Default share of requests recorded with their block hash chain.
DEFAULT_CHAIN_SHARE = 0.02
# Distinct requests replayed through the gateway's code before copies are used.
DEFAULT_POOL = 2_000


@dataclass(frozen=True)
class DemoDataResult:
    """What `write_demo_data` wrote; `distinct` of the `rows` went through the request path, the rest are copies."""

    rows: int
    distinct: int
    tenants: tuple[str, ...]
    since: datetime
    until: datetime
    seconds: float


def _timestamps(rng: random.Random, rows: int, since: datetime, days: int) -> list[datetime]:
    """Sorted times over [since, since + days) with more traffic in (UTC) working hours."""
    span_s = days * 86400.0
    stamps: list[float] = []
    while len(stamps) < rows:
        offset = rng.random() * span_s
        hour = (offset / 3600.0) % 24
        # Acceptance sampling: the night gets about a third of the daytime traffic.
        if rng.random() < (1.0 if 8 <= hour < 20 else 0.35):
            stamps.append(offset)
    stamps.sort()
    return [since + timedelta(seconds=offset) for offset in stamps]


def replay_pool(seed: int, stamps: list[datetime], ids: list[str]) -> list[RequestRecord]:
    """One record per stamp (in order), each request sent through the gateway's request path."""
    rng = random.Random(f"tenants/{seed}")
    replay = Replay(seed)
    weights = [profile.weight for profile in TENANTS]
    for created_at, request_id in zip(stamps, ids, strict=True):
        replay.send(rng.choices(TENANTS, weights=weights)[0], request_id, created_at)
    return replay.take()


def write_demo_data(
    url: str,
    rows: int,
    seed: int = 0,
    days: int = 14,
    now: datetime | None = None,
    batch_size: int = 20_000,
    chain_share: float = DEFAULT_CHAIN_SHARE,
    pool: int = DEFAULT_POOL,
) -> DemoDataResult:
    """Migrate the database at `url` and add `rows` requests over the `days` days before `now`, a `chain_share` of
    them with their block hash chain; at most `pool` of them distinct.

    Request ids derive from `seed`; writing the same seed twice into one database adds nothing the second time.
    Raises ValueError for rows < 0, days < 1, pool < 1 or a chain share outside [0, 1].
    """
    if rows < 0 or days < 1 or pool < 1:
        raise ValueError("rows must be >= 0, days >= 1 and pool >= 1")
    if not 0.0 <= chain_share <= 1.0:
        raise ValueError("chain_share must be between 0 and 1")
    started = time.perf_counter()
    upgrade(url)
    rng = random.Random(seed)
    until = as_utc(now) if now is not None else utc_now()
    since = until - timedelta(days=days)
    stamps = _timestamps(rng, rows, since, days)
    ids = [f"req_{rng.getrandbits(96):024x}" for _ in range(rows)]  # the gateway's request-id format
    distinct = min(rows, pool)
    # The pool's requests sit at evenly spaced rows, as replayed (their ids, times and conversations); the rows up to
    # the next one copy them.
    at = [k * rows // distinct for k in range(distinct)]
    originals = replay_pool(seed, [stamps[j] for j in at], [ids[j] for j in at])
    engine = create_sync_engine_for(url)
    try:
        with engine.begin() as conn:
            for profile in TENANTS:
                ensure_tenant(conn, profile.name, {"store_prompts": profile.settings.store_prompt_text})
        with progress("demo-data", total=rows, unit="requests") as bar:
            chain_rng = random.Random(f"chain-sample/{seed}")
            for start in range(0, rows, batch_size):
                records = [
                    _copy(originals[bisect_right(at, j) - 1], ids[j], stamps[j], chain_rng.random() < chain_share)
                    for j in range(start, min(rows, start + batch_size))
                ]
                with engine.begin() as conn:
                    store_records(conn, records)
                bar.advance(len(records))
    finally:
        engine.dispose()
    return DemoDataResult(
        rows=rows,
        distinct=distinct,
        tenants=tuple(profile.name for profile in TENANTS),
        since=since,
        until=until,
        seconds=time.perf_counter() - started,
    )


def _copy(record: RequestRecord, request_id: str, created_at: datetime, keep_chain: bool) -> RequestRecord:
    """`record` as row `request_id` at `created_at`: the replayed record itself when the id is its own, else a copy
    that is no conversation turn (its conversation fields NULL: the conversation's turns are the replayed ones)."""
    changes: dict[str, Any] = {"request_id": request_id, "created_at": created_at}
    if not keep_chain and record.chain is not None:
        changes["chain"] = None
    if request_id != record.request_id:
        changes.update(dict.fromkeys(CONVERSATION_FIELDS))
    return replace(record, **changes)
