"""Retention advice from recorded prefix reuse: per tenant and per prefix, the class with the best net saving.

Input: each prefix's uses (`PrefixUses`: the keyed prefix hash, its tokens, the use times, the class its requests were
sent with, the cached tokens the upstream reported on them) and the cost model of the upstream it went to. For each
prefix every class is replayed (`db.retention.replay`); today's class is the one its requests asked for most (`default` when none: the upstream's own
lifetime, `DEFAULT_CLASS` per family). The saving per day is the best class's saving over today's, scaled from the
observed range to a day. A tenant's advised class is the one whose summed saving over its prefixes is highest; the
`prefixscope.toml` lines set it as the tenant's `cache_retention`.

Two guards keep the advice from costing hits: a class is advised over today's only when it saves strictly more (on
a tie today's class stays, with no lines to apply), and a prefix that is `reused` (its requests got cached tokens, or
its first block starts another prefix of the tenant too) while its own replay sees no reuse keeps today's class, and
its tenant is advised no class shorter than today's (the replay cannot say how long the reuse it misses needs). The second matters when a volatile value (a timestamp) makes every request's
prefix hash unique: each prefix looks used once, yet the engine reuses the leading blocks before the value.

A prefix whose uses found it evicted (`PrefixUses.evicted`, from the records) is replayed with each of those uses
writing, whatever the class (`db.retention.replay`), and its local capacity is priced at the tiers its reads came from
(`PrefixUses.reuse`, `CostModel.held_price`). When today's class saw evictions before its TTL, the action says so and
names the tier to grow: a longer class cannot keep an entry that pressure evicts.

Gap histogram: the seconds between consecutive uses of a prefix, in `GAP_EDGES_S` bins (bin i counts gaps in
`(edge[i-1], edge[i]]`, the last bin everything longer), with the median and the 90th percentile gap.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from db.advice import toml_key
from db.retention.costs import CLASS_TTL_S, NO_CACHE, CostModel
from db.retention.replay import ClassOutcome, best_class, replay_all, replay_class
from db.retention.reuse import UNKNOWN_TIER, PrefixReuse

GAP_EDGES_S: Final = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 14400.0, 86400.0)
# What `default` (no class sent) means, per family: hosted APIs cache 5 minutes; the local engine keeps a prefix
# until it is evicted unless started with --ttl.
DEFAULT_CLASS: Final = {True: "5m", False: "persistent"}
_RANK: Final = (NO_CACHE, *CLASS_TTL_S)  # shortest lifetime first
_ACTIONS: Final = {
    NO_CACHE: "do not cache it: send no cache breakpoint or retention class for it (it is not read again in time)",
    "5m": "cache it for 5 minutes",
    "1h": "cache it for 1 hour",
    "persistent": "keep it persistently",
}
# Where an entry evicted from a tier could have been kept instead.
_GROW: Final = {"device": "add host tier capacity (or device memory)", "host": "add disk tier capacity (or host memory)",
                "disk": "add disk tier capacity", UNKNOWN_TIER: "add cache capacity"}


@dataclass(frozen=True, slots=True)
class PrefixUses:
    """One prefix of one tenant: `prefix_hash` (keyed), its length in tokens, the use times in seconds (ascending),
    the class its requests asked for most (None: none sent) and the upstream kind they went to."""

    tenant: str
    prefix_hash: str
    prefix_tokens: int
    times: tuple[float, ...]
    requested_class: str | None
    upstream_kind: str
    cached_tokens: int = 0  # cached tokens the upstream reported on these requests (reuse a whole-prefix replay misses)
    shares_leading_blocks: bool = False  # its chains start with a block another prefix of the tenant starts with
    evicted: tuple[int, ...] = ()  # indexes into `times` of the uses that found the entry evicted (the records say)
    reuse: PrefixReuse = PrefixReuse()  # reads by tier, entries lost by tier and by class (`db.retention.reuse`)

    @property
    def reused(self) -> bool:
        """Read from the cache beyond what its own uses show: reported cached tokens, or leading blocks that another
        prefix's requests read (not caching it would take those hits away)."""
        return self.cached_tokens > 0 or self.shares_leading_blocks


@dataclass(frozen=True, slots=True)
class GapHistogram:
    """Gaps between consecutive uses: `counts[i]` in bin i of `GAP_EDGES_S` (len(edges) + 1 bins)."""

    counts: tuple[int, ...]
    median_s: float | None
    p90_s: float | None

    @property
    def total(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True, slots=True)
