"""Explaining a request from where the engine says its match ended; the tenant's history only says why.

An engine that reports the divergence (`CacheReport.divergence_segment` / `divergence_char_offset`, and the count of
leading tokens its template always produces) has located the first uncached token exactly, and where the tokens an
earlier request computed end (`seen_segment` / `seen_char_offset`). The recorded segment and offset are the engine's:
where the prompt diverged from what was computed before when the content decides the reason (a hit's new turn, an
edit, an answer re-sent differently, a shared opening shorter than a page), where the match ended when nothing could be
served (an eviction, a cold miss at `system` offset 0). The reason comes from the earlier requests that shared
everything before that segment:

1. The engine matched everything it could: `hit`, or `below_page` when a tail shorter than a page was left.
2. `evicted` / `expired` when the engine's ghost index says so.
3. The match reused part of the request (beyond the template's fixed opening):
   - a named conversation whose previous turn sent another segment there (a compacted history): compared with that
     turn, never a new turn;
   - it ended in the final turn (the trailing user and tool messages), or after every segment of an earlier request
     that this one extends: the prompt only adds to what was cached, `hit`;
   - else, compared with the remembered request that shares the segments before the divergence and most of the
     diverging segment's text: `reordered` (same content in another key, tool or segment order), `volatile_value`
     (only dates, ids or numbers differ), else `tools_changed` / `system_changed` / `messages_changed` by segment.
     The same segment text sent before but not matched: `evicted` (dropped without a trace in the ghost index).
     Never `new_prefix`: part of the prompt was cached.
   A page-aligned match may end a segment or more before the content differs: when the engine says where the tokens
   computed before end (`seen_segment`, `seen_char_offset`), that is the location and the segment compared. Before all
   of these: the previous answer re-sent differently (`answer_rewritten`), when the conversation says so (at the
   rewrite's segment and offset) or when the tokens computed before end inside a message the earlier request did not
   send and the final turn does not hold (the answer it returned), unless the conversation compared that message
   with the answer and found it as returned (the engine's tokens of its answer are not those of its text encoded
   again: nothing the client did).
4. Nothing beyond the template's opening matched: when the engine says what was computed before and a page more
   could not have been matched from it (a shared opening shorter than a page), `below_page`; else the history method
   (`reasons.classify` on `compare`) decides, with a zero match: `new_prefix` when nothing earlier is like it (at the
   engine's location), `model_changed` (located at the model, by history: the engine cannot see another model's
   cache), else the reason with the engine's location.
"""

from __future__ import annotations

from dataclasses import replace

from gateway.conversations.link import ConversationLink
from gateway.explain.compare import compare, similar_texts
from gateway.explain.history import Entry, Nearest, TenantHistory
from gateway.explain.reasons import (
    ANSWER_REWRITTEN,
    BELOW_PAGE,
    EVICTED,
    EXPIRED,
    HIT,
    MESSAGES_CHANGED,
    MODEL_CHANGED,
    NEW_PREFIX,
    REORDERED,
    SYSTEM_CHANGED,
    TOOLS_CHANGED,
    VOLATILE_VALUE,
    Explanation,
    classify,
    engine_hit,
)
from gateway.explain.segments import (
    MESSAGE,
    SYSTEM,
    TOOLS,
    PromptSegments,
    first_difference,
    shape_digest,
    unordered_digest,
)
from gateway.upstreams.base import CacheReport

ENGINE = "engine"
HISTORY = "history"
# How many remembered requests sharing the leading segments are compared at most (newest first).
MAX_CANDIDATES = 64


def engine_locates(engine: CacheReport) -> bool:
    """Whether the engine reported its template opening, i.e. it locates divergences itself."""
    return engine.template_tokens is not None


def _uncached(engine: CacheReport) -> int | None:
    if engine.matched_tokens is None or engine.prompt_tokens is None:
        return None
    return max(0, engine.prompt_tokens - engine.matched_tokens)


def _reason_by_kind(segment_name: str) -> str:
    if segment_name == TOOLS:
        return TOOLS_CHANGED
    if segment_name == SYSTEM:
        return SYSTEM_CHANGED
    return MESSAGES_CHANGED


def _closest_earlier(current: PromptSegments, index: int, history: TenantHistory) -> tuple[Entry, str] | None:
    """The remembered request sharing segments `[0, index)` whose segment `index` shares the longest start with the
    current one, with that segment's text."""
    text = current.segments[index].text
    best, best_shared, seen = None, -1, set()
    for count, entry in enumerate(history.sharing(current, index)):
        if count >= MAX_CANDIDATES:
            break
        if len(entry.digests) <= index or entry.kinds[index] != current.segments[index].kind:
            continue
        digest = entry.digests[index]
        earlier = history.text(digest) if digest not in seen else None
        seen.add(digest)
        if earlier is None:
            continue
        shared = first_difference(text, earlier)
        if shared > best_shared:
            best, best_shared = (entry, earlier), shared
    return best


