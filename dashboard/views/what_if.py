"""What-if: the token hit rate the recorded traffic would get with another cache size, eviction policy or TTL, from
a replay of the newest recorded block hash chains, with today's setting marked; and LRU over every device size with a
host tier below it (one pass over the chains), split between the tiers."""

from __future__ import annotations

from datetime import UTC, datetime

import streamlit as st

from dashboard import charts_explain, charts_what_if, data, data_explain, ui
from dashboard import what_if_model as model
from dashboard.engine_client import CacheStats, EngineUnavailable
from db.simulation import POLICIES, TraceError
from db.simulation.units import format_size, format_ttl, parse_size, parse_ttl

settings = ui.load_settings()
st.title("What-if")

catalog = ui.read_database(data.catalog, settings.database_url)
if catalog.is_empty:
    ui.stop_with_info("No requests recorded yet, so there is no traffic to replay.")
filters = ui.sidebar_filters(catalog.tenants, catalog.models, with_model=False, first_seen=catalog.first_seen).refreshed()

st.sidebar.header("What-if")
budget_labels = [format_size(budget) for budget in model.BLOCK_BUDGETS]
budget = (
    parse_size(
        st.sidebar.select_slider(
            "Most blocks to replay",
            budget_labels,
            value=format_size(model.DEFAULT_BLOCK_BUDGET),
            key="what_if_budget",
            help="The newest chains of the range up to this many blocks; more is slower.",
        )
    )
    or model.DEFAULT_BLOCK_BUDGET
)
sample = ui.read_database(
    data_explain.chain_sample, settings.database_url, filters.since, filters.until, filters.tenant, budget
)
if sample.num_requests == 0:
    ui.stop_with_info(
        "No block hash chains recorded in this time range, so there is nothing to replay. The gateway records the "
        "chain of a share of requests; pick a longer range or another tenant."
    )

stats: CacheStats | None = None
engine_problem = ""
try:
    stats = data.engine_stats(settings.engine_url, settings.engine_timeout_s, settings.engine_token)
except EngineUnavailable as exc:
    engine_problem = str(exc)
raw = stats.raw if stats is not None else {}
engine_page = raw.get("page_size") if isinstance(raw.get("page_size"), int) else None
recorded = ui.read_database(data.engine_context, settings.database_url)
if recorded is not None and recorded.page_size:
    engine_page = recorded.page_size

capacities = [
    size
    for label in st.sidebar.multiselect(
        "Cache sizes (tokens)",
        [format_size(size) for size in model.CAPACITY_CHOICES],
        default=[format_size(size) for size in model.DEFAULT_CAPACITIES],
        key="what_if_capacities",
    )
    if (size := parse_size(label)) is not None
]
policies = st.sidebar.multiselect("Eviction policies", list(POLICIES), default=list(POLICIES), key="what_if_policies")
ttls = [
    parse_ttl(label)
    for label in st.sidebar.multiselect(
        "TTLs",
        [format_ttl(ttl) for ttl in model.TTL_CHOICES],
        default=[format_ttl(ttl) for ttl in model.DEFAULT_TTLS],
        key="what_if_ttls",
    )
]
page_choices = model.page_size_choices(sample.block_sizes)
page_size = st.sidebar.selectbox(
    "Page size (tokens)",
    page_choices,
    index=page_choices.index(model.default_page_size(page_choices, engine_page)),
    key="what_if_page_size",
)

# The engine's host tier (`/v1/cache` "tiers"), when it has one, is the default host size.
tier_stats = raw.get("tiers")
host_stats = tier_stats.get("host") if isinstance(tier_stats, dict) else None
engine_host_tokens = (
    host_stats.get("capacity_tokens") if isinstance(host_stats, dict) and host_stats.get("enabled") else None
)
host_choices = list(model.HOST_CAPACITY_CHOICES)
if isinstance(engine_host_tokens, int) and engine_host_tokens > 0 and engine_host_tokens not in host_choices:
    host_choices = sorted([*host_choices, engine_host_tokens])
host_capacity = st.sidebar.selectbox(
    "Host tier (L2) size (tokens)",
    host_choices,
    index=host_choices.index(engine_host_tokens) if engine_host_tokens in host_choices else 0,
    format_func=lambda tokens: "off" if tokens == 0 else format_size(tokens),
    key="what_if_host_capacity",
    help="A host tier below the device cache: blocks the device evicts are demoted there, a host hit moves the block "
    "back. Modelled with LRU (the curve below).",
)

