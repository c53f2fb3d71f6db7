"""`prefixscope bench dashboard`: how long each page waits for its data on a large database.

Each page's loaders (`dashboard.loaders`, the functions its cached wrappers call) run uncached on a fresh connection,
`--repeats` times; the median and the per-loader split are printed as one JSON document with a verdict against
`PAGE_QUERY_MS_TARGET` (exit status 1 when a page misses it). Every page in `dashboard/views/` is measured: the
Engine page's database reads (the tenant names of its namespaces) are timed like the others'; its reads of the
engine's cache API are not database time and are measured only by `--render`, against whatever engine the
environment names. With `--render`, each page's whole script also runs once through Streamlit's test runner with empty
caches, which adds chart and table building.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from dashboard import loaders, loaders_explain, what_if_model
from dashboard.ui import DEFAULT_RANGE, RANGE_CHOICES, ceil_minute
from prefixscope.progress import progress

PAGE_QUERY_MS_TARGET = 2000.0
"""The longest a page may wait for its data (median of --repeats, ms) on the benchmark database."""

# Demo data spans this many days, so the pages' default range (7 days) sees about half of it.
DEMO_DAYS = 14

Step = tuple[str, Callable[..., Any], tuple[Any, ...]]


def default_bench_url(rows: int) -> str:
    """A database kept in the state directory's `bench/`, so later runs from anywhere reuse it."""
    from prefixscope.paths import state_dir

    return f"sqlite:///{state_dir() / 'bench' / f'dashboard-{rows}.db'}"


def write_demo_database(url: str | None, rows: int, seed: int) -> None:
    """Write `rows` demo requests with `prefixscope demo-data` (migrating the database first) and say so."""
    from db.config import database_url_from_env
    from prefixscope.demo import write_demo_data

    target = database_url_from_env(url)
    print(f"writing {rows:,} demo requests into {target} ...", file=sys.stderr, flush=True)
    summary = write_demo_data(target, rows, seed=seed, days=DEMO_DAYS)
    print(summary, file=sys.stderr, flush=True)


def _count_requests(engine: Any) -> int:
    from db.queries import overview

    with engine.connect() as conn:
        return overview(conn, datetime(1970, 1, 1, tzinfo=UTC), ceil_minute(datetime.now(UTC))).requests


def _replay(_conn: Any, sample: loaders_explain.ChainSample) -> what_if_model.WhatIfResult:
    """The What-if page's default replay of `sample` (engine unreachable: the sidebar's default setting)."""
    from dashboard.what_if_model import (
        DEFAULT_CAPACITIES,
        DEFAULT_POLICIES,
        DEFAULT_TTLS,
        FALLBACK_CAPACITY_TOKENS,
        CurrentSetting,
        page_size_choices,
        run_what_if,
    )

    today = CurrentSetting(FALLBACK_CAPACITY_TOKENS, "lru", None)
    page_size = page_size_choices(sample.block_sizes)[0]
    return run_what_if(sample.requests, page_size, DEFAULT_CAPACITIES, DEFAULT_POLICIES, DEFAULT_TTLS, today)


def _page_steps(engine: Any, since: datetime, until: datetime) -> dict[str, list[Step]]:
    """What each page loads with the default filters (all tenants, all models, the default range): one entry per
    page of `dashboard/views/`."""
    from dashboard.data_conversations import load_conversation, load_conversations, load_eligible_hit_rates
    from dashboard.data_replicas import load_replicas
    from db.advice import DEFAULT_MIN_SAMPLES
    from db.queries.advice import advice

    with engine.connect() as conn:
        newest = loaders.load_recent_requests(conn, since, until, None, None, None, None, limit=1)
        misses = loaders_explain.load_why_misses(conn, since, until, None).misses
        sample = loaders_explain.load_chain_sample(conn, since, until, None, what_if_model.DEFAULT_BLOCK_BUDGET)
        worst = load_conversations(conn, since, until, None, limit=1).conversations
    worst_id, worst_tenant = (worst[0].conversation_id, worst[0].tenant) if worst else ("", None)
    newest_id = newest[0].request_id if newest else ""
    # The Why misses page shows examples of the reason with the most missed requests first.
    example_reason = misses[0].reason if misses else "evicted"
    catalog: Step = ("catalog", loaders.load_catalog, ())
    return {
        "overview": [
            catalog,
            ("overview", loaders.load_overview, (since, until, None, None)),
            ("eligible_hit_rate", load_eligible_hit_rates, (since, until, None, None, None)),
        ],
        "requests": [
            catalog,
            ("recent_requests", loaders.load_recent_requests, (since, until, None, None, None, None)),
            (
                "recent_requests(misses, evicted)",
                loaders.load_recent_requests,
                (since, until, None, None, False, "evicted"),
            ),
            ("request_detail", loaders.load_request_detail, (newest_id,)),
        ],
        "prefixes": [
            catalog,
            ("prefixes", loaders.load_prefixes, (since, until, None)),
            ("eligible_hit_rate by tenant", load_eligible_hit_rates, (since, until, None, None, "tenant")),
        ],
        "conversations": [
            catalog,
            ("conversations", load_conversations, (since, until, None)),
            ("conversation", load_conversation, (worst_id, worst_tenant)),
        ],
        "cost": [catalog, ("model_usage", loaders.load_model_usage, (since, until, None))],
        "why_misses": [
            catalog,
            ("why_misses", loaders_explain.load_why_misses, (since, until, None)),
            ("miss_examples", loaders_explain.load_miss_examples, (example_reason, since, until, None)),
        ],
        "engine": [("namespace_tenants", loaders.load_namespace_tenants, ())],
        "advice": [catalog, ("rule_advice", advice, (since, until, None, DEFAULT_MIN_SAMPLES))],
        "replicas": [catalog, ("replicas", load_replicas, (since, until))],
        "what_if": [
            catalog,
            (
                "chain_sample",
                loaders_explain.load_chain_sample,
                (since, until, None, what_if_model.DEFAULT_BLOCK_BUDGET),
            ),
            ("replay", _replay, (sample,)),
        ],
    }


