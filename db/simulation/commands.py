"""Handlers of the simulator's CLI commands (registered lazily by `db.simulation.cli`). Each returns an exit status."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from db.errors import DatabaseError
from db.simulation.simulator import POLICIES, SimulationResult, simulate, sweep
from db.simulation.synthetic import synthetic_trace
from db.simulation.trace import Trace, TraceRequest
from db.simulation.trace_io import export_trace as write_trace
from db.simulation.trace_io import read_trace, trace_request_from_chain
from db.simulation.units import format_size, format_ttl, parse_list, parse_size, parse_ttl
from db.timeutil import parse_moment, utc_now

DEFAULT_SINCE = "7d"
DEFAULT_POLICIES = ",".join(POLICIES)


def _fail(message: str) -> int:
    print(f"prefixscope: error: {message}", file=sys.stderr)
    return 2


def _guarded(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Report bad options, bad traces and database errors as one line and exit status 2, not a traceback."""

    def run(args: argparse.Namespace) -> int:
        from sqlalchemy.exc import SQLAlchemyError

        try:
            return fn(args)
        except (DatabaseError, ValueError) as exc:
            return _fail(str(exc))
        except SQLAlchemyError as exc:
            return _fail(f"database: {exc.__class__.__name__}: {str(exc).splitlines()[0]}")

    run.__name__ = fn.__name__
    return run


@contextmanager
def _stored_chains(args: argparse.Namespace) -> Iterator[Iterator[tuple[datetime, str, Any]]]:
    """The selected rows of `db.queries.iter_chains`, (created_at, tenant, RequestChain) in time order."""
    from db import queries
    from db.config import database_url_from_env
    from db.engine import create_sync_engine_for

    iter_chains = getattr(queries, "iter_chains", None)
    if iter_chains is None:
        raise DatabaseError(
            "this database layer cannot read request chains yet (no db.queries.iter_chains); use --trace"
        )
    now = utc_now()
    since = parse_moment(args.since or DEFAULT_SINCE, now)
    until = parse_moment(args.until, now) if args.until else None
    from db.readiness import require_schema

    url = database_url_from_env(args.database_url)
    require_schema(url, explicit=args.database_url is not None)
    engine = create_sync_engine_for(url)
    try:
        with engine.connect() as conn:
            yield iter_chains(conn, since, until=until, tenant=args.tenant)
    finally:
        engine.dispose()


def _load_trace(args: argparse.Namespace) -> Trace:
    if args.trace is not None:
        selected = [name for name in ("since", "until", "tenant") if getattr(args, name) is not None]
        if selected:
            options = ", ".join(f"--{name}" for name in selected)
            raise ValueError(f"{options}: only for stored requests; a --trace file is replayed whole")
        return read_trace(args.trace, page_size=args.page, block_size=args.block_size)
    from prefixscope.progress import progress

    with _stored_chains(args) as rows, progress("simulate: reading chains", unit="requests") as bar:
        requests: list[TraceRequest] = [
            trace_request_from_chain(created_at, chain) for created_at, _, chain in bar.iterate(rows)
        ]
    return Trace.from_requests(requests, page_size=args.page)


def _policies(text: str) -> list[str]:
    policies = parse_list(text, lambda item: item.lower())
    unknown = [policy for policy in policies if policy not in POLICIES]
    if unknown:
        raise ValueError(f"unknown eviction policy {unknown[0]!r}; choose from {', '.join(POLICIES)}")
    return policies


def _host_capacities(args: argparse.Namespace) -> list[int | None]:
    return [0] if args.host_capacity is None else parse_list(args.host_capacity, parse_size)


