"""Overview: hit rates over time, tokens and prefill time saved, TTFT on hits vs misses, and which cache tier served
the cached tokens. Refreshes itself."""

from __future__ import annotations

import streamlit as st

from dashboard import charts, data, ui
from dashboard.data_conversations import eligible_hit_rates
from dashboard.engine_client import EngineUnavailable
from dashboard.explain import ttft_caption
from dashboard.loaders import OverviewData

settings = ui.load_settings()
st.title("Overview")

catalog = ui.read_database(data.catalog, settings.database_url)
if catalog.is_empty:
    ui.stop_with_info(
        "No requests recorded yet. Send traffic through the gateway, or write demo history with "
        "`prefixscope demo-data --rows 10000`."
    )
filters = ui.sidebar_filters(catalog.tenants, catalog.models, first_seen=catalog.first_seen)


def prefill_speed() -> tuple[float, str]:
    """Tokens/s used to turn cached tokens into time saved, and a sentence saying where the figure comes from: the
    prefill speed recorded with this database's history first; the live engine's only when none was recorded."""
    context = ui.read_database(data.engine_context, settings.database_url)
    if context is not None and context.prefill_tokens_per_s:
        speed = context.prefill_tokens_per_s
        return speed, (
            f"the prefill speed recorded with this database, {speed:,.0f} tokens/s (engine `{context.upstream}`, "
            f"{context.recorded_at:%Y-%m-%d %H:%M} UTC)"
        )
    try:
        measured = data.engine_stats(
            settings.engine_url, settings.engine_timeout_s, settings.engine_token
        ).prefill_tokens_per_s
    except EngineUnavailable as problem:
        measured, reason = None, f"the engine at {settings.engine_url} is not reachable ({problem})"
    else:
        reason = "the engine has not measured its prefill speed yet"
    if measured is not None:
        return measured, (
            f"the engine's measured prefill speed, {measured:,.0f} tokens/s ({settings.engine_url}), because this "
            "database recorded none: the live engine may not be the one this history ran on"
        )
    speed = settings.default_prefill_tokens_per_s
    return speed, f"the configured default of {speed:,.0f} tokens/s, because {reason}"


HIT_HELP = (
    "Share of requests (among those whose upstream reported cached tokens) that reused more than the chat "
    "template's fixed opening from cache. The opening is the leading tokens every prompt of its shape starts with "
    "(such as `<|im_start|>system` and a newline, or a default system prompt the template inserts); the engine "
    "reports how many there are, and a request that matched only those counts as a miss."
)


ELIGIBLE_HELP = (
    "cached / (prompt - new tokens), over the requests with a token ledger: the tokens a conversation's new turn "
    "adds are misses no cache could avoid. `-`: no request in the range has a ledger."
)


def render_totals(result: OverviewData, eligible_rate: float | None) -> None:
    totals = result.totals
    speed, speed_source = prefill_speed()
    saved_s = totals.cached_tokens / speed
    columns = st.columns(6)
    columns[0].metric("Requests", f"{totals.requests:,}")
    columns[1].metric("Token hit rate", ui.format_share(totals.token_hit_rate), help="cached / prompt tokens")
    columns[2].metric(
        "Eligible hit rate", "-" if eligible_rate is None else ui.format_share(eligible_rate), help=ELIGIBLE_HELP
    )
    columns[3].metric("Requests with any hit", ui.format_share(totals.request_hit_share), help=HIT_HELP)
    columns[4].metric("Tokens served from cache", ui.format_tokens(totals.cached_tokens))
    columns[5].metric("Prefill time saved", ui.format_seconds(saved_s), help="cached tokens / prefill speed")
    st.caption(f"Prefill time saved uses {speed_source}.")

    columns = st.columns(5)
    columns[0].metric("TTFT p50, hits", ui.format_ms(totals.ttft_hit_p50_ms))
    columns[1].metric("TTFT p50, misses", ui.format_ms(totals.ttft_miss_p50_ms))
    columns[2].metric("TTFT p95, hits", ui.format_ms(totals.ttft_hit_p95_ms))
    columns[3].metric("TTFT p95, misses", ui.format_ms(totals.ttft_miss_p95_ms))
    if totals.ttft_hit_p50_ms and totals.ttft_miss_p50_ms:
        columns[4].metric("p50 speed-up on hits", f"{totals.ttft_miss_p50_ms / totals.ttft_hit_p50_ms:.1f}x")
    unknown = totals.requests - totals.requests_with_known_cache
    if unknown:
        st.caption(
            f"{ui.count_of(unknown, 'request')} {'has' if unknown == 1 else 'have'} no cached-token count (failed, "
            "or sent to an upstream that does not report it); the hit rates leave them out."
        )
    st.caption(ttft_caption(totals.ttft_ranges_ms))


