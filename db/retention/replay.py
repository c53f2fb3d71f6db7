"""Replaying one prefix's uses under one retention class: hits, writes, writes never read, and the cost model's
figures. Pure functions over sorted use times.

The cache model, shared with the what-if simulator's retention replay (`db.simulation.retention`), which replays
block hash chains and must agree with it (a test replays one recorded trace through both):

- a use at time `t` reads the prefix when it is cached and its idle time `t - last_use` is at most the class's TTL
  (a prefix used exactly TTL seconds ago still hits; `persistent` never expires); a read refreshes the lifetime, as
  Anthropic's and the local engine's caches do;
- otherwise the use writes the prefix (a new entry, last use `t`); the entry it replaces, if never read, was a write
  never read again, and so is the last entry when no use read it;
- a use the records show found its entry evicted (`evicted`: the ledger's `lost_evicted_tokens`, or `miss_kind`
  `evicted`) writes under every class, though its idle time was within the TTL: an observed eviction ends the entry
  (held, at most, until that use) and counts as an eviction before the TTL (`ClassOutcome.evictions`);
- `none` ("do not cache") writes nothing and reads nothing: every use pays the full prefill.

Capacity is priced, not simulated: a class says how long an entry may stay, and the evictions the records show
(under the pressure of the class the requests were sent with) end it sooner. The local cost model prices the held
token-hours at the tiers the prefix's reads came from (`CostModel.held_price`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from db.retention.costs import CLASS_TTL_S, NO_CACHE, CostModel


@dataclass(frozen=True, slots=True)
class ClassOutcome:
    """One prefix under one class over the observed uses.

    `hit_tokens = hits x prefix_tokens`; `evictions` counts the uses that would have read the entry by the TTL but
    found it evicted (they write instead); `held_token_s` sums, over entries, prefix tokens x seconds from the write to
    expiry (or to `end_s`, the end of the observed range); `cost` is in the model's unit (base-input-token equivalents
    for hosted upstreams, 0 for local ones) and `saving` is what the class saves against `none` (tokens, or ms of
    prefill for local upstreams; negative when caching costs more than it saves).
    """

    retention: str
    uses: int
    hits: int
    writes: int
    unread_writes: int
    hit_tokens: int
    held_token_s: float
    cost: float
    saving: float
    evictions: int = 0

    @property
    def unread_write_share(self) -> float | None:
        """The share of writes never read again (None without writes)."""
        return self.unread_writes / self.writes if self.writes else None


def replay_class(
    times: Sequence[float], prefix_tokens: int, retention: str, model: CostModel, end_s: float | None = None,
    evicted: Collection[int] = (), held_price: float | None = None,
) -> ClassOutcome:
    """`times` (seconds, ascending) replayed under `retention` (`none` or a key of `CLASS_TTL_S`). `end_s` ends the
    observed range (default: the last use); `evicted` holds the indexes of the uses that found the entry evicted;
    `held_price` (ms per token-hour) prices held capacity for a local upstream (default: the device price). Raises
    KeyError for an unknown class, ValueError for unsorted times."""
    uses = len(times)
    if retention == NO_CACHE:
        cost = float(uses * prefix_tokens) if model.hosted else 0.0
        return ClassOutcome(NO_CACHE, uses, 0, 0, 0, 0, 0.0, cost, 0.0)
    ttl = CLASS_TTL_S[retention]
    evicted = frozenset(evicted)
    end = times[-1] if end_s is None and times else (end_s or 0.0)
    hits = writes = unread = evictions = 0
    held_s = 0.0
    written_at = last_use = None
    read_since_write = False
    previous = None
    for index, now in enumerate(times):
        if previous is not None and now < previous:
            raise ValueError("use times must be in ascending order")
        previous = now
        alive = last_use is not None and (ttl is None or now - last_use <= ttl)
        if alive and index not in evicted:
            hits += 1
            read_since_write = True
            last_use = now
            continue
        evictions += 1 if alive else 0
        if written_at is not None:
            held_s += _lifetime(written_at, last_use, ttl, now if alive else end)
            unread += 0 if read_since_write else 1
        writes += 1
        written_at = last_use = now
        read_since_write = False
    if written_at is not None:
        held_s += _lifetime(written_at, last_use, ttl, end)
        unread += 0 if read_since_write else 1
    held_token_s = held_s * prefix_tokens
    if model.hosted:
        write = model.write[retention]
        cost = prefix_tokens * (writes * write + hits * model.read)
        saving = uses * prefix_tokens - cost
    else:
        cost = 0.0
        price = model.held_price() if held_price is None else held_price
        saving = hits * prefix_tokens * model.prefill_ms_per_token - held_token_s / 3600 * price
    return ClassOutcome(
        retention, uses, hits, writes, unread, hits * prefix_tokens, held_token_s, cost, saving, evictions
    )


def _lifetime(written_at: float, last_use: float | None, ttl: float | None, end: float) -> float:
    """Seconds an entry written at `written_at` and last used at `last_use` stayed cached, up to `end`."""
    assert last_use is not None
    expires = end if ttl is None else min(last_use + ttl, max(end, last_use))
    return max(0.0, expires - written_at)


def replay_all(
    times: Sequence[float], prefix_tokens: int, model: CostModel, end_s: float | None = None,
    evicted: Collection[int] = (), held_price: float | None = None,
) -> tuple[ClassOutcome, ...]:
    """`none` and each class the upstream offers, in that order (arguments as `replay_class`)."""
    return tuple(replay_class(times, prefix_tokens, name, model, end_s, evicted, held_price)
                 for name in (NO_CACHE, *model.classes))


def best_class(outcomes: Sequence[ClassOutcome]) -> ClassOutcome:
    """The outcome with the highest saving; on a tie the shorter class (less capacity held), and `none` when no class
    saves anything."""
    best = outcomes[0]
    for outcome in outcomes[1:]:
        if outcome.saving > best.saving + 1e-9:
            best = outcome
    return best