context = ui.read_database(data.engine_context, settings.database_url)
if context is not None and context.capacity_tokens:
    recorded_policy = context.eviction or "lru"
    today = model.CurrentSetting(
        capacity_tokens=context.capacity_tokens,
        policy=recorded_policy if recorded_policy in POLICIES else "lru",
        ttl_s=context.ttl_s,
    )
    today_source = (
        f"recorded with this database (engine `{context.upstream}`, {context.recorded_at:%Y-%m-%d %H:%M} UTC)"
    )
elif stats is not None:
    ttl_value = raw.get("ttl_s")
    engine_policy = str(raw.get("eviction") or "lru")
    today = model.CurrentSetting(
        capacity_tokens=stats.capacity_tokens,
        policy=engine_policy if engine_policy in POLICIES else "lru",
        ttl_s=float(ttl_value) if isinstance(ttl_value, int | float) and ttl_value > 0 else None,
    )
    today_source = f"from the engine at {settings.engine_url}, because this database recorded no engine settings"
    if engine_policy not in POLICIES:
        today_source += f" (its policy {engine_policy!r} is replayed as lru)"
else:
    st.sidebar.caption("The engine is not reachable: enter today's setting.")
    today = model.CurrentSetting(
        capacity_tokens=int(
            st.sidebar.number_input(
                "Today's cache capacity (tokens)",
                min_value=1,
                value=model.FALLBACK_CAPACITY_TOKENS,
                step=1024,
                key="what_if_today_capacity",
            )
        ),
        policy=st.sidebar.selectbox("Today's eviction policy", list(POLICIES), key="what_if_today_policy"),
        ttl_s=float(
            st.sidebar.number_input(
                "Today's TTL (seconds, 0 for none)", min_value=0, value=0, step=60, key="what_if_today_ttl"
            )
        )
        or None,
    )
    today_source = f"entered in the sidebar, because the engine is not reachable ({engine_problem})"

if not capacities or not policies or not ttls:
    ui.stop_with_info("Pick at least one cache size, one eviction policy and one TTL in the sidebar.")

try:
    result = ui.read_database(
        data_explain.what_if,
        settings.database_url,
        filters.since,
        filters.until,
        filters.tenant,
        budget,
        page_size,
        tuple(sorted(capacities)),
        tuple(policy for policy in POLICIES if policy in policies),
        tuple(ttl for ttl in model.TTL_CHOICES if ttl in ttls),
        today,
    )
except TraceError as exc:
    ui.stop_with_warning(f"The recorded chains cannot be replayed: {exc}")

approximate_share = sample.num_approximate / sample.num_requests
columns = st.columns(5)
columns[0].metric("Chains replayed", f"{sample.num_requests:,}")
columns[1].metric("Blocks", f"{sample.num_blocks:,}", help=f"of {', '.join(map(str, sample.block_sizes))} tokens")
columns[2].metric("Approximate chains", ui.format_share(approximate_share), help="hashed from text by the gateway")
today_rate = result.today.token_hit_rate if result.today is not None else None
columns[3].metric("Today's setting, simulated", ui.format_share(today_rate))
ceiling = result.ceiling
columns[4].metric("Unlimited cache, no TTL", ui.format_share(ceiling.token_hit_rate if ceiling else None))

today_text = f"{today.capacity_tokens:,} tokens, {today.policy}, TTL {format_ttl(today.ttl_s)}, page size {page_size}"
st.markdown(f"**Today's setting:** {today_text}, {today_source}.")
if engine_page is not None and engine_page != page_size:
    st.caption(
        f"The engine uses pages of {engine_page} tokens; the replay uses {page_size} (chains recorded in blocks of "
        f"{', '.join(map(str, sample.block_sizes))} tokens merge into larger pages, never split)."
    )
st.plotly_chart(charts_explain.what_if_figure(result, f"today ({today_text})"), width="stretch")

span = ""
if sample.first_s is not None and sample.last_s is not None:
    first, last = (datetime.fromtimestamp(moment, UTC) for moment in (sample.first_s, sample.last_s))
    span = f" from {first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC"
