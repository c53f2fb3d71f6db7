"""One reason per request: what the engine reported, read against how the prompt differs from the nearest earlier one.

Pure functions over small values; `classify` is deterministic. The rules, in order:

1. The engine matched everything it could (`hit`): `hit` when at most the last token was computed, `below_page` when
   a tail shorter than one cache page was left (matches are page-aligned).
2. The engine found the next part of the prompt in its ghost index: `evicted` or `expired`.
3. Nothing earlier shares even the model or the first segments: `new_prefix`.
4. The prompt only adds to what was sent before: it equals, extends or is a prefix of the nearest earlier request,
   or its first difference lies in the final turn (the trailing user and tool messages, new in this call, such as a
   new question under the same system prompt). That is the ideal case, `hit`, however much the engine prefilled for
   the new part. Two exceptions: when nothing but the model was shared the prompt is new (`new_prefix`), and when
   the engine matched nothing of a prefix it had answered before (or only part of an identical prompt) the cached
   prefix was dropped without a trace in the ghost index (a flush, a restart, a ghost entry forgotten): `evicted`.
5. Otherwise the first difference lies in an earlier segment: `model_changed` for the model; `reordered` when the
   segment holds the same content in another order (tool order, key order) or was swapped with another segment;
   `volatile_value` when only dates, ids or numbers differ; `new_prefix` when the very first segment after the
   model differs and the two texts are unlike each other; else `tools_changed`, `system_changed` or
   `messages_changed` (a completions prompt counts as messages).

`recomputed_tokens` is 0 for `hit` and `prompt_tokens - matched_tokens` otherwise (None when either is unknown).
"""

from __future__ import annotations

from dataclasses import dataclass

from db.records import MISS_REASONS
from gateway.explain.segments import MODEL, SYSTEM, TOOLS
from gateway.upstreams.base import CacheReport

HIT = "hit"
MODEL_CHANGED = "model_changed"
TOOLS_CHANGED = "tools_changed"
SYSTEM_CHANGED = "system_changed"
MESSAGES_CHANGED = "messages_changed"
VOLATILE_VALUE = "volatile_value"
REORDERED = "reordered"
NEW_PREFIX = "new_prefix"
EVICTED = "evicted"
EXPIRED = "expired"
BELOW_PAGE = "below_page"
ANSWER_REWRITTEN = "answer_rewritten"
ROUTED_AWAY = "routed_away"
CACHE_SCOPE = "cache_scope"
REASONS = MISS_REASONS  # declared with the record's fields; the names above are its members

# How a prompt relates to the nearest earlier one.
UNSEEN = "unseen"  # no earlier request shares anything
SAME = "same"  # every segment equal
EXTENDS = "extends"  # the earlier request's segments are a prefix of this one's
PREFIX = "prefix"  # this request's segments are a prefix of the earlier one's
DIVERGED = "diverged"  # a segment differs


@dataclass(frozen=True, slots=True)
class Divergence:
    """How a prompt differs from the nearest earlier request (see `gateway.explain.compare`).

    `segment` / `segment_kind` / `char_offset` locate the first difference (for `DIVERGED`); `shared_segments` counts
    the equal leading segments after the model; `in_final_turn` says the difference lies in the new turn; the flags
    say what kind of difference it is.
    """

    relation: str
    segment: str | None = None
    segment_kind: str | None = None
    char_offset: int | None = None
    shared_segments: int = 0
    in_final_turn: bool = False
    reordered: bool = False
    volatile: bool = False
    similar: bool = True


@dataclass(frozen=True, slots=True)
class Explanation:
    """The recorded explanation: one of `REASONS`, where the prompt diverged, and the tokens that cost."""

    reason: str
    segment: str | None = None
    char_offset: int | None = None
    recomputed_tokens: int | None = None
    # How the divergence was located: `engine` (the engine's own report of where its match ended) or `history` (an
    # approximation from the nearest earlier request, for upstreams that do not report it).
    source: str = "history"


def _uncached(engine: CacheReport) -> int | None:
    if engine.matched_tokens is None or engine.prompt_tokens is None:
        return None
    return max(0, engine.prompt_tokens - engine.matched_tokens)


def engine_hit(engine: CacheReport) -> bool:
    if engine.miss_kind is not None:
        return engine.miss_kind == HIT
    uncached = _uncached(engine)
    return uncached is not None and uncached <= 1


def classify(engine: CacheReport, divergence: Divergence) -> Explanation:
    """The reason for one answered request (see the module docstring for the rules)."""
    uncached = _uncached(engine)
    if engine_hit(engine):
        if uncached is not None and uncached > 1:
            return Explanation(BELOW_PAGE, recomputed_tokens=uncached)
        return Explanation(HIT, recomputed_tokens=0)
    if engine.miss_kind in (EVICTED, EXPIRED):
        return Explanation(engine.miss_kind, recomputed_tokens=uncached)
    relation = divergence.relation
    if relation == UNSEEN:
        return Explanation(NEW_PREFIX, recomputed_tokens=uncached)
    only_adds = relation in (SAME, EXTENDS, PREFIX) or divergence.in_final_turn
    if only_adds:
        if divergence.shared_segments == 0:
            return Explanation(NEW_PREFIX, recomputed_tokens=uncached)
        if engine.matched_tokens == 0 or (relation == SAME and engine.miss_kind is not None):
            return Explanation(EVICTED, recomputed_tokens=uncached)
        return Explanation(HIT, recomputed_tokens=0)
    located = (divergence.segment, divergence.char_offset)
    kind = divergence.segment_kind
    if kind == MODEL:
        reason = MODEL_CHANGED
    elif divergence.reordered:
        reason = REORDERED
    elif divergence.volatile:
        reason = VOLATILE_VALUE
    elif divergence.shared_segments == 0 and not divergence.similar:
        return Explanation(NEW_PREFIX, recomputed_tokens=uncached)
    elif kind == TOOLS:
        reason = TOOLS_CHANGED
    elif kind == SYSTEM:
        reason = SYSTEM_CHANGED
    else:
        reason = MESSAGES_CHANGED
    return Explanation(reason, *located, recomputed_tokens=uncached)
