"""Engine cache: the live radix tree from the engine's cache API, pool usage and evictions, and each cache tier's
occupancy and counters (for engines that report tiers). Refreshes itself."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data, ui
from dashboard.cache_tree import flatten_tree
from dashboard.engine_client import CacheStats, EngineUnavailable

settings = ui.load_settings()
st.title("Engine cache")
st.caption(f"Engine: {settings.engine_url}")

left, right = st.columns(2)
kind = left.segmented_control("Chart", list(charts.TREE_KINDS), default="icicle", key="engine_chart_kind")
max_nodes = right.select_slider(
    "Most nodes to draw", options=[100, 250, 500, 1000, 2500, 5000], value=1000, key="engine_max_nodes"
)


def render_tiers(stats: CacheStats) -> None:
    """Each tier's occupancy and counters, from `/v1/cache` `tiers`; a note when the engine reports none."""
    st.subheader("Tiers")
    if stats.tiers is None:
        st.caption(
            "This engine does not report cache tiers (it predates them): everything it caches is in the device pool "
            "above."
        )
        return
    columns = st.columns(len(stats.tiers))
    for column, tier in zip(columns, stats.tiers, strict=True):
        if tier.enabled:
            column.metric(
                f"{tier.name.capitalize()} tier used",
                f"{tier.used_share:.1%}",
                help=f"{tier.cached_tokens:,} of {tier.capacity_tokens:,} tokens cached",
            )
        else:
            column.metric(f"{tier.name.capitalize()} tier used", "off")
    if any(tier.enabled for tier in stats.tiers):
        st.plotly_chart(charts.tier_occupancy_figure(stats.tiers), width="stretch")
    st.dataframe(
        [
            {
                "tier": tier.name,
                "enabled": tier.enabled,
                "cached tokens": tier.cached_tokens,
                "capacity tokens": tier.capacity_tokens,
                "capacity": ui.format_bytes(tier.capacity_bytes) if tier.enabled else "-",
                "hit tokens": tier.hit_tokens_total,
                "loads": tier.loads_total,
                "tokens loaded": tier.load_tokens_total,
                "mean load": ui.format_ms(tier.load_ms_mean),
                "demoted tokens": tier.demoted_tokens_total,
                "dropped tokens": tier.dropped_tokens_total,
                "corrupt files": tier.corrupt_files_total,
            }
            for tier in stats.tiers
        ],
        hide_index=True,
    )
    st.caption(
        "Counters since the engine started. Hit tokens were served from the tier; loads copied host or disk KV back "
        "to the device; demoted tokens moved on to the next tier when evicted; dropped tokens left the cache for good "
        "(evicted from the last tier, expired, or flushed)."
    )


@st.fragment(run_every=settings.refresh_s)
def live_engine() -> None:
    try:
        stats = data.engine_stats(settings.engine_url, settings.engine_timeout_s, settings.engine_token)
        tree = data.engine_tree(settings.engine_url, int(max_nodes), settings.engine_timeout_s, settings.engine_token)
    except EngineUnavailable as exc:
        st.warning(
            f"The engine is not reachable, so there is no live cache to show. {exc}. Start it with "
            "`prefixscope engine` or point the dashboard at it with `prefixscope dashboard --engine URL`."
        )
        return

    columns = st.columns(6)
    columns[0].metric(
        "Pool used", f"{stats.used_share:.1%}", help=f"{stats.used_tokens:,} of {stats.capacity_tokens:,}"
    )
    columns[1].metric("Capacity (tokens)", f"{stats.capacity_tokens:,}")
    columns[2].metric("Cached nodes", f"{stats.num_nodes:,}")
    columns[3].metric("Evicted tokens (total)", f"{stats.evicted_tokens_total:,}")
    columns[4].metric("Expired tokens (total)", f"{stats.expired_tokens_total:,}")
    speed = stats.prefill_tokens_per_s
    columns[5].metric("Prefill speed", "not measured yet" if speed is None else f"{speed:,.0f} tok/s")
    st.plotly_chart(
        charts.pool_figure(stats.protected_tokens, stats.evictable_tokens, stats.in_flight_tokens, stats.free_tokens),
        width="stretch",
    )
    details = [
        f"{label}: {stats.raw[key]}"
        for key, label in (
            ("eviction", "eviction policy"),
            ("ttl_s", "TTL (s)"),
            ("page_size", "page size"),
            ("active_requests", "running requests"),
            ("waiting_requests", "waiting requests"),
        )
        if stats.raw.get(key) is not None
    ]
    if details:
        st.caption(" · ".join(details))
    render_tiers(stats)

    tenants = data.namespace_tenants_if_readable(settings.database_url)
    flat, summaries = flatten_tree(tree.namespaces, tenants)
    if not summaries or all(summary.num_tokens == 0 for summary in summaries):
        st.info("The engine's cache is empty: no prompt has been cached yet.")
        return
    st.plotly_chart(charts.cache_tree_figure(flat, kind or "icicle"), width="stretch")
    if tree.truncated:
        st.caption(f"The engine sent its {max_nodes:,} largest nodes only; raise the limit to see more.")
    st.dataframe(
        [
            {
                "tenant": summary.tenant or "unknown (no request recorded under it)",
                "namespace": summary.namespace,
                "nodes": summary.num_nodes,
                "tokens": summary.num_tokens,
                "hits": summary.hit_count,
                "locked nodes": summary.num_locked,
            }
            for summary in summaries
        ],
        hide_index=True,
    )
    st.caption(
        "Each namespace is one tenant's cache salt; namespaces never share nodes. Tenants are named from the "
        "database (the gateway records the label of each tenant's namespace), never by the engine. Refreshes every "
        f"{settings.refresh_s:g} s."
    )


live_engine()