def _selected_policies(args: argparse.Namespace, host_capacities: list[int | None]) -> list[str]:
    """`--policy`, by default every policy, or only lru when `--host-capacity` is given (a host tier is LRU only)."""
    if args.policy is None:
        return _policies("lru" if args.host_capacity is not None else DEFAULT_POLICIES)
    policies = _policies(args.policy)
    others = [policy for policy in policies if policy != "lru"]
    if others and any(capacity != 0 for capacity in host_capacities):
        raise ValueError(
            "--host-capacity: a host tier is modelled for lru only (an LRU hierarchy with demotion), not for "
            f"{' or '.join(others)}; leave them out of --policy or set --host-capacity 0"
        )
    return policies


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _table(results: list[SimulationResult], tiers: bool = False) -> str:
    """The results as a table; with `tiers`, the host capacity and the token hit rate of each tier as well."""
    headers = ["CAPACITY", "POLICY", "TTL", "TOKEN HIT", "BLOCK HIT", "REQ HIT", "EVICTED", "EXPIRED"]
    if tiers:
        headers[1:1] = ["HOST"]
        headers[5:5] = ["DEVICE HIT", "HOST HIT"]
    rows = []
    for result in results:
        row = [
            format_size(result.capacity_tokens),
            result.policy,
            format_ttl(result.ttl_s),
            _pct(result.token_hit_rate),
            _pct(result.block_hit_rate),
            _pct(result.request_hit_share),
            f"{result.evicted_blocks:,}",
            f"{result.expired_blocks:,}",
        ]
        if tiers:
            row[1:1] = [format_size(result.host_capacity_tokens)]
            row[5:5] = [_pct(result.device_token_hit_rate), _pct(result.host_token_hit_rate)]
        rows.append(row)
    widths = [max(len(headers[i]), *(len(row[i]) for row in rows)) for i in range(len(headers))]
    lines = [headers, *rows]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def _describe(trace: Trace) -> dict[str, int]:
    return {
        "requests": trace.num_requests,
        "blocks": trace.num_blocks,
        "block_size": trace.block_size,
        "prompt_tokens": trace.prompt_tokens,
        "approximate_chains": trace.num_approximate,
    }


@_guarded
def simulate_command(args: argparse.Namespace) -> int:
    if getattr(args, "retention", None):
        return _simulate_retention(args)
    capacities = parse_list(args.capacity, parse_size)
    host_capacities = _host_capacities(args)
    policies = _selected_policies(args, host_capacities)
    ttls = parse_list(args.ttl, parse_ttl)
    trace = _load_trace(args)
    if trace.num_requests == 0:
        if args.json:
            print(json.dumps({"trace": _describe(trace), "results": []}, indent=2))
        else:
            print("no request chains to replay")
        return 0
    from prefixscope.progress import progress

    runs = len(capacities) * len(host_capacities) * len(policies) * len(ttls)
    with progress("simulate", total=runs, unit="settings") as bar:
        results = sweep(
            trace, capacities, policies, ttls, on_result=lambda _: bar.advance(1), host_capacities=host_capacities
        )
    if args.json:
        print(json.dumps({"trace": _describe(trace), "results": [result.to_dict() for result in results]}, indent=2))
        return 0
    approximate = f", {trace.num_approximate:,} of them approximate" if trace.num_approximate else ""
    print(
        f"{trace.num_requests:,} requests{approximate}, {trace.num_blocks:,} blocks of {trace.block_size} tokens, "
        f"{trace.prompt_tokens:,} prompt tokens"
    )
    print(_table(results, tiers=args.host_capacity is not None))
    return 0


def _simulate_retention(args: argparse.Namespace) -> int:
    from db.config import database_url_from_env
    from db.engine import create_sync_engine_for
    from db.readiness import require_schema
    from db.simulation.retention_command import parse_choices, simulate_retention

    if args.trace is not None:
        raise ValueError("--retention replays stored requests (their prefixes are in the database), not a --trace file")
    parse_choices(args.retention)
    now = utc_now()
    since = parse_moment(args.since or DEFAULT_SINCE, now)
    until = parse_moment(args.until, now) if args.until else None
    url = database_url_from_env(args.database_url)
    require_schema(url, explicit=args.database_url is not None)
    engine = create_sync_engine_for(url)
    try:
        with engine.connect() as conn:
            return simulate_retention(args, since, until, conn)
    finally:
        engine.dispose()


