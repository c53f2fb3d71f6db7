"""Rule advice: per tenant, what each rule or setting it has not enabled would gain, estimated by the gateway's rule
advisor on a sample of its requests, with the prefixscope.toml lines that enable it; then the retention class each
prefix should buy and the fleet-wide prompt patterns (`dashboard.retention_panel`)."""

from __future__ import annotations

import streamlit as st

from dashboard import data, data_advice, retention_panel, ui
from db.advice import DEFAULT_MIN_SAMPLES, MERGE_HINT
from db.queries.advice import CandidateAdvice

settings = ui.load_settings()
st.title("Rule advice")
st.caption(
    "The gateway's rule advisor replays a sample of each tenant's requests with every rule it has not enabled "
    "(dry runs against the same upstream, off the request path) and estimates the token hit rate each would bring. "
    "Only requests sampled under each tenant's current settings count."
)

catalog = ui.read_database(data.catalog, settings.database_url)
if catalog.is_empty:
    ui.stop_with_info("No requests recorded yet. Send traffic through the gateway to get rule advice.")
filters = ui.sidebar_filters(catalog.tenants, catalog.models, with_model=False, first_seen=catalog.first_seen).refreshed()
min_samples = int(
    st.sidebar.number_input(
        "Minimum sampled requests", min_value=1, value=DEFAULT_MIN_SAMPLES, step=1, key="advice_min_samples"
    )
)
found = ui.read_database(
    data_advice.rule_advice, settings.database_url, filters.since, filters.until, filters.tenant, min_samples
)
if not found:
    st.info(
        "No rule advice in this range. The advisor samples every request of a tenant while it has capacity "
        "(`advice_sample_rate` above 0 in prefixscope.toml); pick a longer range or another tenant."
    )


def _verdict(c: CandidateAdvice) -> str:
    if c.recommended:
        return "recommended"
    if c.outranked_by is not None:
        return f"gains less than: {c.outranked_by}"
    return "no gain" if c.shown else "not enough samples"


today_label = f"Token hit rate, {filters.label.lower()}"
for tenant in found:
    st.subheader(f"Tenant {tenant.tenant}")
    recommended = tenant.recommendations
    columns = st.columns(3)
    columns[0].metric(
        today_label,
        ui.format_share(tenant.token_hit_rate),
        help=f"on the {tenant.samples} requests sampled under the tenant's current settings",
    )
    best = recommended[0] if recommended else None
    columns[1].metric(
        "Best estimate with one more rule",
        ui.format_share(best.estimated_hit_rate)
        if best
        else "not enough samples"
        if tenant.needs_more_samples
        else "no gain",
        help="from the sampled requests; see the table for each candidate's sample size",
    )
    columns[2].metric("Prompt tokens per day", ui.format_tokens(tenant.prompt_tokens_per_day))
    st.dataframe(
        [
            {
                "candidate": c.title,
                "advice": _verdict(c),
                "sampled requests": c.samples,
                "hit rate now": c.sampled_hit_rate,
                "estimated hit rate": c.estimated_hit_rate if c.shown else None,
                "tokens saved per day": round(c.tokens_saved_per_day) if c.shown else None,
                "prefill time saved per day (s)": None
                if not c.shown or c.prefill_ms_saved_per_day is None
                else round(c.prefill_ms_saved_per_day / 1000, 1),
                "changes what the model reads": c.moves_content,
                "what it changes": c.description,
            }
            for c in tenant.candidates
        ],
        hide_index=True,
        key=f"advice_{tenant.tenant}",
        column_config={
            "hit rate now": st.column_config.NumberColumn(format="percent"),
            "estimated hit rate": st.column_config.NumberColumn(format="percent"),
            "tokens saved per day": st.column_config.NumberColumn(format="localized"),
            "what it changes": st.column_config.TextColumn(width="large"),
        },
    )
    hidden = sum(1 for c in tenant.candidates if not c.shown)
    if hidden:
        st.caption(f"{hidden} estimate(s) rest on fewer than {min_samples} sampled requests and are not shown.")
    if tenant.needs_more_samples:
        st.info(
            f"Not enough sampled requests yet to advise: {tenant.most_samples} of the {min_samples} an estimate "
            f"needs, so {tenant.samples_needed} more requests. The advisor samples every request of a tenant with "
            "`advice_sample_rate` above 0 while it has capacity."
        )
    elif not recommended:
        st.info("Nothing to recommend: no rule this tenant has not enabled would raise its hit rate.")
    for c in recommended:
        st.markdown(
            f"**{c.title}**: {ui.format_share(tenant.token_hit_rate)} -> {ui.format_share(c.estimated_hit_rate)} "
            f"(estimated from {c.samples} sampled requests). It {c.description}."
        )
        if c.moves_content:
            st.warning("This rule moves content: it changes what the model reads.", icon=":material/warning:")
        st.code("\n".join(c.toml_lines), language="toml")
        st.caption(f"To enable it, add these lines to prefixscope.toml ({MERGE_HINT}).")

retention_panel.show_retention(settings.database_url, filters.since, filters.until, filters.tenant)
retention_panel.show_patterns(settings.database_url, filters.since, filters.until, filters.tenant)
