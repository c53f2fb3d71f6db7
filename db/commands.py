"""Handlers of the database's CLI commands (registered lazily by `db.cli`). Each returns an exit status."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from db import keys, migrate, queries
from db.config import database_url_from_env, sqlite_path
from db.engine import create_sync_engine_for
from db.errors import DatabaseError
from db.readiness import require_schema
from db.records import RETENTION_CLASSES
from db.query_params import time_range
from db.store import prune_requests, rebuild_rollups
from db.timeutil import iso_utc, parse_duration, utc_now


def _fail(message: str) -> int:
    print(f"prefixscope: error: {message}", file=sys.stderr)
    return 2


def _url(args: argparse.Namespace) -> str:
    return database_url_from_env(args.database_url)


@contextmanager
def _engine(args: argparse.Namespace, *, existing: bool = True) -> Iterator[Engine]:
    """An engine on the command's database; with `existing`, refuse (`DatabaseNotReady`) rather than create one."""
    if existing:
        require_schema(_url(args), explicit=args.database_url is not None)
    engine = create_sync_engine_for(_url(args))
    try:
        yield engine
    finally:
        engine.dispose()


def _guarded(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Report configuration, input and database errors as one line and exit status 2, not a traceback."""

    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except (DatabaseError, ValueError, OverflowError) as exc:
            return _fail(str(exc))
        except SQLAlchemyError as exc:
            return _fail(f"database: {exc.__class__.__name__}: {str(exc).splitlines()[0]}")

    run.__name__ = fn.__name__
    return run


def _json_default(value: object) -> str:
    if isinstance(value, datetime):
        return iso_utc(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=_json_default))


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [
        max(len(headers[i]), *(len(row[i]) for row in rows)) if rows else len(headers[i]) for i in range(len(headers))
    ]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


@_guarded
def db_upgrade(args: argparse.Namespace) -> int:
    migrate.upgrade(_url(args), args.revision)
    print(f"database at revision {migrate.current_revision(_url(args))}")
    return 0


@_guarded
def db_downgrade(args: argparse.Namespace) -> int:
    migrate.downgrade(_url(args), args.revision)
    print(f"database at revision {migrate.current_revision(_url(args)) or 'base'}")
    return 0


@_guarded
def db_current(args: argparse.Namespace) -> int:
    path = sqlite_path(_url(args))
    if path is not None and not path.exists():
        print(f"base (no database at {path.resolve()}; `prefixscope db upgrade` creates it)")
        return 0
    revision = migrate.current_revision(_url(args))
    head = migrate.head_revision()
    print(f"{revision or 'base'}{' (head)' if revision == head else f' (head is {head})'}")
    return 0


@_guarded
def db_rebuild_rollups(args: argparse.Namespace) -> int:
    with _engine(args) as engine, engine.begin() as conn:
        counted = rebuild_rollups(conn)
    print(f"rollups rebuilt from {counted} request{'' if counted == 1 else 's'}")
    return 0


@_guarded
def db_prune(args: argparse.Namespace) -> int:
    before = utc_now() - parse_duration(args.older_than)
    with _engine(args) as engine, engine.begin() as conn:
        deleted = prune_requests(conn, before)
    print(f"deleted {deleted} request{'' if deleted == 1 else 's'} created before {before:%Y-%m-%d %H:%M} UTC")
    return 0


@_guarded
def db_revision(args: argparse.Namespace) -> int:
    migrate.new_revision(_url(args), args.message, autogenerate=not args.empty)
    return 0


@_guarded
def keys_create(args: argparse.Namespace) -> int:
    # Keys are often created before the gateway first ran: create or migrate the schema as the gateway would.
    migrate.upgrade(_url(args))
    with _engine(args, existing=False) as engine:
        created = keys.create_api_key(engine, args.tenant, is_admin=args.admin, label=args.label)
    if args.json:
        _print_json(asdict(created))
        return 0
    role = "admin key" if created.is_admin else "key"
    print(f"Created {role} {created.key_id} for tenant {created.tenant}. It is shown only this once:")
    print(created.plaintext_key)
    return 0


@_guarded
def keys_revoke(args: argparse.Namespace) -> int:
    key_id = keys.key_id_of(args.key_id)
    with _engine(args) as engine:
        revoked = keys.revoke_api_key(engine, key_id)
    if not revoked:
        return _fail(f"no active key with id {key_id!r}")
    print(f"revoked {key_id}")
    return 0


@_guarded
def keys_list(args: argparse.Namespace) -> int:
    with _engine(args) as engine:
        listed = keys.list_api_keys(engine, include_revoked=not args.active)
    if args.json:
        _print_json([asdict(item) for item in listed])
        return 0
    rows = [
        [
            item.key_id,
            item.tenant,
            "yes" if item.is_admin else "no",
            item.label or "",
            f"{item.created_at:%Y-%m-%d %H:%M}",
            f"{item.revoked_at:%Y-%m-%d %H:%M}" if item.revoked_at else "",
        ]
        for item in listed
    ]
    print(_table(["KEY ID", "TENANT", "ADMIN", "LABEL", "CREATED (UTC)", "REVOKED (UTC)"], rows))
    return 0


@_guarded
def stats(args: argparse.Namespace) -> int:
    since, until = time_range(args.since, args.until, "7d")
    with _engine(args) as engine, engine.connect() as conn:
        result = queries.stats(
            conn, since, until, bucket=args.bucket, group_by=args.by, tenant=args.tenant, model=args.model
        )
    if args.json:
        _print_json([asdict(row) for row in result])
        return 0
    headers = [
        "BUCKET (UTC)",
        *([args.by.upper()] if args.by else []),
        "REQUESTS",
        "PROMPT TOK",
        "CACHED TOK",
        "TOKEN HIT",
        "ELIGIBLE HIT",
        "REQ HIT",
        "TTFT HIT p50/p95 ms",
        "TTFT MISS p50/p95 ms",
    ]
    rows = [
        [
            f"{row.bucket_start:%Y-%m-%d %H:%M}",
            *([row.group or "-"] if args.by else []),
            str(row.requests),
            str(row.prompt_tokens),
            # Upstreams that do not report cached tokens: unknown, not zero (as in the hit-rate columns).
            str(row.cached_tokens) if row.requests_with_known_cache else "-",
            _pct(row.token_hit_rate),
            _pct(row.eligible_hit_rate),
            _pct(row.request_hit_share),
            f"{_ms(row.ttft_hit_p50_ms)}/{_ms(row.ttft_hit_p95_ms)}",
            f"{_ms(row.ttft_miss_p50_ms)}/{_ms(row.ttft_miss_p95_ms)}",
        ]
        for row in result
    ]
    if not rows:
        print("no requests in this range")
        return 0
    print(_table(headers, rows))
    print()
    _print_tier_table(result, args.by)
    return 0


def _tier_cells(figures: queries.CacheFigures | queries.TierTotals, known_cache: bool, known_tiers: bool) -> list[str]:
    """DEVICE, HOST, DISK, UNKNOWN and the mean load time: `-` where nothing was reported (no tier split, or no
    cached-token count at all), as distinct from a reported 0."""
    tiers = figures.tiers
    split = [str(tiers.device), str(tiers.host), str(tiers.disk)] if known_tiers else ["-", "-", "-"]
    load = "-" if figures.cache_load_ms_mean is None else f"{figures.cache_load_ms_mean:.1f}"
    return [*split, str(tiers.unknown) if known_cache else "-", load]


def _print_tier_table(result: Sequence[queries.StatsRow], by: str | None) -> None:
    """The `cached by tier` table under the `stats` table: per row, then the total over the range."""
    headers = ["BUCKET (UTC)", *([by.upper()] if by else []), "DEVICE", "HOST", "DISK", "UNKNOWN", "LOAD ms avg"]
    rows = [
        [
            f"{row.bucket_start:%Y-%m-%d %H:%M}",
            *([row.group or "-"] if by else []),
            *_tier_cells(row, row.requests_with_known_cache > 0, row.requests_with_known_tiers > 0),
        ]
        for row in result
    ]
    totals = queries.tier_totals(result)
    known_cache = any(row.requests_with_known_cache for row in result)
    total_cells = _tier_cells(totals, known_cache, totals.requests_with_known_tiers > 0)
    rows.append(["TOTAL", *([""] if by else []), *total_cells])
    print("cached by tier (tokens; UNKNOWN: upstreams that report no tiers)")
    print(_table(headers, rows))
    print(retention_totals_line(totals))


def retention_totals_line(totals: queries.TierTotals) -> str:
    """The line under the tier table: requests per retention class (every class, 0 included), then `none` for the
    requests sent without one."""
    counts = {name: totals.requests_by_retention.get(name, 0) for name in RETENTION_CLASSES}
    counts.update(totals.requests_by_retention)  # a class recorded by an older or newer gateway stays visible
    classes = [f"{name} {count}" for name, count in counts.items()]
    return "requests by retention class: " + ", ".join([*classes, f"none {totals.requests_without_retention}"])


def _best_ms(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(max(1, repeat)):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best * 1000


QUERY_MS_TARGET = 500.0
"""The most one read-side query may take (best of --repeat, ms): the dashboard runs several of them per page."""


@_guarded
def bench_queries(args: argparse.Namespace) -> int:
    from prefixscope.demo import write_demo_data

    with tempfile.TemporaryDirectory() as scratch:
        url = args.database_url or f"sqlite:///{Path(scratch) / 'bench.db'}"
        migrate.upgrade(url)
        engine = create_sync_engine_for(url)
        try:
            with engine.connect() as conn:
                stored = len(queries.recent_requests(conn, limit=1))
            if not stored:
                started = time.perf_counter()
                write_demo_data(url, rows=args.rows, seed=0)
                print(f"demo data: {args.rows} rows in {time.perf_counter() - started:.1f}s", file=sys.stderr)
            now = utc_now()
            week, month = now - timedelta(days=7), now - timedelta(days=30)
            with engine.connect() as conn:
                cases: list[tuple[str, Callable[[], object]]] = [
                    ("stats 7d 1h", lambda: queries.stats(conn, week, now)),
                    ("stats 30d 1d by tenant", lambda: queries.stats(conn, month, now, "1d", "tenant")),
                    ("overview 30d", lambda: queries.overview(conn, month, now)),
                    ("recent_requests 100", lambda: queries.recent_requests(conn, 100)),
                    (
                        "recent_requests 100 misses of a tenant",
                        lambda: queries.recent_requests(conn, 100, tenant="initech-rag", hit=False),
                    ),
                    ("top_prefixes 30d", lambda: queries.top_prefixes(conn, month, now, 20)),
                    (
                        "prefix_labels of the top 25",
                        lambda: queries.prefix_labels(
                            conn, [row.prefix_hash for row in queries.top_prefixes(conn, month, now, 25)]
                        ),
                    ),
                    ("totals_by tenant 30d", lambda: queries.totals_by(conn, month, now, "tenant")),
                    ("miss_reasons_over_time 7d 1h", lambda: queries.miss_reasons_over_time(conn, week, now)),
                    ("divergence_locations 30d", lambda: queries.divergence_locations(conn, month, now)),
                    ("rule_counts 30d", lambda: queries.rule_counts(conn, month, now)),
                    ("tenants + models", lambda: (queries.tenants(conn), queries.models(conn))),
                ]
                best_ms = {name: round(_best_ms(fn, args.repeat), 1) for name, fn in cases}
        finally:
            engine.dispose()
    from prefixscope.bench_report import emit

    verdicts = {
        f"{name} ms": {"value": ms, "target": f"<= {QUERY_MS_TARGET}", "pass": ms <= QUERY_MS_TARGET}
        for name, ms in best_ms.items()
    }
    report = {
        "benchmark": "db-queries",
        "database": "temporary SQLite" if args.database_url is None else args.database_url,
        "rows": args.rows,
        "repeat": args.repeat,
        "query_ms_best": best_ms,
        "verdicts": verdicts,
        "pass": all(v["pass"] for v in verdicts.values()),
    }
    return emit(report)