@_guarded
def export_trace_command(args: argparse.Namespace) -> int:
    from prefixscope.progress import progress

    with _stored_chains(args) as rows, progress("export-trace", unit="requests") as bar:
        if args.out == "-":
            written = write_trace(bar.iterate(rows), sys.stdout)
            return 0
        written = write_trace(bar.iterate(rows), args.out)
    print(f"wrote {written:,} requests to {args.out}")
    return 0


def _bench_trace(args: argparse.Namespace) -> Trace:
    if args.trace is not None:
        return read_trace(args.trace, block_size=args.block_size)
    return Trace.from_requests(synthetic_trace(args.blocks, seed=args.seed))


def _lru_sweep_figures(trace: Trace, capacities: list[int | None], ttl_s: float | None) -> dict[str, Any]:
    """The LRU sweep from one pass (stack distances) and from one replay per capacity, timed, and whether every
    figure of every point agrees. blocks/s counts each capacity's pass over the trace: points x blocks / seconds."""
    from prefixscope.progress import progress

    swept = len(capacities) * trace.num_blocks
    with progress("bench simulate: lru sweep", total=len(capacities) + 1, unit="passes") as bar:
        started = time.perf_counter()
        one_pass = sweep(trace, capacities, ["lru"], [ttl_s])
        one_pass_s = time.perf_counter() - started
        bar.advance(1)
        started = time.perf_counter()
        replayed = []
        for capacity in capacities:
            replayed.append(simulate(trace, capacity, "lru", ttl_s))
            bar.advance(1)
        replay_s = time.perf_counter() - started

    def timing(seconds: float) -> dict[str, Any]:
        return {"seconds": round(seconds, 3), "blocks_per_s": round(swept / seconds) if seconds else None}

    return {
        "points": len(capacities),
        "capacities_tokens": capacities,
        "one_pass": timing(one_pass_s),
        "replay": timing(replay_s),
        "speedup": round(replay_s / one_pass_s, 2) if one_pass_s else None,
        "agree": one_pass == replayed,
        "token_hit_rates": [round(result.token_hit_rate or 0.0, 4) for result in one_pass],
    }


@_guarded
def bench_simulate(args: argparse.Namespace) -> int:
    capacity = parse_size(args.capacity)
    sweep_capacities = parse_list(args.sweep, parse_size)
    ttl_s = parse_ttl(args.ttl)
    started = time.perf_counter()
    trace = _bench_trace(args)
    figures: dict[str, Any] = {
        "blocks": trace.num_blocks,
        "requests": trace.num_requests,
        "block_size": trace.block_size,
        "capacity_tokens": capacity,
        "ttl_s": ttl_s,
        "generate_s": round(time.perf_counter() - started, 3),
        "policies": {},
    }
    from prefixscope.progress import progress

    with progress("bench simulate", total=len(POLICIES) * trace.num_blocks, unit="blocks replayed") as bar:
        timings = {}
        for policy in POLICIES:
            started = time.perf_counter()
            result = simulate(trace, capacity, policy, ttl_s)
            timings[policy] = (time.perf_counter() - started, result)
            bar.advance(trace.num_blocks)
    for policy, (seconds, result) in timings.items():
        figures["policies"][policy] = {
            "seconds": round(seconds, 3),
            "blocks_per_s": round(trace.num_blocks / seconds) if seconds else None,
            "token_hit_rate": round(result.token_hit_rate or 0.0, 4),
        }
    figures["lru_sweep"] = _lru_sweep_figures(trace, sweep_capacities, ttl_s)
    agree = bool(figures["lru_sweep"]["agree"])
    figures["verdicts"] = {
        "lru_one_pass_agrees_with_replay": {"value": agree, "target": "true", "pass": agree},
    }
    figures["pass"] = agree
    from prefixscope.bench_report import emit

    return emit(figures)
