"""Plotly figures for the pages, built from query results (pure functions, no Streamlit)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import plotly.graph_objects as go

from dashboard.cache_tree import FlatTree
from dashboard.engine_client import TierStats
from db.queries import StatsRow

CACHED_COLOR = "#2a9d8f"
COMPUTED_COLOR = "#e76f51"
HIT_COLOR = "#2a9d8f"
MISS_COLOR = "#e76f51"
TREE_KINDS = ("icicle", "treemap", "sunburst")
# Cached tokens by the tier that served them, fastest first, and those of unknown tier.
TIER_COLORS = {"device": "#2a9d8f", "host": "#e9c46a", "disk": "#8d6a9f", "unknown": "#bfbfbf"}
_MARGIN = {"l": 10, "r": 10, "t": 40, "b": 10}


XRange = tuple[datetime, datetime] | None


def _time_axis(x_range: XRange) -> dict[str, object]:
    # Without a range a single bucket would zoom the axis to microseconds; the chosen time range reads better.
    return {"range": list(x_range)} if x_range is not None else {}


def hit_rate_figure(series: Sequence[StatsRow], x_range: XRange = None) -> go.Figure:
    """Token hit rate and the share of requests with any hit, per bucket."""
    x = [row.bucket_start for row in series]
    figure = go.Figure()
    figure.add_trace(
        go.Scatter(x=x, y=[row.token_hit_rate for row in series], name="token hit rate", mode="lines+markers")
    )
    figure.add_trace(
        go.Scatter(x=x, y=[row.request_hit_share for row in series], name="requests with any hit", mode="lines+markers")
    )
    figure.update_layout(
        title="Cache hit rate over time",
        xaxis=_time_axis(x_range),
        yaxis={"tickformat": ".0%", "range": [0, 1.02]},
        legend={"orientation": "h", "y": -0.15},
        margin=_MARGIN,
        height=340,
    )
    return figure


def ttft_figure(series: Sequence[StatsRow], x_range: XRange = None) -> go.Figure:
    """TTFT p50 and p95 for hits and misses, per bucket."""
    x = [row.bucket_start for row in series]
    figure = go.Figure()
    for name, values, color, dash in (
        ("hits p50", [row.ttft_hit_p50_ms for row in series], HIT_COLOR, "solid"),
        ("hits p95", [row.ttft_hit_p95_ms for row in series], HIT_COLOR, "dot"),
        ("misses p50", [row.ttft_miss_p50_ms for row in series], MISS_COLOR, "solid"),
        ("misses p95", [row.ttft_miss_p95_ms for row in series], MISS_COLOR, "dot"),
    ):
        figure.add_trace(
            go.Scatter(x=x, y=values, name=name, mode="lines+markers", line={"color": color, "dash": dash})
        )
    figure.update_layout(
        title="Time to first token: hits vs misses",
        xaxis=_time_axis(x_range),
        yaxis={"title": "ms", "rangemode": "tozero"},
        legend={"orientation": "h", "y": -0.15},
        margin=_MARGIN,
        height=340,
    )
    return figure


def tier_tokens_figure(series: Sequence[StatsRow], x_range: XRange = None) -> go.Figure:
    """Cached tokens per bucket, stacked by the tier that served them: device, host, disk, and unknown (upstreams
    that report no tiers). Each bar adds up to the bucket's cached tokens."""
    x = [row.bucket_start for row in series]
    figure = go.Figure()
    for tier, color in TIER_COLORS.items():
        values = [getattr(row.tiers, tier) for row in series]
        figure.add_trace(go.Bar(x=x, y=values, name=tier, marker_color=color))
    figure.update_layout(
        title="Cached tokens by tier",
        barmode="stack",
        xaxis=_time_axis(x_range),
        yaxis={"title": "tokens", "rangemode": "tozero"},
        legend={"orientation": "h", "y": -0.15, "traceorder": "normal"},
        margin=_MARGIN,
        height=340,
    )
    return figure


def tier_occupancy_figure(tiers: Sequence[TierStats]) -> go.Figure:
    """One stacked bar per enabled tier, in tokens: cached and locked by running requests, cached and evictable (or
    demotable), free."""
    enabled = [tier for tier in tiers if tier.enabled]
    names = [tier.name for tier in enabled]
    figure = go.Figure()
    for label, values, color in (
        ("cached, locked", [tier.protected_tokens for tier in enabled], "#e9c46a"),
        ("cached, evictable", [tier.evictable_tokens for tier in enabled], CACHED_COLOR),
        ("free", [tier.free_tokens for tier in enabled], "#d9d9d9"),
    ):
        figure.add_trace(go.Bar(y=names, x=values, name=label, orientation="h", marker_color=color))
    figure.update_layout(
        barmode="stack",
        height=110 + 40 * len(names),
        margin={"l": 10, "r": 10, "t": 10, "b": 10},
        legend={"orientation": "h", "y": -0.3, "traceorder": "normal"},
        xaxis={"title": "tokens"},
        yaxis={"autorange": "reversed"},
    )
    return figure