class PrefixRetention:
    """Advice for one prefix. `today` is today's class (`default` resolved in `today_outcome`), `best` the class
    with the best net saving, `saving_per_day` what switching saves per day (model unit), `unread_write_share` the
    share of today's writes never read again, `reuse` what the records say of its entries by tier and class."""

    prefix_hash: str
    prefix_tokens: int
    uses: int
    today: str
    today_outcome: ClassOutcome
    best: ClassOutcome
    outcomes: tuple[ClassOutcome, ...]
    saving_per_day: float
    unread_write_share: float | None
    gaps: GapHistogram
    action: str
    kept_for_reuse: bool = False  # the replay saw no reuse, but the upstream did (`PrefixUses.reused`): today's class kept
    reuse: PrefixReuse = PrefixReuse()


def is_used_once(prefix: PrefixRetention) -> bool:
    """Used once in the range, with no reuse the records show (not `kept_for_reuse`) and no eviction: nothing of it
    was read, so its advice is every such prefix's and a report may sum them (`UsedOnce`)."""
    return prefix.uses == 1 and not prefix.kept_for_reuse and not prefix.today_outcome.evictions


@dataclass(frozen=True, slots=True)
class UsedOnce:
    """A tenant's prefixes that `is_used_once` holds for, all of them (not only the `top` kept): how many, their
    prefix tokens summed, and what their best classes save per day over today's (the model's unit)."""

    prefixes: int = 0
    tokens: int = 0
    saving_per_day: float = 0.0


@dataclass(frozen=True, slots=True)
class TenantRetention:
    """A tenant's retention advice: its prefixes (largest first: tokens x uses), the class that saves most over all
    of them, that saving per day against today's classes, the unit of the figures and the toml lines."""

    tenant: str
    upstream_kind: str
    unit: str
    prefixes: tuple[PrefixRetention, ...]
    advised_class: str
    saving_per_day: float
    toml_lines: tuple[str, ...]  # empty: nothing to change, or no setting applies the advice (`none`)
    days: float = 1.0  # the days the per-day figures divide by (below 1: extrapolated from a shorter range)
    today_class: str = ""  # the most common class of its prefixes today; advised_class == today_class: no change
    used_once: UsedOnce = UsedOnce()  # its prefixes used once, summed over all of them


def gap_histogram(gaps: Sequence[float]) -> GapHistogram:
    counts = [0] * (len(GAP_EDGES_S) + 1)
    for gap in gaps:
        counts[bisect.bisect_left(GAP_EDGES_S, gap)] += 1
    ordered = sorted(gaps)
    return GapHistogram(tuple(counts), _quantile(ordered, 0.5), _quantile(ordered, 0.9))


