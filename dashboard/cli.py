"""`prefixscope dashboard` and `prefixscope bench dashboard` (`prefixscope demo-data` belongs to the gateway).

Cheap to import: Streamlit, SQLAlchemy and the `db` package load only inside the handlers.
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_PORT = 8501
DEFAULT_HOST = "127.0.0.1"
DEFAULT_BENCH_ROWS = 1_000_000


def register(commands: argparse._SubParsersAction, bench_commands: argparse._SubParsersAction) -> None:
    """Add the dashboard's subcommands to the `prefixscope` parser."""
    run = commands.add_parser("dashboard", help="serve the Streamlit dashboard")
    run.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    run.add_argument("--host", default=DEFAULT_HOST, help=f"address to bind (default {DEFAULT_HOST})")
    run.add_argument("--engine", default=None, metavar="URL", help="the engine's base URL, for its cache API")
    run.add_argument("--database-url", default=None, metavar="URL", help="database to read (default: db's setting)")
    run.add_argument("--refresh-s", type=float, default=None, help="auto-refresh interval of the live pages")
    run.add_argument(
        "--prefill-tokens-per-s",
        type=float,
        default=None,
        help="prefill speed assumed for 'time saved' when the engine does not report its own",
    )
    run.add_argument("--prices", type=Path, default=None, metavar="FILE", help="price table (.toml or .json)")
    run.set_defaults(handler=_run_dashboard)

    bench = bench_commands.add_parser("dashboard", help="time each dashboard page's queries on a large database")
    bench.add_argument("--rows", type=int, default=DEFAULT_BENCH_ROWS, help="requests in the benchmark database")
    bench.add_argument(
        "--database-url",
        default=None,
        metavar="URL",
        help="database to time (default: a SQLite file in the state directory's bench/ holding --rows demo requests, "
        "created if missing)",
    )
    bench.add_argument("--repeats", type=int, default=3, help="timed runs per page (the median is reported)")
    bench.add_argument("--seed", type=int, default=0, help="demo-data seed when the database is created")
    bench.add_argument(
        "--render", action="store_true", help="also run each page's whole script once (Streamlit's test runner)"
    )
    bench.add_argument(
        "--range",
        dest="range_label",
        default=None,
        metavar="LABEL",
        help="the sidebar's time range to time, e.g. 'Last 90 days' (default: the pages' default, 'Last 7 days')",
    )
    bench.set_defaults(handler=_run_bench)


def _run_dashboard(args: argparse.Namespace) -> int:
    from dashboard.launch import launch_dashboard

    return launch_dashboard(args)


def _run_bench(args: argparse.Namespace) -> int:
    from dashboard.bench import run_bench

    return run_bench(args)