def _similar_earlier(current: PromptSegments, index: int, history: TenantHistory) -> tuple[Entry, str] | None:
    """The newest remembered request sharing segments `[0, index)` whose segment `index` reads as a version of the
    current one (`similar_texts`: a line prepended, an edit at both ends), with that segment's text."""
    text = current.segments[index].text
    seen: set[str] = set()
    for count, entry in enumerate(history.sharing(current, index)):
        if count >= MAX_CANDIDATES:
            break
        if len(entry.digests) <= index or entry.kinds[index] != current.segments[index].kind:
            continue
        digest = entry.digests[index]
        if digest in seen:
            continue
        seen.add(digest)
        earlier = history.text(digest)
        if earlier is not None and similar_texts(text, earlier):
            return entry, earlier
    return None


def _why(
    current: PromptSegments, index: int, history: TenantHistory, found: tuple[Entry, str] | None = None
) -> str:
    segment = current.segments[index]
    if found is None:
        found = _closest_earlier(current, index, history)
    if found is None:
        return _reason_by_kind(segment.name)
    entry, earlier_text = found
    earlier_digest = entry.digests[index]
    if earlier_digest == segment.digest:
        return EVICTED  # the same text was sent before, yet the engine no longer had it: dropped without a trace
    ordered = unordered_digest(segment.kind, segment.text)
    swapped = segment.digest in entry.digests and earlier_digest in current.digests
    if swapped or (ordered is not None and ordered == unordered_digest(segment.kind, earlier_text)):
        return REORDERED
    if shape_digest(segment.text) == shape_digest(earlier_text):
        return VOLATILE_VALUE
    return _reason_by_kind(segment.name)


def explain_located(
    engine: CacheReport,
    current: PromptSegments,
    nearest: Nearest | None,
    history: TenantHistory,
    conversation: ConversationLink | None = None,
) -> Explanation:
    """The explanation of a request whose engine reported where its match ended (see the module docstring)."""
    uncached = _uncached(engine)
    # Where the engine's match ended: recorded when nothing of the prompt could be served (a cold miss at offset 0,
    # an eviction). Where the prompt diverged from what was computed before (`seen_segment`) is recorded when the
    # content decides: a page-aligned match ends up to a page, or segments, before it.
    location = (engine.divergence_segment, engine.divergence_char_offset)
    diverged = (engine.seen_segment, engine.seen_char_offset) if engine.seen_segment is not None else location
    if engine_hit(engine):
        if uncached is not None and uncached > 1:
            return Explanation(BELOW_PAGE, *diverged, recomputed_tokens=uncached, source=ENGINE)
        return Explanation(HIT, *diverged, recomputed_tokens=0, source=ENGINE)
    if engine.miss_kind in (EVICTED, EXPIRED):
        return Explanation(engine.miss_kind, *location, recomputed_tokens=uncached, source=ENGINE)
    names = [segment.name for segment in current.segments]
    index = names.index(engine.divergence_segment) if engine.divergence_segment in names else None
    rewritten = _answer_rewritten(engine, current, nearest, conversation, index)
    if rewritten is not None:
        return replace(rewritten, recomputed_tokens=uncached)
    reused = (engine.matched_tokens or 0) > (engine.template_tokens or 0)
    if reused:
        seen_index = names.index(engine.seen_segment) if engine.seen_segment in names else None
        if index is not None and seen_index is not None and seen_index >= index:
            index, location = seen_index, diverged
            if (engine.seen_char_offset or 0) >= len(current.segments[index].text) and index + 1 < len(names):
                index += 1  # the end of a segment: what differs is the next one
        if index is None:
            reason = _reason_by_kind(engine.divergence_segment or "")
        elif (resent := _resent_differently(current, index, history, conversation)) is not None:
            reason = _why(current, index, history, resent)
        elif index >= current.turn_start or _only_adds(nearest, index):
            return Explanation(HIT, *location, recomputed_tokens=0, source=ENGINE)
        else:
            reason = _why(current, index, history)
        return Explanation(reason, *location, recomputed_tokens=uncached, source=ENGINE)
    approximate = classify(replace(engine, matched_tokens=0), compare(current, nearest, history.text))
    if approximate.reason in (EVICTED, HIT, NEW_PREFIX) and _below_page(engine):
        return Explanation(BELOW_PAGE, *diverged, recomputed_tokens=uncached, source=ENGINE)
    if approximate.reason == NEW_PREFIX and index is not None:
        # The newest request may be unlike this one while an older one is a version of it (A, B edited at its end,
        # then A with a line prepended): the prompt is not new when any earlier one sharing its leading segments is.
        similar = _similar_earlier(current, index, history)
        if similar is not None:
            reason = _why(current, index, history, similar)
            return Explanation(reason, *location, recomputed_tokens=uncached, source=ENGINE)
    if approximate.reason == NEW_PREFIX:
        return Explanation(NEW_PREFIX, *location, recomputed_tokens=uncached, source=ENGINE)
    if approximate.reason == MODEL_CHANGED or engine.divergence_segment is None:
        # Another model's cache: what differs first is the model, which the engine cannot see.
        return replace(approximate, recomputed_tokens=uncached, source=HISTORY)
    return Explanation(approximate.reason, *location, recomputed_tokens=uncached, source=ENGINE)


