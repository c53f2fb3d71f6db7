"""Plotly figures for the Why misses and What-if pages, built from query and replay results (pure functions)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import plotly.graph_objects as go

from dashboard.charts import CACHED_COLOR, XRange
from dashboard.what_if_model import WhatIfResult
from db.queries import DivergenceLocation, MissReasonRow
from db.records import MISS_REASONS
from db.simulation.units import format_size, format_ttl

_MARGIN = {"l": 10, "r": 10, "t": 40, "b": 10}
# One fixed colour per reason, so a reason keeps its colour whichever reasons a range holds.
_PALETTE = (
    "#264653",
    "#2a9d8f",
    "#8ab17d",
    "#e9c46a",
    "#f4a261",
    "#e76f51",
    "#9b5de5",
    "#f15bb5",
    "#00bbf9",
    "#6c757d",
    "#b5838d",
)
POLICY_COLORS = {"lru": "#2a9d8f", "fifo": "#e76f51", "optimal": "#264653"}
_TTL_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")


def reason_color(reason: str) -> str:
    index = MISS_REASONS.index(reason) if reason in MISS_REASONS else len(MISS_REASONS) + len(reason)
    return _PALETTE[index % len(_PALETTE)]


def location_label(location: DivergenceLocation) -> str:
    return f"{location.segment} @ chars {location.char_offset_start:,}-{location.char_offset_end:,}"


def miss_reasons_figure(
    series: Sequence[MissReasonRow], reasons: Sequence[str], x_range: XRange = None, measure: str = "tokens"
) -> go.Figure:
    """Stacked bars per time bucket: tokens lost (recomputed) or requests, one colour per reason in `reasons`."""
    if measure not in ("tokens", "requests"):
        raise ValueError(f"measure must be 'tokens' or 'requests', got {measure!r}")
    by_reason: dict[str, tuple[list[datetime], list[int]]] = {reason: ([], []) for reason in reasons}
    for row in series:
        if row.reason in by_reason:
            x, y = by_reason[row.reason]
            x.append(row.bucket_start)
            y.append(row.recomputed_tokens if measure == "tokens" else row.requests)
    figure = go.Figure()
    for reason, (x, y) in by_reason.items():
        figure.add_trace(go.Bar(x=x, y=y, name=reason, marker_color=reason_color(reason)))
    figure.update_layout(
        barmode="stack",
        title="Tokens lost per reason" if measure == "tokens" else "Missed requests per reason",
        xaxis={"range": list(x_range)} if x_range is not None else {},
        yaxis={"title": "recomputed tokens" if measure == "tokens" else "requests", "rangemode": "tozero"},
        legend={"orientation": "h", "y": -0.15},
        margin=_MARGIN,
        height=360,
    )
    return figure


def divergence_figure(locations: Sequence[DivergenceLocation]) -> go.Figure:
    """Ranked bars: where prompts first differed from the cached prefix, by requests (largest at the top)."""
    labels = [location_label(location) for location in locations][::-1]
    figure = go.Figure(
        go.Bar(
            y=labels,
            x=[location.requests for location in locations][::-1],
            customdata=[location.recomputed_tokens for location in locations][::-1],
            orientation="h",
            marker_color=CACHED_COLOR,
            hovertemplate="%{y}<br>requests: %{x:,}<br>tokens lost: %{customdata:,}<extra></extra>",
        )
    )
    figure.update_layout(
        title="Where prompts diverged",
        xaxis={"title": "requests"},
        margin=_MARGIN,
        height=max(220, 28 * len(locations) + 80),
    )
    return figure


def series_name(policy: str, ttl_s: float | None) -> str:
    return f"{policy}, TTL {format_ttl(ttl_s)}"


def what_if_figure(result: WhatIfResult, today_label: str | None = None) -> go.Figure:
    """Token hit rate against cache size (log axis): one line per policy x TTL, the unlimited cache's ceiling as a
    dotted line, today's setting as a vertical line and a star."""
    figure = go.Figure()
    ttls = list(dict.fromkeys(result.ttl_s for result in result.results))
    for (policy, ttl_s), points in result.series().items():
        figure.add_trace(
            go.Scatter(
                x=[point.capacity_tokens for point in points],
                y=[point.token_hit_rate for point in points],
                name=series_name(policy, ttl_s),
                mode="lines+markers",
                line={"color": POLICY_COLORS.get(policy), "dash": _TTL_DASHES[ttls.index(ttl_s) % len(_TTL_DASHES)]},
                customdata=[format_size(point.capacity_tokens) for point in points],
                hovertemplate="%{customdata} tokens: %{y:.1%}<extra>" + series_name(policy, ttl_s) + "</extra>",
            )
        )
    ceiling = result.ceiling
    if ceiling is not None and ceiling.token_hit_rate is not None:
        figure.add_hline(
            y=ceiling.token_hit_rate,
            line={"dash": "dot", "color": "#6c757d"},
            annotation_text=f"unlimited, no TTL: {ceiling.token_hit_rate:.1%}",
            annotation_position="top left",
        )
    today = result.today
    if today is not None and today.capacity_tokens:
        figure.add_vline(x=today.capacity_tokens, line={"dash": "dash", "color": "#e9c46a"})
        figure.add_trace(
            go.Scatter(
                x=[today.capacity_tokens],
                y=[today.token_hit_rate],
                name=today_label or "today",
                mode="markers",
                marker={"symbol": "star", "size": 16, "color": "#e9c46a", "line": {"color": "#264653", "width": 1}},
                hovertemplate="today: %{y:.1%}<extra></extra>",
            )
        )
    figure.update_layout(
        title="Token hit rate by cache size",
        xaxis={"title": "cache capacity (tokens, log scale)", "type": "log"},
        yaxis={"title": "token hit rate", "tickformat": ".0%", "range": [0, 1.02]},
        legend={"orientation": "h", "y": -0.2},
        margin=_MARGIN,
        height=460,
    )
    return figure
