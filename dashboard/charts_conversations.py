"""Plotly figures of the Conversations page: a conversation's waterfall (one stacked bar of prompt tokens per turn)
and the tokens lost by cause (pure functions, no Streamlit)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from dashboard.charts import TIER_COLORS
from db.ledger import LOST_CAUSES, cause_label
from db.queries.results_conversations import ConversationTurn, short_request_id

NEW_COLOR = "#457b9d"
UNKNOWN_COLOR = "#d9d9d9"
# One colour per cause of lost tokens, in `LOST_CAUSES` order: warm for content the client changed, dark for the
# cache dropping it, grey-blue for routing, alignment and scope.
LOST_COLORS = dict(
    zip(
        LOST_CAUSES,
        ("#e63946", "#f4a261", "#e76f51", "#d62828", "#f77f00", "#fcbf49", "#9d0208", "#6a040f", "#370617",
         "#5e548e", "#9f86c0", "#7b2cbf"),
        strict=True,
    )
)
# The waterfall's part name of each cause (`lost: <the cause as people read it>`) and back.
LOST_PARTS = {cause: f"lost: {cause_label(cause)}" for cause in LOST_CAUSES}
_CAUSE_OF_PART = {part: cause for cause, part in LOST_PARTS.items()}
# Markers above a turn's bar, lowest first: (trace name, plotly symbol).
MARKERS = (
    ("divergence", "x"),
    ("idle past TTL", "hourglass"),
    ("replica changed", "diamond"),
    ("answer rewritten", "star"),
)
HIT = "hit"  # the miss reason of a turn that lost nothing cacheable (`db.records.MISS_REASONS`)
_MARGIN = {"l": 10, "r": 10, "t": 40, "b": 10}


def turn_label(turn: ConversationTurn, position: int) -> str:
    """`turn 3` (the recorded index, else the position in time order from 1)."""
    return f"turn {turn.turn_index if turn.turn_index is not None else position + 1}"


def bar_labels(turns: Sequence[ConversationTurn]) -> list[str]:
    """One distinct x label per turn: `turn 3`, with the short request id added where two turns share an index (a
    retry or a fork: two `turn 2`)."""
    labels = [turn_label(turn, position) for position, turn in enumerate(turns)]
    counts = Counter(labels)
    return [f"{label} ({short_request_id(turn.request_id)})" if counts[label] > 1 else label
            for label, turn in zip(labels, turns, strict=True)]


def ledger_parts(turn: ConversationTurn) -> dict[str, int]:
    """The turn's prompt tokens by waterfall part, in stacking order: `cached (device|host|disk)` (or `cached (tier
    unknown)`), `new`, `lost: <cause>` (`LOST_PARTS`), `unknown`; parts without tokens are left out. They add up to the prompt
    tokens when the ledger does."""
    parts: dict[str, int] = {}
    if turn.cached_by_tier is not None:
        parts.update({f"cached ({tier})": tokens for tier, tokens in turn.cached_by_tier.items()})
    elif turn.cached_tokens is not None:
        parts["cached (tier unknown)"] = turn.cached_tokens
    if turn.new_tokens is not None:
        parts["new"] = turn.new_tokens
    lost = turn.lost or {}
    parts.update({LOST_PARTS.get(cause, f"lost: {cause}"): tokens for cause, tokens in lost.items()})
    if turn.unknown_tokens is not None:
        parts["unknown"] = turn.unknown_tokens
    return {name: tokens for name, tokens in parts.items() if tokens}


def _color(part: str) -> str:
    if part.startswith("cached ("):
        return TIER_COLORS.get(part[len("cached (") : -1], TIER_COLORS["unknown"])
    if part.startswith("lost: "):
        return LOST_COLORS.get(_CAUSE_OF_PART.get(part, ""), "#888888")
    return NEW_COLOR if part == "new" else UNKNOWN_COLOR


def _order(part: str) -> int:
    names = ["cached (device)", "cached (host)", "cached (disk)", "cached (tier unknown)", "new",
             *LOST_PARTS.values(), "unknown"]
    return names.index(part) if part in names else len(names)


def lost_by_cause_text(lost_by_cause: Mapping[str, int] | None) -> str:
    """`evicted 584, answer rewritten 296`: the causes that lost tokens, most first; `0` when the ledger lost none,
    `-` when there is no ledger (unknown, not 0)."""
    if lost_by_cause is None:
        return "-"
    ranked = sorted(lost_by_cause.items(), key=lambda item: -item[1])
    return ", ".join(f"{cause_label(cause)} {tokens:,}" for cause, tokens in ranked) or "0"


def parent_label(turn: ConversationTurn, turns: Sequence[ConversationTurn]) -> str:
    """The turn this one extends: `turn 2 (req_…)` when it is among `turns`, else the parent's request id; `-`
    for a first turn."""
    if turn.parent_request_id is None:
        return "-"
    for position, other in enumerate(turns):
        if other.request_id == turn.parent_request_id:
            return f"{turn_label(other, position)} ({short_request_id(other.request_id)})"
    return short_request_id(turn.parent_request_id)


def marker_notes(turn: ConversationTurn, previous_replica: str | None) -> dict[str, str]:
    """The markers a turn carries (`MARKERS` names) with their hover text; a divergence only where the turn missed
    (its miss reason is not `hit`)."""
    notes: dict[str, str] = {}
    if turn.divergence_segment is not None and turn.miss_reason != HIT:
        offset = "" if turn.divergence_char_offset is None else f" +{turn.divergence_char_offset}"
        notes["divergence"] = f"{turn.miss_reason or 'diverged'} at {turn.divergence_segment}{offset}"
    if turn.idle_beyond_ttl:
        notes["idle past TTL"] = f"idle {turn.idle_s:.0f} s > {turn.retention_class} TTL ({turn.ttl_s:.0f} s)"
    if turn.replica_changed:
        notes["replica changed"] = f"{previous_replica or '?'} -> {turn.replica}"
    if turn.answer_rewrite is not None:
        where = turn.answer_rewrite_segment or "?"
        offset = "" if turn.answer_rewrite_char_offset is None else f" +{turn.answer_rewrite_char_offset}"
        notes["answer rewritten"] = f"{turn.answer_rewrite} at {where}{offset}"
    return notes


def waterfall_figure(turns: Sequence[ConversationTurn]) -> go.Figure:
    """One stacked bar per turn: cached by tier, new, lost by cause, unknown (tokens), with markers above the bars
    for the divergence, an idle time past the retention class's TTL, a replica change and a rewritten answer."""
    labels = bar_labels(turns)
    per_turn = [ledger_parts(turn) for turn in turns]
    names = sorted({name for parts in per_turn for name in parts}, key=_order)
    figure = go.Figure()
    for name in names:
        figure.add_trace(
            go.Bar(x=labels, y=[parts.get(name, 0) for parts in per_turn], name=name, marker_color=_color(name),
                   hovertemplate=f"{name}: %{{y:,}} tokens<extra>%{{x}}</extra>")
        )
    top = max((turn.prompt_tokens or sum(parts.values()) for turn, parts in zip(turns, per_turn, strict=True)),
              default=0)
    previous: str | None = None
    notes = []
    for turn in turns:
        notes.append(marker_notes(turn, previous))
        previous = turn.replica or previous
    for level, (name, symbol) in enumerate(MARKERS):
        marked = [(label, note[name]) for label, note in zip(labels, notes, strict=True) if name in note]
        if not marked:
            continue
        figure.add_trace(
            go.Scatter(x=[label for label, _ in marked], y=[top * (1.05 + 0.06 * level)] * len(marked), name=name,
                       mode="markers", marker={"symbol": symbol, "size": 12, "color": "#222222"},
                       text=[text for _, text in marked], hovertemplate="%{text}<extra>%{x}</extra>")
        )
    figure.update_layout(
        title="Prompt tokens per turn: cached, new, lost",
        barmode="stack",
        yaxis={"title": "prompt tokens"},
        legend={"orientation": "h", "y": -0.15},
        margin=_MARGIN,
        height=420,
    )
    return figure


def lost_by_cause_figure(lost_by_cause: Mapping[str, int]) -> go.Figure:
    """Tokens lost per cause (horizontal bars, most first; causes as `db.ledger.cause_label` words them)."""
    ranked = sorted(lost_by_cause.items(), key=lambda item: item[1])
    figure = go.Figure(
        go.Bar(x=[tokens for _, tokens in ranked], y=[cause_label(cause) for cause, _ in ranked], orientation="h",
               marker_color=[LOST_COLORS.get(cause, "#888888") for cause, _ in ranked])
    )
    figure.update_layout(title="Tokens lost by cause", xaxis={"title": "tokens"}, margin=_MARGIN,
                         height=max(200, 40 + 28 * len(ranked)))
    return figure
