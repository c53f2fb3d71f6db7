"""The demo tenants and what happens to each of their requests at the cache: how much matched, why the rest missed,
where the prompt diverged, what normalization gained, and the prompt's block hash chain.

Used by `db.demo_data`. A tenant's shared prefix is laid out as system prompt, then tool schemas, then earlier
messages; a divergence is placed in one of those segments and the cached tokens end at the page before it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Final

from db.chains import RequestChain

PAGE_TOKENS: Final = 16
CHARS_PER_TOKEN: Final = 4
# Sources of the `reordered`, `tools_changed` and `system_changed` variants: a few orders or versions recur, so the
# same diverged chains come back and a simulator sees them hit; volatile values and new messages never recur.
_RECURRING_VARIANTS: Final = {"reordered": 6, "tools_changed": 3, "system_changed": 4}


@dataclass(frozen=True)
class TenantProfile:
    name: str
    weight: float
    models: tuple[str, ...]
    num_prefixes: int
    prefix_tokens: tuple[int, int]  # range of shared-prefix lengths
    hit_rate: float  # chance a request finds its prefix cached
    partial_rate: float  # among hits, chance the prompt diverged inside the prefix
    lost_kind: str  # why a known prefix missed: cold, evicted or expired
    rules_rate: float
    # Shares of the prefix that are the system prompt and tool schemas (the rest: earlier messages).
    system_share: float
    tools_share: float
    # (reason, weight) of a divergence inside the prefix, and of a cold miss.
    diverged_reasons: tuple[tuple[str, float], ...]
    cold_reasons: tuple[tuple[str, float], ...] = (("new_prefix", 1.0),)
    stores_prompts: bool = False


# fmt: off
TENANTS: Final = (
    # A support bot: one long system prompt, almost always cached; stores prompts for the explorer.
    TenantProfile(
        name="acme-support", weight=0.35, models=("smollm2-135m-instruct",), num_prefixes=8,
        prefix_tokens=(1500, 3000), hit_rate=0.92, partial_rate=0.03, lost_kind="evicted", rules_rate=0.3,
        system_share=0.85, tools_share=0.0,
        diverged_reasons=(("messages_changed", 0.7), ("system_changed", 0.3)), stores_prompts=True,
    ),
    # Agents whose tool schemas arrive reordered: many partial hits.
    TenantProfile(
        name="globex-agents", weight=0.25, models=("llama-3.1-8b-instruct", "smollm2-135m-instruct"),
        num_prefixes=40, prefix_tokens=(2500, 6000), hit_rate=0.75, partial_rate=0.35, lost_kind="evicted",
        rules_rate=0.8, system_share=0.1, tools_share=0.75,
        diverged_reasons=(("reordered", 0.5), ("tools_changed", 0.35), ("volatile_value", 0.15)),
        cold_reasons=(("new_prefix", 0.65), ("model_changed", 0.35)),
    ),
    # RAG over many documents: prefixes expire before they are reused.
    TenantProfile(
        name="initech-rag", weight=0.2, models=("qwen2.5-7b-instruct",), num_prefixes=200,
        prefix_tokens=(800, 4000), hit_rate=0.45, partial_rate=0.1, lost_kind="expired", rules_rate=0.2,
        system_share=0.15, tools_share=0.0, diverged_reasons=(("messages_changed", 0.8), ("system_changed", 0.2)),
    ),
    # A timestamp in the system prompt: cold misses unless the hoisting rule is on.
    TenantProfile(
        name="umbrella-timestamps", weight=0.12, models=("llama-3.1-8b-instruct",), num_prefixes=15,
        prefix_tokens=(1000, 2000), hit_rate=0.08, partial_rate=0.5, lost_kind="cold", rules_rate=0.1,
        system_share=1.0, tools_share=0.0, diverged_reasons=(("volatile_value", 1.0),),
        cold_reasons=(("volatile_value", 0.85), ("new_prefix", 0.15)),
    ),
    # Batch jobs on a hosted API that does not report cached tokens.
    TenantProfile(
        name="hooli-batch", weight=0.08, models=("gpt-4o-mini",), num_prefixes=30, prefix_tokens=(500, 1500),
        hit_rate=0.6, partial_rate=0.1, lost_kind="expired", rules_rate=0.0, system_share=0.5, tools_share=0.0,
        diverged_reasons=(("messages_changed", 1.0),),
    ),
)
# fmt: on


def prefix_tokens_of(profile: TenantProfile, prefix_index: int) -> int:
    """The length of one of a tenant's shared prefixes: fixed per prefix, page-aligned."""
    return random.Random(f"{profile.name}/prefix/{prefix_index}").randint(*profile.prefix_tokens) // 16 * 16


