"""The routing decision, as a pure function of what is known about each healthy replica.

`cache_aware` follows SGLang's router (sgl-router, cache-aware policy): when the load is imbalanced (the gap between
the most and least loaded replica exceeds `balance_abs_threshold` and the most loaded carries more than
`balance_rel_threshold` times the least) or the best predicted match is below `min_match_share` of the prompt, the
least loaded replica wins (ties: the one whose index holds the fewest blocks, i.e. the most free cache); otherwise
the highest `matched blocks - load_penalty_blocks * in-flight requests` wins (ties: lower load, then fewer blocks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.config.router import RouterSettings


@dataclass(frozen=True, slots=True)
class Candidate:
    """One healthy replica: its position in the set, in-flight requests, predicted match and index size."""

    position: int
    load: int
    matched_blocks: float = 0.0  # blocks of 16 tokens, weighted by the tier holding them
    matched_tokens: int = 0
    indexed_blocks: int = 0


@dataclass(frozen=True, slots=True)
class Choice:
    position: int
    reason: str  # cache | load | balance | round_robin | least_loaded


def least_loaded(candidates: Sequence[Candidate], turn: int) -> Candidate:
    """Fewest in-flight requests; ties rotate with `turn` so equal replicas share the work."""
    lowest = min(c.load for c in candidates)
    tied = [c for c in candidates if c.load == lowest]
    return tied[turn % len(tied)]


def choose(
    policy: str, candidates: Sequence[Candidate], settings: RouterSettings, turn: int, prompt_tokens: int
) -> Choice:
    """Pick among `candidates` (non-empty). `turn` counts requests (round robin); `prompt_tokens` is the prompt's
    (estimated) length, for the minimum match share."""
    if not candidates:
        raise ValueError("no candidate replica")
    if policy == "round_robin":
        return Choice(candidates[turn % len(candidates)].position, "round_robin")
    if policy == "least_loaded":
        return Choice(least_loaded(candidates, turn).position, "least_loaded")
    loads = [c.load for c in candidates]
    gap = max(loads) - min(loads)
    if gap > settings.balance_abs_threshold and max(loads) > min(loads) * settings.balance_rel_threshold:
        return Choice(_emptiest_of_least_loaded(candidates).position, "balance")
    best = max(candidates, key=lambda c: (c.matched_blocks - settings.load_penalty_blocks * c.load, -c.load,
                                          -c.indexed_blocks, -c.position))
    if best.matched_tokens <= 0 or best.matched_tokens < settings.min_match_share * prompt_tokens:
        return Choice(_emptiest_of_least_loaded(candidates).position, "load")
    return Choice(best.position, "cache")


def _emptiest_of_least_loaded(candidates: Sequence[Candidate]) -> Candidate:
    return min(candidates, key=lambda c: (c.load, c.indexed_blocks, c.position))
