"""Plotly figure for the What-if page's device + host tiers section, built from `what_if_model.TiersResult`."""

from __future__ import annotations

import plotly.graph_objects as go

from dashboard.what_if_model import TiersResult
from db.simulation.units import format_size, format_ttl

DEVICE_COLOR = "#2a9d8f"
HOST_COLOR = "#e9c46a"
_MARGIN = {"l": 10, "r": 10, "t": 40, "b": 10}


def tiers_figure(result: TiersResult) -> go.Figure:
    """Token hit rate against the device size (log axis): the device tier's hits and, with a host tier, both tiers'
    together, as filled areas (the band between them is what the host tier adds); today's device size as a line."""
    figure = go.Figure()
    sizes = [format_size(tokens) for tokens in result.curve_capacity_tokens]
    figure.add_trace(
        go.Scatter(
            x=list(result.curve_capacity_tokens),
            y=list(result.curve_device_rates),
            name="device (L1) hits",
            mode="lines",
            line={"color": DEVICE_COLOR, "shape": "hv"},
            fill="tozeroy",
            customdata=sizes,
            hovertemplate="%{customdata} tokens on the device: %{y:.1%}<extra>device</extra>",
        )
    )
    if result.host_capacity_tokens:
        figure.add_trace(
            go.Scatter(
                x=list(result.curve_capacity_tokens),
                y=list(result.curve_total_rates),
                name=f"device + host ({format_size(result.host_capacity_tokens)} tokens) hits",
                mode="lines",
                line={"color": HOST_COLOR, "shape": "hv"},
                fill="tonexty",
                customdata=sizes,
                hovertemplate="%{customdata} tokens on the device: %{y:.1%}<extra>device + host</extra>",
            )
        )
    today = result.today
    if today is not None and today.capacity_tokens:
        figure.add_vline(x=today.capacity_tokens, line={"dash": "dash", "color": "#264653"})
        figure.add_trace(
            go.Scatter(
                x=[today.capacity_tokens],
                y=[today.token_hit_rate],
                name="today's device size",
                mode="markers",
                marker={"symbol": "star", "size": 14, "color": HOST_COLOR, "line": {"color": "#264653", "width": 1}},
                hovertemplate="today: %{y:.1%}<extra></extra>",
            )
        )
    figure.update_layout(
        title=f"LRU token hit rate by device size, every size from one pass (TTL {format_ttl(result.ttl_s)})",
        xaxis={"title": "device cache capacity (tokens, log scale)", "type": "log"},
        yaxis={"title": "token hit rate", "tickformat": ".0%", "range": [0, 1.02]},
        legend={"orientation": "h", "y": -0.2},
        margin=_MARGIN,
        height=420,
    )
    return figure
