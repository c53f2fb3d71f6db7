"""A request's token ledger (`db.ledger.TokenLedger`) from the engine's own report, the conversation the request
belongs to, the explanation and the routing.

The numbers come from the engine: `P` prompt tokens, `M` matched (cached) tokens, the page size and `seen_tokens`,
the longest prefix an earlier request in the namespace computed. The explanation only says why content differs.

- `R` (reusable): `max(seen_tokens, M)`; for a conversation's later turn whose content changed before the parent's
  answer, its parent's prompt and answer as re-sent count as sent before: `R` reaches the first token of the first
  segment the parent had not sent (`ConversationLink.new_from_segment`); when the previous answer was re-sent
  differently (the conversation's `answer_rewrite`, or the explanation `answer_rewritten`), `R` reaches at least the
  segment after it; when a segment's content changed (a content cause: edited, reordered, a volatile value), the
  segments after it that the nearest earlier request had sent at the same place count as sent before
  (`sent_before_segment`, the first one it had not). `R <= P`.
- new = `P - R`, plus the tokens of a changed segment that its earlier version did not have (between the two texts'
  common start and end: a paragraph inserted, a prompt grown), which the content cause would otherwise hold.
- `C = page_floor(min(R, P - 1))`: the most that could have been matched. `R - C` is lost to `page_alignment`, which
  holds both page alignment and the last-token rule (the prompt's last token is always computed, for its logits):
  with page size 1, `R - C` is at most that one token (when `R = P`). People read it as `page alignment / last token`
  (`db.ledger.cause_label`). When the content changed where the tokens computed before end (a content cause, an
  answer rewritten), `C` reaches at least that point (`min(seen_tokens, R, P - 1)`): the page the change broke would
  have matched without it. When the previous answer was re-sent shorter (truncated, its reasoning stripped),
  `C = min(R, P - 1)`: the answer as returned went on, so no page there was cut by the page size.
- `C - M` is lost to one cause: `evicted` / `expired` when the engine's ghost index says so; `routed_away` when
  another replica was predicted to hold more than this one matched (the router's prediction, or the conversation's
  previous turn answered on another replica: `Routing.with_previous_turn`); else the explanation's reason when it is
  a cause (content changed, reordered, volatile value, model changed, answer rewritten); `page_alignment` when the
  engine matched all it could (`hit`, `below_page`: what it never computed, such as an answer's last token, sampled
  but never fed back, so its KV was never computed); else `evicted` (computed before, gone without a trace).

An upstream that reports no cached tokens gets `unknown = P` and nothing else; one that reports cached tokens but no
engine detail (vLLM, SGLang, hosted APIs) gets `cached = M`, `unknown = P - M`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from db.ledger import LOST_CAUSES, TokenLedger
from gateway.conversations.link import ConversationLink
from gateway.explain.segments import first_difference
from gateway.explain.reasons import (
    ANSWER_REWRITTEN,
    BELOW_PAGE,
    CACHE_SCOPE,
    EVICTED,
    EXPIRED,
    HIT,
    ROUTED_AWAY,
    Explanation,
)
from gateway.upstreams.base import CacheReport
from gateway.upstreams.tiers import TierSplit

PAGE_ALIGNMENT = "page_alignment"
# Causes that mean the content differs from what was sent before: the tokens after the change that the earlier request
# had sent were computed again because of it.
CONTENT_CAUSES = ("system_changed", "tools_changed", "messages_changed", "reordered", "volatile_value")
# Causes that changed the content where the tokens computed before end (the engine's `seen_tokens`).
REWRITE_CAUSES = (*CONTENT_CAUSES, ANSWER_REWRITTEN)
# Answer rewrites that re-send less than was returned (`db.ledger.ANSWER_REWRITES`).
SHORTENING_REWRITES = ("truncated", "reasoning_stripped")


@dataclass(frozen=True, slots=True)
class Routing:
    """What the router predicted: cached tokens on the chosen replica and on the best other one (None: unknown, or
    no other replica)."""

    predicted_tokens: int | None = None
    best_other_tokens: int | None = None

    def with_previous_turn(self, link: ConversationLink | None, replica: str | None) -> Routing:
        """This routing, with the conversation's previous turn counted as a prediction: when this turn re-sends all
        of it (it extends its parent, answer unchanged) and another replica of the set answered the parent, that
        replica holds the parent's prompt and answer (`parent_computed_tokens`), whatever the router predicted (a
        round robin predicts nothing)."""
        if link is None or replica is None or link.parent_replica in (None, replica):
            return self
        if link.new_from_segment is None or link.answer_rewrite is not None or not link.parent_computed_tokens:
            return self
        return replace(self, best_other_tokens=max(self.best_other_tokens or 0, link.parent_computed_tokens))


def unexplained_ledger(prompt: int | None, cached: int | None, tiers: TierSplit | None = None) -> TokenLedger | None:
    """The ledger of a request without engine detail: None without a prompt count; `unknown = P` without a cached
    count; else `cached = M` (by tier when known) and `unknown = P - M`."""
    if prompt is None or prompt < 0:
        return None
    if cached is None:
        return TokenLedger(prompt, unknown_tokens=prompt)
    cached = min(max(cached, 0), prompt)
    return TokenLedger(prompt, cached, _by_tier(tiers, cached), unknown_tokens=prompt - cached)


def explained_fields(
    explained: Any, report: CacheReport, prompt: int | None, cached: int | None, tiers: TierSplit | None
) -> dict[str, Any]:
    """The record fields of the explained stage (`explained.record_fields(report)`, None: no explainer), under a
    plain ledger (`unexplained_ledger`) for a request the explainer gave none: every request with a prompt count has
    a ledger that adds up."""
    ledger = unexplained_ledger(prompt, cached, tiers)
    fields = {} if ledger is None else ledger.record_fields()
    fields.update({} if explained is None else explained.record_fields(report))
    return fields


def _by_tier(tiers: TierSplit | None, cached: int) -> dict[str, int] | None:
    if tiers is None:
        return None
    split = {"device": tiers.device_tokens, "host": tiers.host_tokens, "disk": tiers.disk_tokens}
    return split if sum(split.values()) == cached and min(split.values()) >= 0 else None


def _segment_start(engine: CacheReport, name: str | None, after: bool) -> int | None:
    """The first token of segment `name` (or, `after`, of the segment that follows it) per the engine."""
    starts = engine.segment_starts or ()
    for position, (segment, start) in enumerate(starts):
        if segment == name:
            if not after:
                return start
            return starts[position + 1][1] if position + 1 < len(starts) else engine.prompt_tokens
    return None


def reusable_tokens(
    engine: CacheReport,
    explanation: Explanation | None,
    link: ConversationLink | None,
    segment_names: Sequence[str] | None = None,
    sent_before_segment: int | None = None,
) -> int:
    """`R` (see the module docstring), clamped to `[M, P]`; the engine's prompt and matched tokens must be known.
    `segment_names`: the request's segments (`gateway.explain.segments`), which `new_from_segment` and
    `sent_before_segment` index."""
    prompt, matched = engine.prompt_tokens or 0, engine.matched_tokens or 0
    reusable = max(engine.seen_tokens or 0, matched)
    names = segment_names or ()
    if explanation is not None and explanation.reason in CONTENT_CAUSES and sent_before_segment is not None:
        if sent_before_segment >= len(names):
            reusable = prompt
        elif (start := _segment_start(engine, names[sent_before_segment], after=False)) is not None:
            reusable = max(reusable, start)
    if link is not None and link.parent_request_id is not None and link.new_from_segment is not None:
        if 0 < link.new_from_segment < len(names):
            start = _segment_start(engine, names[link.new_from_segment], after=False)
            answer = _segment_start(engine, names[link.new_from_segment - 1], after=False)
            # What was computed before reached the parent's last segment (its answer): the engine's count stands (the
            # template between the answer and the new turn was never computed); else the content changed before it.
            if start is not None and (answer is None or reusable < answer):
                reusable = max(reusable, start)
    rewritten = link.answer_rewrite.segment if link is not None and link.answer_rewrite is not None else None
    if rewritten is None and explanation is not None and explanation.reason == ANSWER_REWRITTEN:
        rewritten = explanation.segment
    if rewritten is not None:
        end = _segment_start(engine, rewritten, after=True)
        if end is not None:
            reusable = max(reusable, end)
    return min(max(reusable, matched), prompt)


def _cause(engine: CacheReport, explanation: Explanation | None, routing: Routing | None) -> str:
    if engine.miss_kind in (EVICTED, EXPIRED):
        return engine.miss_kind
    if routing is not None and routing.best_other_tokens is not None:
        here = routing.predicted_tokens or 0
        if routing.best_other_tokens > max(here, engine.matched_tokens or 0):
            return ROUTED_AWAY
    if explanation is not None and explanation.reason in LOST_CAUSES:
        return explanation.reason
    if explanation is not None and explanation.reason in (HIT, BELOW_PAGE):
        return PAGE_ALIGNMENT
    return EVICTED  # computed before in this namespace, gone without a trace in the ghost index


def token_ledger(
    engine: CacheReport,
    explanation: Explanation | None = None,
    *,
    tiers: TierSplit | None = None,
    conversation: ConversationLink | None = None,
    routing: Routing | None = None,
    segment_names: Sequence[str] | None = None,
    sent_before_segment: int | None = None,
    unsent_tokens: int = 0,
) -> TokenLedger | None:
    """The request's ledger (see the module docstring); None when the prompt token count is unknown. `tiers` is the
    matched tokens' split (the body's, else the report's); `segment_names` the request's segments;
    `sent_before_segment` (`sent_before_segment`) the first of them the nearest earlier request had not sent;
    `unsent_tokens` (`changed_segment_unsent`) the changed segment's tokens its earlier version did not have, new
    rather than lost to the change."""
    prompt, matched = engine.prompt_tokens, engine.matched_tokens
    tiers = tiers if tiers is not None else engine.tiers
    if prompt is None or matched is None or engine.page_size is None or engine.seen_tokens is None:
        return unexplained_ledger(prompt, matched, tiers)
    matched = min(max(matched, 0), prompt)
    engine_view = engine if engine.matched_tokens == matched else replace(engine, matched_tokens=matched)
    reusable = reusable_tokens(engine_view, explanation, conversation, segment_names, sent_before_segment)
    page = max(engine.page_size, 1)
    could = min(reusable, max(prompt - 1, 0))
    could -= could % page
    could = max(could, matched)  # a match the engine made is never more than it could
    lost: dict[str, int] = {}
    if explanation is not None and explanation.reason in REWRITE_CAUSES:
        # The content changed where the tokens computed before end: the page it breaks would have matched had it
        # not (an answer re-sent truncated leaves nothing sent before after it).
        could = max(could, min(engine.seen_tokens, reusable, max(prompt - 1, 0)))
    rewrite = conversation.answer_rewrite if conversation is not None else None
    if rewrite is not None and rewrite.kind in SHORTENING_REWRITES and explanation is not None \
            and explanation.reason == ANSWER_REWRITTEN:
        # The answer as returned went on past its re-sent end: the page there would have matched without the cut.
        could = max(could, min(reusable, max(prompt - 1, 0)))
    if reusable - could > 0:
        lost[PAGE_ALIGNMENT] = reusable - could
    new = prompt - reusable
    if could - matched > 0:
        cause = _cause(engine, explanation, routing)
        lost[cause] = lost.get(cause, 0) + could - matched
        if explanation is not None and cause == explanation.reason and cause in CONTENT_CAUSES and unsent_tokens > 0:
            moved = min(unsent_tokens, lost[cause])
            lost[cause] -= moved
            new += moved
            if not lost[cause]:
                del lost[cause]
    return TokenLedger(prompt, matched, _by_tier(tiers, matched), new, lost)


def changed_segment_unsent(engine: CacheReport, name: str, current_text: str, earlier_text: str) -> int:
    """Of segment `name`, changed since the earlier request (its text now and then), the tokens the earlier version
    did not have: of the tokens from where the engine's computed tokens end (`seen_tokens`, at `seen_char_offset`) to
    the segment's end, the share of those characters that lie between the two texts' common start and common end (a
    paragraph inserted or appended, a value replaced); 0 when the engine does not place the segment or the
    divergence outside it. An estimate within the template tokens between the segment's text and the next segment
    (the engine places segments by their first token)."""
    start, end = _segment_start(engine, name, after=False), _segment_start(engine, name, after=True)
    seen = engine.seen_tokens
    if start is None or end is None or seen is None or not start <= seen < end:
        return 0
    prefix = first_difference(current_text, earlier_text)
    # The tail starts where the engine's computed tokens end: a token can straddle the texts' first difference.
    tail_from = engine.seen_char_offset if engine.seen_segment == name and engine.seen_char_offset is not None \
        else prefix
    tail_from = min(tail_from, prefix)
    tail_chars = len(current_text) - tail_from
    if tail_chars <= 0:
        return 0
    limit = min(len(current_text), len(earlier_text)) - prefix
    suffix = 0
    while suffix < limit and current_text[-1 - suffix] == earlier_text[-1 - suffix]:
        suffix += 1
    return round((end - seen) * (len(current_text) - suffix - prefix) / tail_chars)


def withheld_by_api(ledger: TokenLedger, withheld: int, tiers: TierSplit | None) -> TokenLedger:
    """`ledger` (made on the engine's match) with `withheld` of its cached tokens not reported as read by the API the
    client speaks, lost to `cache_scope`: the Messages API reads only up to a cache breakpoint at or past the
    model's minimum cacheable length, whatever the engine matched. `tiers` splits the tokens the API did read."""
    withheld = min(max(withheld, 0), ledger.cached_tokens or 0)
    if not withheld:
        return ledger
    lost = dict(ledger.lost)
    lost[CACHE_SCOPE] = lost.get(CACHE_SCOPE, 0) + withheld
    cached = (ledger.cached_tokens or 0) - withheld
    return replace(ledger, cached_tokens=cached, cached_by_tier=_by_tier(tiers, cached), lost=lost)


def evicted_tier(engine: CacheReport, ledger: TokenLedger | None) -> str | None:
    """The tier the evicted or expired tokens were last held in, when the ledger lost any to eviction or expiry."""
    if ledger is None or not (ledger.lost.get(EVICTED) or ledger.lost.get(EXPIRED)):
        return None
    return engine.dropped_tier


def first_changed_segment(current: Sequence[int], earlier: Sequence[int]) -> int | None:
    """The index of the first segment where `current` and `earlier` (segment digests) differ; None when one only
    extends the other."""
    return next((i for i, (a, b) in enumerate(zip(current, earlier)) if a != b), None)


def sent_before_segment(current: Sequence[int], earlier: Sequence[int]) -> int | None:
    """The index of the first segment of `current` that `earlier` had not sent at the same place, looking past the
    first segment where they differ (segment digests, `gateway.explain.segments`); None when `current` differs
    nowhere within `earlier` (it only adds to it)."""
    shared = len(earlier)
    first = first_changed_segment(current, earlier)
    if first is None:
        return None
    index = first + 1
    while index < min(len(current), shared) and current[index] == earlier[index]:
        index += 1
    return index