def _time_page(engine: Any, steps: list[Step], repeats: int) -> dict[str, Any]:
    totals: list[float] = []
    per_step: dict[str, list[float]] = {name: [] for name, _, _ in steps}
    for _ in range(repeats):
        total = 0.0
        for name, fn, args in steps:
            started = time.perf_counter()
            with engine.connect() as conn:
                fn(conn, *args)
            elapsed = (time.perf_counter() - started) * 1000
            per_step[name].append(elapsed)
            total += elapsed
        totals.append(total)
    return {
        "query_ms_median": round(statistics.median(totals), 1),
        "query_ms_max": round(max(totals), 1),
        "queries_ms_median": {name: round(statistics.median(values), 1) for name, values in per_step.items()},
    }


def _render_ms(url: str, page: str, range_label: str) -> float:
    """One run of the page's script through Streamlit's test runner with empty data caches, after a warm-up run."""
    import logging
    import os

    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from dashboard.settings import ENV_DATABASE_URL, ENV_ENGINE_URL

    # The test runner warns about running outside a server on every run; the figures go to stdout regardless.
    logging.getLogger("streamlit").setLevel(logging.ERROR)
    os.environ[ENV_DATABASE_URL] = url
    # The benchmark times the database side; a closed port makes the engine calls fail at once.
    os.environ.setdefault(ENV_ENGINE_URL, "http://127.0.0.1:9")
    app = AppTest.from_file(str(Path(__file__).resolve().parent / "app.py"), default_timeout=120)
    app.run()
    if page != "overview":
        app.switch_page(f"views/{page}.py")
    app.run()  # first run of the page pays one-off imports (pandas, pyarrow, plotly); a server pays them once
    if range_label != DEFAULT_RANGE and page != "engine":
        app.sidebar.selectbox[0].set_value(range_label).run()  # the first sidebar choice is the time range
    st.cache_data.clear()
    started = time.perf_counter()
    app.run()
    elapsed = (time.perf_counter() - started) * 1000
    if app.exception:
        raise RuntimeError(f"page {page} failed: {app.exception[0].message}")
    return round(elapsed, 1)


def run_bench(args: argparse.Namespace) -> int:
    from db.config import sqlite_path
    from db.engine import create_sync_engine_for

    url = args.database_url or default_bench_url(args.rows)
    range_label = args.range_label or DEFAULT_RANGE
    if range_label not in RANGE_CHOICES:
        print(f"prefixscope: error: --range must be one of {', '.join(RANGE_CHOICES)}", file=sys.stderr)
        return 2
    path = sqlite_path(url)
    if path is not None and not path.exists():
        write_demo_database(url, args.rows, args.seed)
    engine = create_sync_engine_for(url)
    try:
        present = _count_requests(engine)
        if present == 0:
            write_demo_database(url, args.rows, args.seed)
            present = _count_requests(engine)
        elif present != args.rows:
            print(f"note: the database holds {present:,} requests, not {args.rows:,}", file=sys.stderr)
        until = ceil_minute(datetime.now(UTC))
        window: timedelta = RANGE_CHOICES[range_label]
        steps = _page_steps(engine, until - window, until)
        with progress("bench dashboard: pages", total=len(steps), unit="pages") as bar:
            pages = {
                page: _time_page(engine, page_steps, max(1, args.repeats))
                for page, page_steps in bar.iterate(steps.items())
            }
    finally:
        engine.dispose()
    if args.render:
        with progress("bench dashboard: rendering", total=len(pages), unit="pages") as bar:
            for page, figures in bar.iterate(pages.items()):
                figures["render_ms"] = _render_ms(url, page, range_label)
    report = {
        "benchmark": "dashboard",
        "database": url,
        "requests": present,
        "range": range_label,
        "repeats": max(1, args.repeats),
        "pages": pages,
    }
    verdicts = {
        f"{page}_query_ms_median": {
            "value": figures["query_ms_median"],
            "target": f"<= {PAGE_QUERY_MS_TARGET}",
            "pass": figures["query_ms_median"] <= PAGE_QUERY_MS_TARGET,
        }
        for page, figures in pages.items()
    }
    report["verdicts"] = verdicts
    report["pass"] = all(v["pass"] for v in verdicts.values())
    from prefixscope.bench_report import emit

    return emit(report)