@dataclass(frozen=True)
class Outcome:
    """What the cache did with one request, and the explanation the gateway would record."""

    cached_tokens: int
    miss_kind: str
    diverged_at_token: int | None
    reason: str
    # Token index where the prompt first differed from its shared prefix (None: it did not).
    divergence_token: int | None = None
    segment: str | None = None
    char_offset: int | None = None
    recomputed_tokens: int = 0
    # Which recurring variant (a tool order, a schema version) the prompt carried, when it is one.
    variant: int | None = None

    def record_fields(self) -> dict[str, Any]:
        """The `RequestRecord` fields this outcome fills."""
        return {
            "cached_tokens": self.cached_tokens,
            "miss_kind": self.miss_kind,
            "diverged_at_token": self.diverged_at_token,
            "miss_reason": self.reason,
            "divergence_segment": self.segment,
            "divergence_char_offset": self.char_offset,
            "recomputed_tokens": self.recomputed_tokens,
        }


def _pick(rng: random.Random, weighted: tuple[tuple[str, float], ...]) -> str:
    return rng.choices([name for name, _ in weighted], weights=[weight for _, weight in weighted])[0]


def _divergence(rng: random.Random, profile: TenantProfile, prefix_tokens: int, reason: str) -> tuple[int, str, int]:
    """`(token, segment, char offset in the segment)` of a divergence of this kind inside the shared prefix."""
    system = int(prefix_tokens * profile.system_share)
    tools = int(prefix_tokens * profile.tools_share)
    if reason == "volatile_value":
        # A date or request id near the top of the system prompt.
        start, length, segment = 0, min(system, 40), "system"
    elif reason == "system_changed":
        start, length, segment = 0, system, "system"
    elif reason in ("reordered", "tools_changed"):
        start, length, segment = system, tools, "tools"
    else:
        start, length, segment = system + tools, prefix_tokens - system - tools, f"messages[{rng.randint(1, 6)}]"
    within = rng.randrange(max(1, length))
    return start + within, segment, within * CHARS_PER_TOKEN + rng.randrange(CHARS_PER_TOKEN)


def _diverged(
    rng: random.Random, profile: TenantProfile, prefix_key: str, prefix_tokens: int, reason: str, miss_kind: str
) -> Outcome:
    variants = _RECURRING_VARIANTS.get(reason)
    variant = rng.randrange(variants) if variants else None
    # A recurring variant always diverges at the same place (the same tool moved, the same field changed).
    source = rng if variant is None else random.Random(f"{prefix_key}/{reason}/{variant}")
    token, segment, char_offset = _divergence(source, profile, prefix_tokens, reason)
    cached = token // PAGE_TOKENS * PAGE_TOKENS
    return Outcome(
        cached_tokens=cached,
        miss_kind=miss_kind if cached == 0 else "partial",
        diverged_at_token=token,
        reason=reason,
        divergence_token=token,
        segment=segment,
        char_offset=char_offset,
        recomputed_tokens=prefix_tokens - cached,
        variant=variant,
    )


