"""`prefixscope demo-data`: realistic request history, made by the gateway's own request path.

Cheap to import: only argparse here; the handler imports the generator (and SQLAlchemy) when it runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(commands: Any, bench_commands: Any) -> None:
    """Add `demo-data` to the `prefixscope` parser (see `prefixscope.cli`)."""
    parser = commands.add_parser(
        "demo-data",
        help="write realistic demo request history",
        description="Generate requests for five demo tenants, send them through the gateway's normalization, "
        "record builder and explainer against simulated engines, and write the records to the database.",
    )
    parser.add_argument(
        "--database-url",
        default=None,
        help="database URL (default: $PREFIXSCOPE_DATABASE_URL, else prefixscope.db in the state directory)",
    )
    parser.add_argument("--rows", type=int, default=100_000, help="requests to write (default 100000)")
    parser.add_argument("--seed", type=int, default=0, help="random seed; the same seed gives the same rows")
    parser.add_argument("--days", type=int, default=14, help="spread the requests over this many days before now")
    parser.add_argument(
        "--chain-share",
        type=float,
        default=0.02,
        help="share of requests stored with their block hash chain, for the what-if simulator (default 0.02)",
    )
    parser.add_argument(
        "--pool",
        type=int,
        default=2_000,
        help="distinct requests sent through the gateway's code; more rows repeat them at other times (default 2000)",
    )
    parser.set_defaults(handler=run_demo_data)


def run_demo_data(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from db.config import database_url_from_env
    from db.errors import DatabaseError
    from gateway.demo.history import write_demo_data

    try:
        result = write_demo_data(
            database_url_from_env(args.database_url),
            rows=args.rows,
            seed=args.seed,
            days=args.days,
            chain_share=args.chain_share,
            pool=args.pool,
        )
    except (DatabaseError, ValueError) as exc:
        print(f"prefixscope: error: {exc}", file=sys.stderr)
        return 2
    except SQLAlchemyError as exc:
        message = f"database: {exc.__class__.__name__}: {str(exc).splitlines()[0]}"
        print(f"prefixscope: error: {message}", file=sys.stderr)
        return 2
    print(
        f"wrote {result.rows} demo requests for {len(result.tenants)} tenants "
        f"from {result.since:%Y-%m-%d %H:%M} to {result.until:%Y-%m-%d %H:%M} UTC in {result.seconds:.1f}s "
        f"({result.distinct} distinct requests through the gateway's code)"
    )
    return 0
