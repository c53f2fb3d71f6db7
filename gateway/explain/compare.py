"""How a prompt differs from the nearest earlier request: the `Divergence` that `reasons.classify` reads.

Runs after the response, from the segments computed when the request was sent and the texts the tenant's history
still holds. Text comparisons (first differing character, masked shapes, key-order-free digests) are done only for
the one segment that differs.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.explain.history import Nearest
from gateway.explain.reasons import DIVERGED, EXTENDS, PREFIX, SAME, UNSEEN, Divergence
from gateway.explain.segments import (
    MODEL,
    PROMPT,
    PromptSegments,
    common_suffix,
    first_difference,
    shape_digest,
    unordered_digest,
)

# Two texts count as versions of each other when what they share at both ends covers half the shorter one.
SIMILAR_SHARE = 0.5


def similar_texts(a: str, b: str) -> bool:
    """Whether `b` looks like an edit of `a` (shared start and end cover at least half of the shorter text)."""
    shorter = min(len(a), len(b))
    if shorter == 0:
        return False
    start = first_difference(a, b)
    if start >= shorter:
        return True
    end = common_suffix(a[start:], b[start:])
    return start + end >= SIMILAR_SHARE * shorter


def compare(current: PromptSegments, nearest: Nearest | None, text_of: Callable[[int], str | None]) -> Divergence:
    """The relation of `current` to `nearest` and, when a segment differs, where and how."""
    if nearest is None:
        return Divergence(UNSEEN)
    entry = nearest.entry
    segments = current.segments
    if nearest.other_model:
        old_model = text_of(entry.digests[0])
        offset = None if old_model is None else first_difference(segments[0].text, old_model)
        return Divergence(DIVERGED, MODEL, MODEL, offset, shared_segments=nearest.shared)
    run = nearest.shared  # equal leading segments, the model included
    shared = max(0, run - 1)
    num_current, num_earlier = len(segments), len(entry.digests)
    if run >= num_current and run >= num_earlier:
        return Divergence(SAME, shared_segments=shared)
    if run >= num_earlier:
        return Divergence(EXTENDS, shared_segments=shared)
    if run >= num_current:
        return Divergence(PREFIX, shared_segments=shared)
    segment = segments[run]
    earlier_digest = entry.digests[run]
    earlier_text = text_of(earlier_digest)
    in_final_turn = run >= current.turn_start
    # Later segments in common (the same system prompt after new tools) make it a change, not a new prompt.
    # (The final turn does not count: a new question can repeat an old one.)
    shares_later = not set(current.digests[run + 1 : current.turn_start]).isdisjoint(entry.digests[run + 1 :])
    if entry.kinds[run] != segment.kind:
        # A segment appeared or went (tools added, a system prompt dropped): nothing inside it to compare.
        return Divergence(DIVERGED, segment.name, segment.kind, 0, shared, in_final_turn, similar=shares_later)
    if earlier_text is None:
        return Divergence(DIVERGED, segment.name, segment.kind, None, shared, in_final_turn)
    if segment.kind == PROMPT and run == num_earlier - 1 == num_current - 1:
        # A completions prompt that grew (or was cut) at its end shares everything the other one had.
        if segment.text.startswith(earlier_text):
            return Divergence(EXTENDS, shared_segments=shared + 1)
        if earlier_text.startswith(segment.text):
            return Divergence(PREFIX, shared_segments=shared + 1)
    offset = first_difference(segment.text, earlier_text)
    reordered = _reordered(segment.kind, segment.text, earlier_text) or _swapped(
        segment.digest, earlier_digest, current.digests, entry.digests
    )
    volatile = not reordered and shape_digest(segment.text) == shape_digest(earlier_text)
    similar = shared > 0 or reordered or volatile or shares_later or similar_texts(segment.text, earlier_text)
    return Divergence(DIVERGED, segment.name, segment.kind, offset, shared, in_final_turn, reordered, volatile, similar)


def _reordered(kind: str, text: str, earlier_text: str) -> bool:
    """The same JSON content in another key order (or, for tools, another tool order)."""
    digest = unordered_digest(kind, text)
    return digest is not None and digest == unordered_digest(kind, earlier_text)


def _swapped(digest: int, earlier_digest: int, digests: tuple[int, ...], earlier_digests: tuple[int, ...]) -> bool:
    """Each side's segment at the divergence appears elsewhere in the other request: segments moved."""
    return digest in earlier_digests and earlier_digest in digests