def cache_outcome(
    rng: random.Random, profile: TenantProfile, prefix_key: str, prefix_tokens: int, prompt_tokens: int, hoisted: bool
) -> Outcome:
    """How the cache served a request whose upstream reports cached tokens."""
    if rng.random() < profile.hit_rate or hoisted:
        if rng.random() < 0.04:
            # An exact repeat (a retry): all but the last token, page-aligned, comes from cache.
            return Outcome((prompt_tokens - 1) // PAGE_TOKENS * PAGE_TOKENS, "hit", None, "hit")
        if rng.random() < profile.partial_rate and not hoisted:
            # Diverged inside the shared prefix (a reordered tool, a changed date): only its start was reused.
            reason = _pick(rng, profile.diverged_reasons)
            return _diverged(rng, profile, prefix_key, prefix_tokens, reason, "cold")
        # The usual reuse: the shared prefix from cache, the new turn prefilled.
        return Outcome(prefix_tokens, "partial", prefix_tokens, "hit")
    if rng.random() < 0.7 and profile.lost_kind != "cold":
        # Evicted or expired: perhaps the first pages are still cached.
        keeps_start = rng.random() < 0.3
        cached = rng.randint(1, max(1, prefix_tokens // 32)) * PAGE_TOKENS if keeps_start else 0
        kind = profile.lost_kind
        return Outcome(cached, kind, cached, kind, recomputed_tokens=prefix_tokens - cached)
    reason = _pick(rng, profile.cold_reasons)
    if reason == "volatile_value":
        return _diverged(rng, profile, prefix_key, prefix_tokens, reason, "cold")
    # A new prefix recomputes nothing that was cached; a switched model recomputes the whole prefix.
    recomputed = prefix_tokens if reason == "model_changed" else 0
    return Outcome(0, "cold", 0, reason, recomputed_tokens=recomputed)


def normalization_gain(rng: random.Random, profile: TenantProfile, outcome: Outcome, rules: tuple[str, ...]) -> int:
    """Tokens a dry run of the un-normalized request would have missed that the normalized one hit."""
    if outcome.reason != "hit" or not rules:
        return 0
    if "hoist_volatile" in rules:
        return max(0, outcome.cached_tokens - PAGE_TOKENS)  # the raw prompt differs at its top
    if profile.tools_share and ("tool_order" in rules or "tool_schema_key_order" in rules):
        tools_start = int(outcome.cached_tokens * profile.system_share)
        return (outcome.cached_tokens - tools_start) // PAGE_TOKENS * PAGE_TOKENS if rng.random() < 0.6 else 0
    if rng.random() < 0.1:  # newline normalization now and then saves a tail
        return rng.randint(1, max(1, outcome.cached_tokens // PAGE_TOKENS)) * PAGE_TOKENS
    return 0


class ChainBuilder:
    """Block hash chains for demo requests: one recurring chain per shared prefix (and per recurring variant of it),
    fresh random blocks for everything that never recurs (new turns, volatile values, edited messages)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(f"chains/{seed}")
        self._seed = seed
        self._recurring: dict[str, list[int]] = {}

    def _blocks(self, key: str, count: int) -> list[int]:
        blocks = self._recurring.get(key)
        if blocks is None or len(blocks) < count:
            source = random.Random(f"{self._seed}/{key}")
            blocks = self._recurring[key] = [source.getrandbits(63) for _ in range(count)]
        return blocks[:count]

    def chain(
        self, prefix_key: str, prefix_tokens: int, prompt_tokens: int, outcome: Outcome, approximate: bool
    ) -> RequestChain:
        """The chain of a prompt that starts with `prefix_key`'s prefix, up to its divergence if it diverged."""
        num_blocks = prompt_tokens // PAGE_TOKENS
        prefix_blocks = min(prefix_tokens // PAGE_TOKENS, num_blocks)
        if outcome.divergence_token is None:
            hash_ids = self._blocks(prefix_key, prefix_blocks)
        else:
            shared = min(outcome.divergence_token // PAGE_TOKENS, prefix_blocks)
            hash_ids = self._blocks(prefix_key, shared)
            if outcome.variant is not None:
                # The variant's own continuation, the same every time it comes back.
                tail_key = f"{prefix_key}/{outcome.reason}/{outcome.variant}"
                hash_ids = hash_ids + self._blocks(tail_key, prefix_blocks)[shared:]
        hash_ids = hash_ids + [self._rng.getrandbits(63) for _ in range(num_blocks - len(hash_ids))]
        return RequestChain(PAGE_TOKENS, prompt_tokens, tuple(hash_ids), approximate=approximate)