def _quantile(ordered: Sequence[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def today_class(requested: str | None, model: CostModel) -> str:
    """The class a prefix is cached under today: the requested one (lowered to what the upstream offers), else the
    family's default."""
    if requested is None or requested not in CLASS_TTL_S:
        return DEFAULT_CLASS[model.hosted]
    return requested if requested in model.classes else model.classes[-1]


def advise_prefix(uses: PrefixUses, model: CostModel, days: float, end_s: float | None = None) -> PrefixRetention:
    """One prefix's advice over an observed range of `days` days ending at `end_s` (default: the last use)."""
    held = None if model.hosted else model.held_price(uses.reuse.read_tokens_by_tier())
    outcomes = replay_all(uses.times, uses.prefix_tokens, model, end_s, uses.evicted, held)
    today = today_class(uses.requested_class, model)
    today_outcome = next((o for o in outcomes if o.retention == today), None) or replay_class(
        uses.times, uses.prefix_tokens, today, model, end_s, uses.evicted, held
    )
    best = best_class(outcomes)
    kept_for_reuse = best.retention == NO_CACHE and uses.reused
    if kept_for_reuse or best.saving <= today_outcome.saving + 1e-9:
        best = today_outcome
    gaps = [later - earlier for earlier, later in zip(uses.times, uses.times[1:], strict=False)]
    return PrefixRetention(
        prefix_hash=uses.prefix_hash,
        prefix_tokens=uses.prefix_tokens,
        uses=len(uses.times),
        today=today if uses.requested_class is not None else f"default ({today})",
        today_outcome=today_outcome,
        best=best,
        outcomes=outcomes,
        saving_per_day=(best.saving - today_outcome.saving) / days,
        unread_write_share=today_outcome.unread_write_share,
        gaps=gap_histogram(gaps),
        action=_action(best.retention, today, uses if kept_for_reuse else None)
        + _eviction_note(today_outcome, best.retention, today, uses.reuse, model.classes[-1]),
        kept_for_reuse=kept_for_reuse,
        reuse=uses.reuse,
    )


def _eviction_note(today_outcome: ClassOutcome, best: str, today: str, reuse: PrefixReuse, longest: str) -> str:
    """`; evicted from device 5 times before its TTL (5m): ...` when today's class saw evictions before its TTL
    (`longest`: the longest class the upstream offers)."""
    count = today_outcome.evictions
    if not count:
        return ""
    tier = reuse.main_eviction_tier or UNKNOWN_TIER
    where = "" if tier == UNKNOWN_TIER else f" from {tier}"
    times = "once" if count == 1 else f"{count} times"
    if CLASS_TTL_S.get(today, 0.0) is None:
        return f"; evicted{where} {times} though kept persistently: {_GROW[tier]}"
    if _RANK.index(best) > _RANK.index(today):
        return f"; evicted{where} {times} before its TTL: {_GROW[tier]} to keep it for the longer class"
    if today == longest:
        return f"; evicted{where} {times} before its TTL ({today}): {_GROW[tier]}"
    return f"; evicted{where} {times} before its TTL ({today}): a longer class buys nothing; {_GROW[tier]}"


def _action(best: str, today: str, uses: PrefixUses | None) -> str:
    """What to do; `uses` given when today's class is kept because the prefix's leading blocks are read from cache,
    whatever the replay of the whole prefix and the cost model say."""
    if best != today:
        return _ACTIONS[best]
    if uses is not None:
        seen = [f"its requests got {uses.cached_tokens:,} cached tokens"] if uses.cached_tokens else []
        seen += ["it starts with blocks other prefixes of the tenant start with"] if uses.shares_leading_blocks else []
        return f"keep today's class ({today}): {' and '.join(seen)}; caching less would lose those reads"
    return f"keep today's class ({today}): no class saves more"


def advise_tenant(
    tenant: str, prefixes: Iterable[PrefixUses], model: CostModel, days: float, end_s: float | None = None,
    top: int = 10,
) -> TenantRetention:
    """A tenant's advice over all its prefixes (one upstream kind, one cost model); `top` prefixes are kept."""
    prefix_list = list(prefixes)
    advised = [advise_prefix(uses, model, days, end_s) for uses in prefix_list]
    advised.sort(key=lambda p: (-(p.prefix_tokens * p.uses), p.prefix_hash))
    totals: dict[str, float] = {}
    today_total = 0.0
    todays: Counter[str] = Counter()
    for prefix in advised:
        todays[prefix.today_outcome.retention] += 1
        today_total += prefix.today_outcome.saving
        for outcome in prefix.outcomes:
            totals[outcome.retention] = totals.get(outcome.retention, 0.0) + outcome.saving
    # Today's class (the most common among the prefixes) stays unless another saves strictly more. With prefixes kept
    # for reuse the replay cannot see, no shorter class is advised: it could expire the blocks they read.
    today = todays.most_common(1)[0][0] if todays else NO_CACHE
    floor = _RANK.index(today) if any(p.kept_for_reuse for p in advised) else 0
    choice = today
    for name, saving in totals.items():
        if _RANK.index(name) < floor:
            continue
        if saving > totals.get(choice, 0.0) + 1e-9:
            choice = name
    saving_per_day = (totals.get(choice, 0.0) - today_total) / days if advised and choice != today else 0.0
    lines = () if choice == today else toml_lines(tenant, choice)
    once = [prefix for prefix in advised if is_used_once(prefix)]
    used_once = UsedOnce(len(once), sum(p.prefix_tokens for p in once), sum(p.saving_per_day for p in once))
    return TenantRetention(
        tenant, model.kind, model.unit, tuple(advised[:top]), choice, saving_per_day, lines, days, today, used_once
    )


def toml_lines(tenant: str, retention: str) -> tuple[str, ...]:
    """The `prefixscope.toml` lines that apply `retention` as the tenant's class; none for `none` ("do not cache"):
    no setting turns caching off for a tenant (a request without a class still gets the upstream's own lifetime)."""
    if retention == NO_CACHE:
        return ()
    return (f"[tenants.{toml_key(tenant)}]", f'cache_retention = "{retention}"')
