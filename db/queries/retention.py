"""Retention advice from stored requests: each tenant's prefixes (by keyed `prefix_hash`), their use times and the
class their requests asked for, handed to `db.retention.advice`.

A prefix's length in tokens: when two or more of its first `CHAINS_PER_PREFIX` requests carry a block hash chain, the
leading blocks those chains share (block size x blocks, the part a cache could reuse between them); else the shortest
prompt among its requests (the prefix cannot be longer). A prefix also carries the cached tokens the upstream reported
on its requests and whether its first block starts another prefix of the tenant (see `PrefixUses.reused`), the reads
each tier served and the entries lost to eviction and expiry (`db.retention.reuse`), and which uses found it evicted. Reads at most `max_rows` answered requests (the latest), so the work is bounded whatever the
range; requests without a prefix hash or prompt tokens (rejected, unknown usage) are skipped.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select

from db.chains import unpack_hash_ids
from db.models import RequestChainRow, RequestRecordRow, table_of
from db.queries.totals import Reader
from db.retention.advice import PrefixUses, TenantRetention, advise_tenant
from db.retention.costs import CostModel
from db.retention.reuse import PrefixReuseTally
from db.timeutil import as_utc, observed_days, utc_now

REQUESTS = table_of(RequestRecordRow)
CHAINS = table_of(RequestChainRow)
DEFAULT_MAX_ROWS = 200_000
# A prefix's length comes from the chains of its first few requests (enough to find the blocks they share).
CHAINS_PER_PREFIX = 4
_ID_CHUNK = 500


@dataclass
class _Prefix:
    times: list[float] = field(default_factory=list)
    shortest: int | None = None
    chains: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)  # (block size, hashes)
    classes: Counter[str | None] = field(default_factory=Counter)
    upstreams: Counter[str] = field(default_factory=Counter)
    cached_tokens: int = 0
    reuse: PrefixReuseTally = field(default_factory=PrefixReuseTally)
    evicted: list[int] = field(default_factory=list)


def shared_chain_tokens(chains: list[tuple[int, tuple[int, ...]]]) -> int | None:
    """Tokens in the leading blocks every chain shares (None with fewer than two chains or mixed block sizes)."""
    if len(chains) < 2 or len({size for size, _ in chains}) != 1:
        return None
    size, first = chains[0]
    shared = len(first)
    for _, hashes in chains[1:]:
        count = 0
        for left, right in zip(first[:shared], hashes, strict=False):
            if left != right:
                break
            count += 1
        shared = count
    return shared * size


def load_prefix_uses(
    conn: Reader,
    since: datetime,
    until: datetime | None = None,
    tenant: str | None = None,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> dict[str, list[tuple[PrefixUses, str]]]:
    """Per tenant: each prefix's uses in [since, until) with the upstream most of its requests went to. Times are
    seconds since `since`."""
    start = as_utc(since)
    clauses = [REQUESTS.c.created_at >= start, REQUESTS.c.prefix_hash.is_not(None), REQUESTS.c.status_code < 400,
               REQUESTS.c.prompt_tokens.is_not(None)]
    if until is not None:
        clauses.append(REQUESTS.c.created_at < as_utc(until))
    if tenant is not None:
        clauses.append(REQUESTS.c.tenant == tenant)
    latest = (
        select(REQUESTS.c.id, REQUESTS.c.created_at)
        .where(*clauses)
        .order_by(REQUESTS.c.created_at.desc())
        .limit(max_rows)
        .subquery()
    )
    stmt = (
        select(
            REQUESTS.c.id, REQUESTS.c.tenant, REQUESTS.c.prefix_hash, REQUESTS.c.created_at, REQUESTS.c.prompt_tokens,
            REQUESTS.c.retention_class, REQUESTS.c.upstream, REQUESTS.c.cached_tokens, REQUESTS.c.cached_tokens_device,
            REQUESTS.c.cached_tokens_host, REQUESTS.c.cached_tokens_disk, REQUESTS.c.miss_kind,
            REQUESTS.c.lost_evicted_tokens, REQUESTS.c.evicted_tier, REQUESTS.c.lost_expired_tokens, REQUESTS.c.idle_s,
        )
        .join(latest, latest.c.id == REQUESTS.c.id)
        .order_by(REQUESTS.c.created_at, REQUESTS.c.id)
    )
    found: dict[tuple[str, str], _Prefix] = defaultdict(_Prefix)
    chain_ids: dict[str, _Prefix] = {}
    for row in conn.execute(stmt):
        prefix = found[(row.tenant, row.prefix_hash)]
        if len(prefix.times) < CHAINS_PER_PREFIX:
            chain_ids[row.id] = prefix
        prefix.times.append((as_utc(row.created_at) - start).total_seconds())
        prompt = int(row.prompt_tokens)
        prefix.shortest = prompt if prefix.shortest is None else min(prefix.shortest, prompt)
        prefix.classes[row.retention_class] += 1
        prefix.upstreams[row.upstream] += 1
        prefix.cached_tokens += int(row.cached_tokens or 0)
        if prefix.reuse.add(row):
            prefix.evicted.append(len(prefix.times) - 1)
    ids = list(chain_ids)
    for offset in range(0, len(ids), _ID_CHUNK):
        chunk = ids[offset : offset + _ID_CHUNK]
        chains = select(CHAINS.c.request_id, CHAINS.c.block_size, CHAINS.c.hash_ids).where(
            CHAINS.c.request_id.in_(chunk)
        )
        for row in conn.execute(chains):
            chain_ids[row.request_id].chains.append((int(row.block_size), unpack_hash_ids(row.hash_ids)))
    # Leading blocks several prefixes of a tenant start with: caching one prefix serves the others' requests.
    starts: Counter[tuple[str, int]] = Counter()
    for (name, _), prefix in found.items():
        starts.update({(name, hashes[0]) for _, hashes in prefix.chains if hashes})
    result: dict[str, list[tuple[PrefixUses, str]]] = defaultdict(list)
    for (name, prefix_hash), prefix in sorted(found.items()):
        shares = any(hashes and starts[(name, hashes[0])] > 1 for _, hashes in prefix.chains)
        shared = shared_chain_tokens(prefix.chains)
        tokens = min(shared, prefix.shortest or 0) if shared is not None else prefix.shortest or 0
        requested = prefix.classes.most_common(1)[0][0]
        upstream = prefix.upstreams.most_common(1)[0][0]
        uses = PrefixUses(
            name, prefix_hash, tokens, tuple(prefix.times), requested, "", prefix.cached_tokens, shares,
            tuple(prefix.evicted), prefix.reuse.result(),
        )
        result[name].append((uses, upstream))
    return dict(result)


def retention_advice(
    conn: Reader,
    since: datetime,
    prices: Callable[[str], CostModel],
    until: datetime | None = None,
    tenant: str | None = None,
    top: int = 10,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> list[TenantRetention]:
    """Per tenant with prefixes in the range, its retention advice; `prices(upstream name)` gives the cost model of
    the upstream a tenant's requests mostly went to."""
    end = as_utc(until) if until is not None else utc_now()
    days = observed_days(end - as_utc(since))
    end_s = (end - as_utc(since)).total_seconds()
    result = []
    for name, items in sorted(load_prefix_uses(conn, since, until, tenant, max_rows).items()):
        upstream = Counter(up for _, up in items).most_common(1)[0][0]
        model = prices(upstream)
        result.append(advise_tenant(name, [uses for uses, _ in items], model, days, end_s, top))
    return result

