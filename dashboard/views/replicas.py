"""Replicas: where a replica set's router sent requests, the hit rate each replica got, and how well the router
predicted each replica's cached tokens."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import streamlit as st

from dashboard import ui
from dashboard.data_replicas import replicas

settings = ui.load_settings()
st.title("Replicas")

filters = ui.sidebar_filters([], [], with_model=False).refreshed()
result = ui.read_database(replicas, settings.database_url, filters.since, filters.until)
if not result.history:
    ui.stop_with_info(
        "No request in this range was routed over a replica set. Give an upstream several replicas "
        "(`prefixscope gateway --upstream URL --upstream URL`, or `prefixscope up --replicas N`)."
    )

history = pd.DataFrame(
    [
        {
            "time (UTC)": row.bucket_start.replace(tzinfo=None),
            "replica": row.replica,
            "requests": row.requests,
            "share of requests": row.request_share,
            "token hit rate": row.token_hit_rate,
        }
        for row in result.history
    ]
)
for column, title in (("token hit rate", "Token hit rate per replica"),
                      ("share of requests", "Load per replica (share of routed requests)")):
    figure = px.line(history, x="time (UTC)", y=column, color="replica", markers=True, title=title)
    figure.update_yaxes(tickformat=".0%", rangemode="tozero")
    st.plotly_chart(figure, width="stretch")

totals = (
    pd.DataFrame(
        [{"replica": r.replica, "requests": r.requests, "prompt": r.prompt_tokens, "cached": r.cached_tokens,
          "eligible": r.eligible_tokens, "eligible cached": r.eligible_cached_tokens}
         for r in result.history]
    )
    .groupby("replica", as_index=False)
    .sum()
)
totals["token hit rate"] = totals["cached"] / totals["prompt"].where(totals["prompt"] > 0)
# cached / (prompt - new) over the requests with a token ledger; empty for a replica without any.
eligible = totals.pop("eligible")
totals["eligible hit rate"] = totals.pop("eligible cached") / eligible.where(eligible > 0)
totals["share of requests"] = totals["requests"] / totals["requests"].sum()
st.dataframe(
    totals.rename(columns={"prompt": "prompt tokens", "cached": "cached tokens"}),
    hide_index=True,
    column_config={
        "token hit rate": st.column_config.NumberColumn(format="percent"),
        "eligible hit rate": st.column_config.NumberColumn(
            format="percent", help="cached / (prompt - new tokens); empty where no request has a token ledger"
        ),
        "share of requests": st.column_config.NumberColumn(format="percent"),
    },
)

st.subheader("Router accuracy")
if not result.accuracy:
    st.info("No cache-aware prediction in this range (round_robin and least_loaded predict nothing).")
else:
    st.caption(
        "Cache-aware routing predicts each request's cached tokens on the replica it picks, from the engine's cache "
        "events (events; precise in older rows) or from what the gateway sent there (approximate); the engine then "
        "reports what matched."
    )
    st.dataframe(
        [
            {
                "replica": row.replica,
                "index": row.index_source,
                "requests": row.requests,
                "predicted tokens": row.predicted_tokens,
                "actual cached tokens": row.actual_cached_tokens,
                "hit/miss predicted right": row.hit_miss_agreement,
                "mean abs. error (tokens)": row.mean_abs_error_tokens,
            }
            for row in result.accuracy
        ],
        hide_index=True,
        column_config={
            "hit/miss predicted right": st.column_config.NumberColumn(format="percent"),
            "mean abs. error (tokens)": st.column_config.NumberColumn(format="%.1f"),
        },
    )
