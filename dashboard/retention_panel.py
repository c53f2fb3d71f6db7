"""The Rule advice page's retention and fleet-pattern sections (`dashboard.views.advice` calls them): per tenant and
its largest prefixes, today's class, the best class, the saving per day, the writes never read again and the gaps
between uses, the reads each tier served and the entries lost to eviction (by tier) and expiry (by class), with the
prefixscope.toml lines; then the fleet-wide prompt patterns with their token cost."""

from __future__ import annotations

from datetime import datetime

import pandas as pd
import streamlit as st

from dashboard import data_advice
from db.advice import MERGE_HINT
from db.retention.advice import GAP_EDGES_S
from db.retention.costs import HOSTED_KINDS
from db.retention.reuse import PrefixReuse

PRICE_CHOICES = ("local_engine", *HOSTED_KINDS)


def _gap_label(edge: float) -> str:
    return f"≤{edge / 3600:g}h" if edge >= 3600 else f"≤{edge / 60:g}m" if edge >= 60 else f"≤{edge:g}s"


GAP_LABELS = [_gap_label(edge) for edge in GAP_EDGES_S] + [f">{GAP_EDGES_S[-1] / 3600:g}h"]


def _class(name: str) -> str:
    return "do not cache" if name == "none" else name


def reuse_row(prefix_hash: str, reuse: PrefixReuse) -> dict[str, object]:
    """One row of the reuse table: requests read from each tier, entries evicted from each tier and expired under
    each class, and how often the lost entries had been read."""
    row: dict[str, object] = {"prefix": prefix_hash[:16]}
    row |= {f"read from {r.tier}": r.requests for r in reuse.reads}
    row |= {f"evicted from {loss.key}": loss.count for loss in reuse.evicted}
    row |= {f"expired ({loss.key})": loss.count for loss in reuse.expired}
    lost = [*reuse.evicted, *reuse.expired]
    count = sum(loss.count for loss in lost)
    row["reads per lost entry"] = sum(loss.reads_before for loss in lost) / count if count else None
    return row


def show_retention(url: str, since: datetime, until: datetime, tenant: str | None) -> None:
    st.header("Retention")
    st.caption(
        "How long each prefix should stay cached: every class replayed over the recorded uses of each prefix, priced "
        "as the chosen upstream kind (hosted: write premium and read discount, Anthropic's 1.25x / 2x / 0.1x and "
        "OpenAI's no-premium defaults; local engines: prefill time saved against tier capacity held)."
    )
    kind = st.selectbox("Price retention as", PRICE_CHOICES, key="retention_kind")
    found = data_advice.retention(url, since, until, tenant, kind)
    if not found:
        st.info("No prefix reuse recorded in this range (requests with a prefix hash and prompt tokens).")
        return
    for advice in found:
        unit = "input-token equivalents" if advice.unit == "tokens" else "ms of prefill"
        st.subheader(f"Retention for tenant {advice.tenant}")
        st.markdown(
            f"Advised class: **{_class(advice.advised_class)}**, saving {advice.saving_per_day:,.0f} {unit} per day "
            "over today's classes."
        )
        rows = [
            {
                "prefix": p.prefix_hash[:16],
                "tokens": p.prefix_tokens,
                "uses": p.uses,
                "today": p.today,
                "best class": _class(p.best.retention),
                f"saving per day ({unit})": round(p.saving_per_day, 1),
                "writes never read again": p.unread_write_share,
                "median gap (s)": p.gaps.median_s,
                "what to do": p.action,
            }
            for p in advice.prefixes
        ]
        st.dataframe(
            pd.DataFrame(rows),
            hide_index=True,
            column_config={"writes never read again": st.column_config.NumberColumn(format="percent")},
        )
        gaps = pd.DataFrame(
            {p.prefix_hash[:16]: list(p.gaps.counts) for p in advice.prefixes}, index=GAP_LABELS
        )
        st.caption("Gaps between uses of each prefix (how many next uses came within each interval):")
        st.bar_chart(gaps)
        reuse = [reuse_row(p.prefix_hash, p.reuse) for p in advice.prefixes if p.reuse != PrefixReuse()]
        if reuse:
            st.caption("Reuse by tier and class (requests): the tier that served the reads, the entries evicted (by "
                       "the tier they were last held in) and expired (by the class they were sent with), and how "
                       "often a lost entry had been read.")
            table = pd.DataFrame(reuse)
            counts = [name for name in table.columns if name not in ("prefix", "reads per lost entry")]
            table[counts] = table[counts].fillna(0).astype(int)
            st.dataframe(table, hide_index=True)
        if advice.toml_lines:
            st.code("\n".join(advice.toml_lines), language="toml")
            st.caption(f"To apply it, add these lines to prefixscope.toml ({MERGE_HINT}).")
        elif advice.advised_class == "none":
            st.caption("No prefixscope.toml setting turns caching off for a tenant: have its clients send no cache "
                       "breakpoint for these prefixes.")
        else:
            st.caption("Keep today's class: no other class saves more.")


def show_patterns(url: str, since: datetime, until: datetime, tenant: str | None) -> None:
    st.header("Fleet patterns")
    st.caption(
        "Across tenants and conversations, from keyed block hashes of sampled prompts (never their text): system "
        "prompts that differ only in one span, tools sent in another order, tool lists one tool apart."
    )
    found = data_advice.patterns(url, since, until, tenant)
    if not found:
        st.info("No fleet pattern among the sampled prompts in this range.")
        return
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "pattern": p.kind,
                    "requests": p.requests,
                    "tenants": p.tenants,
                    "variants": p.variants,
                    "where": p.where,
                    "tokens it costs": p.tokens_total,
                    "what to do": p.action,
                }
                for p in found
            ]
        ),
        hide_index=True,
    )