def render_tiers(result: OverviewData, x_range: charts.XRange) -> None:
    """Cached tokens by the tier that served them, over time and in total, with the engine's load time."""
    totals = result.totals
    st.subheader("Cached tokens by tier")
    if totals.requests_with_known_tiers == 0:
        st.caption(
            "No request in this range reported which cache tier served it (upstreams without tiers, or an engine from "
            f"before them): all {totals.tiers.unknown:,} cached tokens are of unknown tier."
        )
        return
    left, right = st.columns([3, 1])
    left.plotly_chart(charts.tier_tokens_figure(result.series, x_range), width="stretch")
    shares = totals.tiers.total or 1
    for tier in ("device", "host", "disk", "unknown"):
        tokens = getattr(totals.tiers, tier)
        right.metric(f"From {tier}" if tier != "unknown" else "Tier unknown", ui.format_tokens(tokens),
                     help=f"{tokens:,} tokens, {tokens / shares:.1%} of the cached tokens")
    right.metric(
        "Mean cache load",
        ui.format_ms(totals.cache_load_ms_mean),
        help="Time the engine spent loading host and disk KV back to the device, per request that reported it "
        f"({ui.count_of(totals.requests_with_known_load, 'request')})",
    )


def render_retention(result: OverviewData) -> None:
    """Requests per retention class asked for (nothing when no request asked for one)."""
    totals = result.totals
    if totals.requests_by_retention:
        without = totals.requests - sum(totals.requests_by_retention.values())
        parts = [f"{name} {count:,}" for name, count in totals.requests_by_retention.items()]
        st.caption("Requests by retention class: " + ", ".join([*parts, f"none {without:,}"]))


@st.fragment(run_every=settings.refresh_s)
def live_overview() -> None:
    current = filters.refreshed()
    result = ui.read_database(
        data.overview, settings.database_url, current.since, current.until, current.tenant, current.model
    )
    scope = " · ".join(part for part in (current.label, current.tenant, current.model) if part)
    st.caption(
        f"{scope} · {current.since:%Y-%m-%d %H:%M} to {current.until:%Y-%m-%d %H:%M} UTC · "
        f"refreshes every {settings.refresh_s:g} s"
    )
    if result.totals.requests == 0:
        st.info("No requests in this time range. Pick a longer range or another tenant or model.")
        return
    eligible = ui.read_database(
        eligible_hit_rates, settings.database_url, current.since, current.until, current.tenant, current.model
    )
    render_totals(result, eligible.get(None))
    left, right = st.columns(2)
    x_range = (result.first_bucket_start, current.until)
    left.plotly_chart(charts.hit_rate_figure(result.series, x_range), width="stretch")
    right.plotly_chart(charts.ttft_figure(result.series, x_range), width="stretch")
    if result.totals.miss_kinds:
        kinds = sorted(result.totals.miss_kinds.items(), key=lambda item: -item[1])
        st.caption("Requests by cache outcome: " + ", ".join(f"{kind} {count:,}" for kind, count in kinds))
    render_tiers(result, x_range)
    render_retention(result)


live_overview()