notes = [
    f"Replays the newest {sample.num_requests:,} recorded chains{span}: {result.num_blocks:,} pages of {page_size} "
    f"tokens, {result.distinct_blocks:,} distinct, {result.prompt_tokens:,} prompt tokens."
]
if not sample.covers_range:
    notes.append(
        f"Older chains of the range are left out to keep the page fast (at most {format_size(budget)} blocks); "
        "raise 'Most blocks to replay' in the sidebar to replay more."
    )
if sample.num_approximate:
    notes.append(
        f"{sample.num_approximate:,} of the chains ({approximate_share:.0%}) are approximate: the gateway hashed text "
        "chunks because the upstream returned no token-block hashes, so their figures are estimates."
    )
if filters.tenant:
    notes.append("Only this tenant's traffic is replayed, as if it had the whole cache to itself.")
notes.append(
    "`optimal` evicts the block needed furthest in the future (Belady): no policy can beat it. The dotted line is an "
    "unlimited cache without TTL, where every block seen before hits."
)
st.caption(" ".join(notes))

st.dataframe(
    [
        {
            "capacity (tokens)": item.capacity_tokens,
            "policy": item.policy,
            "TTL": format_ttl(item.ttl_s),
            "token hit rate": item.token_hit_rate,
            "block hit rate": item.block_hit_rate,
            "requests with a hit": item.request_hit_share,
            "evicted blocks": item.evicted_blocks,
            "expired blocks": item.expired_blocks,
        }
        for item in result.results
    ],
    hide_index=True,
    key="what_if_table",
    column_config={
        "capacity (tokens)": st.column_config.NumberColumn(format="localized"),
        "token hit rate": st.column_config.NumberColumn(format="percent"),
        "block hit rate": st.column_config.NumberColumn(format="percent"),
        "requests with a hit": st.column_config.NumberColumn(format="percent"),
        "evicted blocks": st.column_config.NumberColumn(format="localized"),
        "expired blocks": st.column_config.NumberColumn(format="localized"),
    },
)

st.subheader("Device and host tiers (LRU)")
tiers = ui.read_database(
    data_explain.what_if_tiers,
    settings.database_url,
    filters.since,
    filters.until,
    filters.tenant,
    budget,
    page_size,
    tuple(sorted(capacities)),
    host_capacity,
    today.ttl_s,
    today.capacity_tokens,
)
host_text = f"a host tier of {format_size(host_capacity)} tokens" if host_capacity else "no host tier"
if tiers.today is not None:
    columns = st.columns(3)
    columns[0].metric("Device tier hits (today's size)", ui.format_share(tiers.today.device_token_hit_rate))
    columns[1].metric("Host tier hits", ui.format_share(tiers.today.host_token_hit_rate))
    columns[2].metric("Both tiers", ui.format_share(tiers.today.token_hit_rate))
st.plotly_chart(charts_what_if.tiers_figure(tiers), width="stretch", key="what_if_tiers_chart")
st.caption(
    f"LRU at today's TTL ({format_ttl(tiers.ttl_s)}) with {host_text} below the device: a block the device evicts "
    "moves to the host, a host hit moves it back, a block the host evicts is gone. LRU keeps the most recently used "
    "blocks at every size, so one pass over the chains gives every size at once (stack distances): the device holds "
    "the blocks at distance up to its size, the host the next ones. fifo and optimal have no such shortcut and are "
    "replayed per size above."
)
st.dataframe(
    [
        {
            "device (tokens)": item.capacity_tokens,
            "host (tokens)": item.host_capacity_tokens,
            "device hit rate": item.device_token_hit_rate,
            "host hit rate": item.host_token_hit_rate,
            "token hit rate": item.token_hit_rate,
            "device hit tokens": item.device_hit_tokens,
            "host hit tokens": item.host_hit_tokens,
            "evicted blocks": item.evicted_blocks,
        }
        for item in tiers.points
    ],
    hide_index=True,
    key="what_if_tiers_table",
    column_config={
        "device (tokens)": st.column_config.NumberColumn(format="localized"),
        "host (tokens)": st.column_config.NumberColumn(format="localized"),
        "device hit rate": st.column_config.NumberColumn(format="percent"),
        "host hit rate": st.column_config.NumberColumn(format="percent"),
        "token hit rate": st.column_config.NumberColumn(format="percent"),
        "device hit tokens": st.column_config.NumberColumn(format="localized"),
        "host hit tokens": st.column_config.NumberColumn(format="localized"),
        "evicted blocks": st.column_config.NumberColumn(format="localized"),
    },
)