def _resent_differently(
    current: PromptSegments, index: int, history: TenantHistory, conversation: ConversationLink | None
) -> tuple[Entry, str] | None:
    """The conversation's previous turn and its text at segment `index`, when that turn had sent another segment of
    the same kind there: the conversation changed what it re-sends (a compacted or edited history), which a
    divergence in the final turn must not hide as a new turn. None without a previous turn in the history, or when
    it sent nothing there."""
    parent = conversation.parent_request_id if conversation is not None else None
    if parent is None:
        return None
    segment = current.segments[index]
    for count, entry in enumerate(history.sharing(current, index)):
        if count >= MAX_CANDIDATES:
            break
        if entry.request_id != parent:
            continue
        if len(entry.digests) <= index or entry.kinds[index] != segment.kind or entry.digests[index] == segment.digest:
            return None
        earlier = history.text(entry.digests[index])
        return None if earlier is None else (entry, earlier)
    return None


def _equal_segments(nearest: Nearest | None) -> int:
    """Leading segments of the request equal to the nearest earlier one's, the model counted as equal when only it
    differs (called when the engine reused the cache: the other model name reached the same cache)."""
    if nearest is None:
        return 0
    return nearest.shared + (1 if nearest.other_model else 0)


def _only_adds(nearest: Nearest | None, index: int) -> bool:
    """Whether an earlier request's segments all lie before the divergence: this prompt only adds to it (what was
    cached past them is that request's answer)."""
    if nearest is None:
        return False
    equal = _equal_segments(nearest)
    return equal >= len(nearest.entry.digests) and index >= equal


def _below_page(engine: CacheReport) -> bool:
    """Whether the engine says something of the request beyond the template was computed before, yet less than a
    page more than it matched could be (matches are page-aligned and leave the last token out)."""
    seen, page, prompt = engine.seen_tokens, engine.page_size, engine.prompt_tokens
    if seen is None or page is None or prompt is None or seen <= (engine.template_tokens or 0):
        return False
    could = min(seen, max(prompt - 1, 0))
    return could - could % max(page, 1) <= (engine.matched_tokens or 0)


def _answer_rewritten(
    engine: CacheReport,
    current: PromptSegments,
    nearest: Nearest | None,
    conversation: ConversationLink | None,
    index: int | None,
) -> Explanation | None:
    """`answer_rewritten` where the previous answer, re-sent differently, ended the match (see the module
    docstring); None when it did not."""
    rewrite = conversation.answer_rewrite if conversation is not None else None
    if rewrite is not None:
        if index is not None and not rewrite.segment_index - 1 <= index <= rewrite.segment_index:
            return None  # the match ended past the rewritten answer (it cost nothing), or well before it
        if engine.seen_segment == rewrite.segment and engine.seen_char_offset is not None:
            # The engine's terms (an assistant's tool calls as its template renders them) over the gateway's.
            return Explanation(ANSWER_REWRITTEN, rewrite.segment, engine.seen_char_offset, source=ENGINE)
        return Explanation(ANSWER_REWRITTEN, rewrite.segment, rewrite.char_offset, source=HISTORY)
    names = [segment.name for segment in current.segments]
    seen_at = engine.seen_segment
    if seen_at not in names or not engine.seen_char_offset:
        return None
    position = names.index(seen_at)
    if conversation is not None and conversation.answer_as_returned and conversation.new_from_segment == position + 1:
        # The client re-sent the answer exactly as returned: the tokens computed before end inside it because the
        # engine's own tokens of its answer are not those of the same text encoded again, not because of the client.
        return None
    segment = current.segments[position]
    if segment.kind != MESSAGE or position >= current.turn_start:
        return None
    if nearest is not None and not len(nearest.entry.digests) <= _equal_segments(nearest) <= position:
        return None  # not the answer to the request this one extends
    if index is not None and index > position or engine.seen_char_offset >= len(segment.text):
        return None  # matched past it, or the tokens computed before end with its text: re-sent as returned
    return Explanation(ANSWER_REWRITTEN, seen_at, engine.seen_char_offset, source=ENGINE)
