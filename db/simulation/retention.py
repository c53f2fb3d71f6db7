"""What-if replay with a retention class per prefix: block hash chains through an unlimited cache whose blocks expire
by the class of the requests that used them.

The model is the local engine's: a request's class (`5m`, `1h`, `persistent`) sets the idle lifetime of the blocks it
stores or reads, in every tier (the engine applies one TTL per class to the device, host and disk copies alike, so a
tier changes where a block is, not how long it lives), and the longest class a block was used under wins. `none`
stands for "do not cache": such a request neither reads nor stores anything. A request at time `t` hits its leading
blocks that are cached and idle for at most their TTL (exactly TTL seconds still hits), then stores or refreshes all
its blocks. Capacity is unlimited: a class bounds a block's lifetime; a request the records show found its prefix
evicted (`RetentionRequest.evicted`: the ledger's `lost_evicted_tokens`, or `miss_kind` `evicted`) reads nothing under
any class and stores its blocks again: an observed eviction ends the entry, as in the advisor's replay.

For requests whose chains are a prefix's blocks followed by blocks of their own, this is the per-prefix replay of the
retention advisor (`db.retention.replay`) at block granularity; a test replays one recorded trace through both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from db.retention.costs import CLASS_TTL_S, NO_CACHE


@dataclass(frozen=True, slots=True)
class RetentionRequest:
    """One request: arrival (seconds), prompt length (tokens), chained block hashes, block size (tokens), and the
    key of the prefix it belongs to (the keyed `prefix_hash`, or any label); `evicted`: the recorded request found
    its cached prefix evicted."""

    timestamp_s: float
    input_length: int
    hash_ids: tuple[int, ...]
    block_size: int
    prefix: str
    evicted: bool = False


@dataclass(slots=True)
class PrefixFigures:
    """Per prefix: requests, prompt tokens, hit tokens, and writes (requests that stored the prefix's first block)."""

    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    writes: int = 0


@dataclass(slots=True)
class RetentionReplay:
    """Totals and per-prefix figures of one replay."""

    prompt_tokens: int = 0
    hit_tokens: int = 0
    prefixes: dict[str, PrefixFigures] = field(default_factory=dict)

    @property
    def token_hit_rate(self) -> float | None:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else None


def replay_retention(requests: Iterable[RetentionRequest], class_of: Callable[[str], str]) -> RetentionReplay:
    """Replay `requests` (in time order) with `class_of(prefix)` choosing each prefix's class (`none` or a key of
    `CLASS_TTL_S`). Raises KeyError for an unknown class, ValueError for requests out of time order."""
    last_use: dict[int, float] = {}
    ttl_of: dict[int, float | None] = {}
    result = RetentionReplay()
    previous = None
    for request in requests:
        now = request.timestamp_s
        if previous is not None and now < previous:
            raise ValueError("requests must be in time order")
        previous = now
        figures = result.prefixes.setdefault(request.prefix, PrefixFigures())
        figures.requests += 1
        figures.prompt_tokens += request.input_length
        result.prompt_tokens += request.input_length
        retention = class_of(request.prefix)
        if retention == NO_CACHE:
            continue
        ttl = CLASS_TTL_S[retention]
        hits = 0
        for block in () if request.evicted else request.hash_ids:
            touched = last_use.get(block)
            block_ttl = ttl_of.get(block)
            if touched is None or (block_ttl is not None and now - touched > block_ttl):
                break
            hits += 1
        hit_tokens = min(hits * request.block_size, request.input_length)
        figures.hit_tokens += hit_tokens
        result.hit_tokens += hit_tokens
        if request.hash_ids and hits == 0:
            figures.writes += 1
        for position, block in enumerate(request.hash_ids):
            stored = position < hits
            last_use[block] = now
            ttl_of[block] = _longest(ttl_of.get(block), ttl) if stored else ttl
    return result


def _longest(held: float | None, asked: float | None) -> float | None:
    """The longer of two lifetimes (None: never expires)."""
    if held is None or asked is None:
        return None
    return max(held, asked)