def token_split_figure(cached_tokens: int, computed_tokens: int) -> go.Figure:
    """One horizontal bar: prompt tokens served from cache vs computed (prefilled)."""
    figure = go.Figure()
    for name, value, color in (("cached", cached_tokens, CACHED_COLOR), ("computed", computed_tokens, COMPUTED_COLOR)):
        figure.add_trace(
            go.Bar(
                y=["prompt"],
                x=[value],
                name=f"{name}: {value:,} tokens",
                orientation="h",
                marker_color=color,
                text=[f"{value:,}"],
                textposition="inside",
            )
        )
    figure.update_layout(
        barmode="stack",
        height=150,
        margin={"l": 10, "r": 10, "t": 10, "b": 10},
        legend={"orientation": "h", "y": -0.4, "traceorder": "normal"},
        xaxis={"title": None},
        yaxis={"visible": False},
    )
    return figure


def pool_figure(protected_tokens: int, evictable_tokens: int, in_flight_tokens: int, free_tokens: int) -> go.Figure:
    """The KV pool in tokens as one stacked bar: cached and locked, cached and evictable, running requests' new KV,
    free."""
    figure = go.Figure()
    for name, value, color in (
        ("cached, locked by running requests", protected_tokens, "#e9c46a"),
        ("cached, evictable", evictable_tokens, CACHED_COLOR),
        ("running requests' new tokens", in_flight_tokens, "#f4a261"),
        ("free", free_tokens, "#d9d9d9"),
    ):
        figure.add_trace(go.Bar(y=["pool"], x=[value], name=f"{name}: {value:,}", orientation="h", marker_color=color))
    figure.update_layout(
        barmode="stack",
        height=150,
        margin={"l": 10, "r": 10, "t": 10, "b": 10},
        legend={"orientation": "h", "y": -0.4, "traceorder": "normal"},
        xaxis={"title": None},
        yaxis={"visible": False},
    )
    return figure


def cache_tree_figure(flat: FlatTree, kind: str = "icicle") -> go.Figure:
    """The radix tree: box size is tokens (own edge plus descendants), colour is hit count."""
    if kind not in TREE_KINDS:
        raise ValueError(f"kind must be one of {TREE_KINDS}, got {kind!r}")
    trace_type = {"icicle": go.Icicle, "treemap": go.Treemap, "sunburst": go.Sunburst}[kind]
    customdata = [
        [tokens, subtree, hits, "yes" if locked else "no", "" if idle is None else f"{idle:,.1f} s ago"]
        for tokens, subtree, hits, locked, idle in zip(
            flat.num_tokens, flat.subtree_tokens, flat.hit_counts, flat.locked, flat.last_access_s, strict=True
        )
    ]
    trace = trace_type(
        ids=flat.ids,
        parents=flat.parents,
        labels=flat.labels,
        values=flat.num_tokens,
        branchvalues="remainder",
        customdata=customdata,
        marker={"colors": flat.hit_counts, "colorscale": "Teal", "showscale": True, "colorbar": {"title": "hits"}},
        hovertemplate=(
            "<b>%{label}</b><br>edge tokens: %{customdata[0]:,}<br>subtree tokens: %{customdata[1]:,}"
            "<br>hits: %{customdata[2]:,}<br>locked: %{customdata[3]}<br>last used: %{customdata[4]}<extra></extra>"
        ),
        maxdepth=8,
    )
    figure = go.Figure(trace)
    figure.update_layout(margin={"l": 0, "r": 0, "t": 30, "b": 0}, height=560)
    return figure


def horizontal_bars(labels: Sequence[str], values: Sequence[float], title: str, x_title: str) -> go.Figure:
    """A simple ranked bar chart (largest at the top)."""
    figure = go.Figure(go.Bar(y=list(labels)[::-1], x=list(values)[::-1], orientation="h", marker_color=CACHED_COLOR))
    figure.update_layout(
        title=title,
        xaxis={"title": x_title},
        margin=_MARGIN,
        height=max(220, 28 * len(labels) + 80),
    )
    return figure
