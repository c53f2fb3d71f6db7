"""Cost: dollars prompt caching saved, under a dated price table that can be edited here or loaded from a file."""

from __future__ import annotations

import json

import streamlit as st

from dashboard import data, ui
from dashboard.prices import (
    DEFAULT_PRICE_TABLE,
    FALLBACK_MODEL,
    PriceTable,
    PriceTableError,
    compute_savings,
    load_price_table,
    price_rows,
    price_table_from_rows,
    price_table_to_dict,
)

settings = ui.load_settings()
st.title("Cost")


def base_table() -> tuple[PriceTable, str]:
    if settings.price_file is None:
        return DEFAULT_PRICE_TABLE, "the built-in default table"
    try:
        return load_price_table(settings.price_file), f"the price file {settings.price_file}"
    except PriceTableError as exc:
        st.warning(f"Using the built-in default prices: {exc}")
        return DEFAULT_PRICE_TABLE, "the built-in default table"


catalog = ui.read_database(data.catalog, settings.database_url)
if catalog.is_empty:
    ui.stop_with_info("No requests recorded yet, so nothing was saved yet.")
filters = ui.sidebar_filters(catalog.tenants, catalog.models, with_model=False, first_seen=catalog.first_seen).refreshed()
table, origin = base_table()

with st.expander(f"Prices: dollars per million tokens, as of {table.as_of.isoformat()} ({origin})", expanded=False):
    st.caption(
        f"{table.source.rstrip('.')}. Edit any cell or add rows; `{FALLBACK_MODEL}` prices every model not listed. "
        "Load your own table with `prefixscope dashboard --prices FILE` (TOML or JSON)."
    )
    as_of = st.date_input("Prices as of", value=table.as_of, key="cost_as_of")
    edited = st.data_editor(
        price_rows(table),
        num_rows="dynamic",
        hide_index=True,
        key="cost_price_editor",
        column_config={
            "model": st.column_config.TextColumn(required=True),
            "input": st.column_config.NumberColumn("input $/M", min_value=0.0, format="%.4f"),
            "cached_input": st.column_config.NumberColumn("cached input $/M", min_value=0.0, format="%.4f"),
            "cache_write": st.column_config.NumberColumn("cache write $/M", min_value=0.0, format="%.4f"),
        },
    )
    try:
        table = price_table_from_rows(edited, as_of, table.source)
    except PriceTableError as exc:
        st.warning(f"The edited table is not usable ({exc}); the unedited prices apply.")
    st.download_button(
        "Download this table (JSON)",
        json.dumps(price_table_to_dict(table), indent=2),
        file_name=f"prefixscope-prices-{table.as_of.isoformat()}.json",
        mime="application/json",
    )

usage = ui.read_database(data.model_usage, settings.database_url, filters.since, filters.until, filters.tenant)
if not usage:
    ui.stop_with_info("No requests in this time range. Pick a longer range or another tenant.")
savings = compute_savings(usage, table)
priced = [item for item in savings if item.saved_usd is not None]
total_without = sum(item.cost_without_cache_usd or 0.0 for item in priced)
total_with = sum(item.cost_with_cache_usd or 0.0 for item in priced)

columns = st.columns(3)
columns[0].metric("Saved by the cache", ui.format_usd(total_without - total_with))
columns[1].metric("Prompt cost without cache", ui.format_usd(total_without))
columns[2].metric("Prompt cost with cache", ui.format_usd(total_with))
st.caption(
    f"{filters.label}{' · ' + filters.tenant if filters.tenant else ''} · prices as of {table.as_of.isoformat()}. "
    "Without cache every prompt token is billed as input; with cache, cached tokens are billed as cached input and "
    "the rest as cache writes. Completion tokens cost the same either way and are left out."
)
st.dataframe(
    [
        {
            "model": item.model,
            "priced as": item.priced_as or "no price",
            "prompt tokens": item.prompt_tokens,
            "cached tokens": item.cached_tokens,
            "cost without cache ($)": item.cost_without_cache_usd,
            "cost with cache ($)": item.cost_with_cache_usd,
            "saved ($)": item.saved_usd,
        }
        for item in savings
    ],
    hide_index=True,
    column_config={
        "prompt tokens": st.column_config.NumberColumn(format="localized"),
        "cached tokens": st.column_config.NumberColumn(format="localized"),
        **{
            name: st.column_config.NumberColumn(format="$%.4f")
            for name in ("cost without cache ($)", "cost with cache ($)", "saved ($)")
        },
    },
)
unpriced = [item.model for item in savings if item.saved_usd is None]
if unpriced:
    st.warning(f"No price for {', '.join(unpriced)}: add a row for it (or a `{FALLBACK_MODEL}` row) to include it.")
